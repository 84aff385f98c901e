"""The cuda backend's NVML side with ``pynvml`` faked at the library boundary."""

from __future__ import annotations

import sys

import pytest

from lab.fakes.nvml import (
    DRIVER_NOT_LOADED,
    GPU_IS_LOST,
    NOT_FOUND,
    NOT_SUPPORTED,
    FakeNvml,
    ScriptedSampler,
)
from predictor.api import Predictor
from predictor.profiling.backend import JobSpec, MeasureSettings
from predictor.profiling.errors import BackendUnavailable
from predictor.profiling.nvml import UtilizationSampler, open_device


def _sampler(nvml: FakeNvml, now: list[int], pids: tuple[int, ...] = ()) -> UtilizationSampler:
    return UtilizationSampler(nvml, nvml.nvmlDeviceGetHandleByIndex(0), 200, pids,
                              wallclock_us=lambda: now[0])


def test_samples_after_prime_are_collected_once_each_and_windowed():
    warmup = [(100, 5), (200, 7)]
    nvml = FakeNvml.scripted(
        samples=[
            warmup,
            warmup + [(1100, 40), (1200, 60)],
            NOT_FOUND,
            [(1200, 60), (1300, 80), (2600, 99)],
        ]
    )
    now = [1000]
    s = _sampler(nvml, now)
    s.prime()
    s.poll()
    s.poll()  # NOT_FOUND: nothing new since the last call, not an error
    now[0] = 2000  # window closes before the sample at 2600 (after the jobs finished)
    s._window = (s._window[0], now[0])
    s.poll()
    assert s.result.values_percent == [40.0, 60.0, 80.0]
    assert nvml.sample_calls == [0, 200, 1200, 1200]  # only samples newer than the last seen
    assert s.result.stats() == pytest.approx((60.0, 60.0, 76.0))
    assert s.result.error == "" and s.result.source == "samples"


def test_not_supported_falls_back_to_utilization_rates():
    nvml = FakeNvml.scripted(samples=[NOT_SUPPORTED, NOT_SUPPORTED], rates=[30, 50])
    s = _sampler(nvml, [0])
    s.prime()
    s.poll()
    s.poll()
    assert s.result.source == "utilization_rates"
    assert s.result.values_percent == [30.0, 50.0]


def test_gpu_lost_mid_window_marks_the_window_unusable():
    nvml = FakeNvml.scripted(samples=[[(1, 1)], [(5, 50)], GPU_IS_LOST])
    s = _sampler(nvml, [0])
    s.prime()
    s.poll()
    s.poll()
    s.poll()
    assert "NVML failed" in s.result.error


def test_memory_is_the_max_over_ticks_per_process_and_device():
    other = (7, 9999 * 1024 * 1024)
    nvml = FakeNvml.scripted(processes=[(42, 2048 * 1024 * 1024), other])
    s = _sampler(nvml, [0], pids=(42,))
    s.poll()
    gpu = nvml.gpus[0]
    gpu.processes = [(42, 1024 * 1024 * 1024), other]
    gpu.memory_used_bytes = 3 * 1024**3
    s.poll()
    assert s.result.process_used_max_mib == {42: 2048.0}
    assert s.result.device_used_max_mib == 3072.0


def test_each_watched_process_gets_its_own_utilisation_in_the_window():
    # What a node agent sees of each pod: SM samples per PID, only the watched
    # workers', only inside the measured window, each sample once.
    nvml = FakeNvml.scripted(process_util=[
        [(900, 42, 99)],                                # before the window opened
        [(1100, 42, 30), (1100, 7, 80), (1150, 43, 60)],
        NOT_FOUND,                                       # nothing new since: not an error
        [(1300, 42, 50), (2500, 43, 90)],                # 2500 is after the window closed
    ], processes=[(42, 0)])  # fmt: skip
    now = [1000]
    s = _sampler(nvml, now, pids=(42, 43))
    s.prime()
    for _ in range(3):
        s.poll()
    now[0] = 2000
    s._window = (s._window[0], now[0])
    s.poll()
    assert s.result.process_util_percent == {42: [30.0, 50.0], 43: [60.0]}
    assert nvml.process_util_calls == [1000, 1000, 1150, 1150]  # newer than the last seen


def test_per_process_utilisation_unsupported_leaves_the_rest_of_the_window_intact():
    nvml = FakeNvml.scripted(samples=[[(1, 1)], [(5, 50)]], process_util=[NOT_SUPPORTED],
                             processes=[(42, 1024 * 1024)])  # fmt: skip
    s = _sampler(nvml, [0], pids=(42,))
    s.prime()
    s.poll()
    s.poll()
    assert s.result.error == "" and s.result.process_util_percent == {}
    assert s.result.process_used_max_mib == {42: 1.0}
    assert len(nvml.process_util_calls) == 1  # not asked again once unsupported


@pytest.mark.parametrize("code", [DRIVER_NOT_LOADED, 12], ids=["driver-not-loaded", "no-library"])
def test_driver_not_loaded_is_a_clear_backend_error(code):
    with pytest.raises(BackendUnavailable, match="NVML cannot start"):
        open_device(FakeNvml.scripted(init_error=code), 0)


def test_device_description_decodes_nvml_values():
    d = open_device(FakeNvml.scripted(), 0)
    assert (d.product, d.driver_version, d.cuda_driver_version, d.uuid) == (
        "NVIDIA H100 80GB HBM3",
        "580.159.04",
        "12.4",
        "GPU-1234",
    )
    with pytest.raises(BackendUnavailable, match="out of range"):
        open_device(FakeNvml.scripted(), 3)


def test_cuda_backend_end_to_end_with_cpu_workers_and_fake_nvml():
    """Real worker processes (on CPU) and the real protocol; only NVML is faked."""
    from predictor.profiling.cuda import CudaBackend

    settings = MeasureSettings(
        warmup_seconds=0.0, measure_seconds=0.05, min_steps=2, timeout_seconds=60.0
    )
    argv = [sys.executable, "-m", "predictor.profiling.worker", "--device", "cpu"]
    backend = CudaBackend(
        settings, nvml=FakeNvml.scripted(), worker_argv=argv, sampler_factory=ScriptedSampler
    )
    try:
        env = backend.environment()
        # the predictor fits memory overheads per framework and looks them up by its own name
        assert (env.gpu_product, env.simulated, env.framework) == (
            "NVIDIA H100 80GB HBM3",
            False,
            Predictor().framework,
        )
        mlp = JobSpec("mlp", "mlp", "training", 4)
        iso = backend.measure([mlp])
        assert iso.jobs[0].status == "ok", iso.jobs[0].error
        assert iso.jobs[0].n_steps >= 2 and iso.jobs[0].step_time_ms > 0
        assert iso.jobs[0].mem_used_nvml_mib == 900.0  # NVML's per-process figure
        assert iso.jobs[0].process_util_mean_percent == 50.0  # the worker's own SM samples
        assert (iso.util_mean_percent, iso.util_p50_percent, iso.n_samples) == (70.0, 70.0, 3)
        pair = backend.measure(
            [JobSpec("mlp", "mlp", "inference", 2), JobSpec("no_such_model", "x", "inference", 2)]
        )
        assert [j.status for j in pair.jobs] == ["error", "error"]
        assert "KeyError" in pair.jobs[1].error and "aborted" in pair.jobs[0].error
        assert backend.memory_sources == {"nvml_process": 1}
    finally:
        backend.close()
