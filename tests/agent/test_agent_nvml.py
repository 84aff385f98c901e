"""The NVML source against ``pynvml`` mocked at the library boundary, error paths included."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pynvml
import pytest

from agent.errors import DriverNotLoaded
from agent.node.gpus import GpuSample
from agent.node.nvml import NvmlGpuSource
from lab.fakes.nvml import FakeGpu, FakeNvml

DATA = Path(__file__).parents[1] / "data" / "agent"
NOW = 10.0  # seconds; the fixture's samples run up to 10_000_000 us


def fixture_nvml() -> FakeNvml:
    return FakeNvml.from_json(json.loads((DATA / "nvml_two_gpus.json").read_text()))


def source(nvml: FakeNvml, now: list[float] | None = None) -> NvmlGpuSource:
    clock = now if now is not None else [NOW]
    return NvmlGpuSource(nvml, wall_clock=lambda: clock[0])


def test_reads_every_field_and_averages_samples_over_the_interval() -> None:
    sample = source(fixture_nvml()).sample(1.0)
    first, second = sample.gpus
    assert sample.timestamp == NOW
    assert first.info.uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert first.info.product == "NVIDIA H100 80GB HBM3"
    assert (first.info.memory_total_mib, first.memory_used_mib) == (81559, 10240)
    # Only samples newer than now - 1 s count on the first read: 20, 30, 40 (not 10 at 9.0 s).
    assert first.utilization_percent == pytest.approx(30.0)
    assert first.memory_utilization_percent == pytest.approx(12.0)
    assert first.power_watts == pytest.approx(250.5)
    assert first.temperature_c == 41
    assert (first.xid_errors, first.last_xid) == (1, 79)
    assert [(p.pid, p.used_memory_mib) for p in first.processes] == [(101, 5120), (104, 1024)]
    assert first.info.mig_mode is False and not first.lost


def test_second_read_uses_only_new_samples() -> None:
    nvml, now = fixture_nvml(), [NOW]
    src = source(nvml, now)
    src.sample(1.0)
    nvml.gpus[0].add_samples(10_000_000, 11_000_000, util=80, mem_util=50)
    now[0] = 11.0
    gpu = src.sample(1.0).gpus[0]
    assert gpu.utilization_percent == pytest.approx(80.0)
    assert gpu.memory_utilization_percent == pytest.approx(50.0)


def test_no_samples_yet_falls_back_to_utilization_rates() -> None:
    gpu = source(fixture_nvml()).sample(1.0).gpus[1]  # GPU 1 has an empty ring buffer
    assert (gpu.utilization_percent, gpu.memory_utilization_percent) == (0.0, 0.0)


def test_no_samples_and_no_rates_is_null_not_zero() -> None:
    nvml = fixture_nvml()
    nvml.gpus[1].errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu = source(nvml).sample(1.0).gpus[1]
    assert gpu.utilization_percent is None and gpu.memory_utilization_percent is None


@pytest.mark.parametrize(("function", "attribute"), [
    pytest.param("nvmlDeviceGetPowerUsage", "power_watts", id="power"),
    pytest.param("nvmlDeviceGetTemperature", "temperature_c", id="temperature"),
    pytest.param("nvmlDeviceGetMemoryInfo", "memory_used_mib", id="memory"),
    pytest.param("nvmlDeviceGetSamples", "utilization_percent", id="samples-and-rates"),
    pytest.param("nvmlDeviceRegisterEvents", "xid_errors", id="xid-events"),
])
def test_not_supported_field_is_null_and_the_rest_is_reported(function: str,
                                                              attribute: str) -> None:
    nvml = fixture_nvml()
    nvml.gpus[0].errors[function] = pynvml.NVML_ERROR_NOT_SUPPORTED
    if function == "nvmlDeviceGetSamples":
        nvml.gpus[0].errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu = source(nvml).sample(1.0).gpus[0]
    assert getattr(gpu, attribute) is None
    assert gpu.info.uuid.startswith("GPU-1111") and len(gpu.processes) == 2
    assert not gpu.lost


def test_fixture_gpu_with_unsupported_and_forbidden_fields() -> None:
    gpu = source(fixture_nvml()).sample(1.0).gpus[1]
    assert (gpu.power_watts, gpu.temperature_c, gpu.xid_errors) == (None, None, None)
    assert gpu.memory_used_mib == 0


def test_unexpected_field_error_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    src = source(fixture_nvml())
    with caplog.at_level(logging.WARNING, logger="agent.node.nvml"):
        src.sample(1.0)
        src.sample(1.0)
    # NO_PERMISSION on GPU 1's temperature: once, despite two rounds; NOT_SUPPORTED: silent.
    fields = [(r.gpu, r.field) for r in caplog.records if r.msg == "nvml field unavailable"]
    assert fields == [(1, "temperature")]


@pytest.mark.parametrize("code", [
    pytest.param(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, id="driver-not-loaded"),
    pytest.param(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, id="library-not-found"),
])
def test_driver_not_loaded_is_typed_and_recoverable(code: int) -> None:
    nvml = fixture_nvml()
    nvml.init_error = code
    src = source(nvml)
    with pytest.raises(DriverNotLoaded):
        src.inventory()
    with pytest.raises(DriverNotLoaded):
        src.sample(1.0)
    nvml.init_error = None  # driver loaded later (e.g. the operator finished installing it)
    assert [g.info.index for g in src.sample(1.0).gpus] == [0, 1]


def test_driver_lost_mid_run_raises_then_reinitialises() -> None:
    nvml = fixture_nvml()
    src = source(nvml)
    src.sample(1.0)
    nvml.gpus[0].errors["*"] = pynvml.NVML_ERROR_UNINITIALIZED
    with pytest.raises(DriverNotLoaded):
        src.sample(1.0)
    del nvml.gpus[0].errors["*"]
    assert len(src.sample(1.0).gpus) == 2


def test_gpu_lost_mid_run_is_reported_with_null_metrics_then_recovers() -> None:
    nvml = fixture_nvml()
    src = source(nvml)
    src.sample(1.0)
    nvml.gpus[0].errors["*"] = pynvml.NVML_ERROR_GPU_IS_LOST
    lost, healthy = src.sample(1.0).gpus
    assert lost == GpuSample(info=lost.info, memory_used_mib=None, utilization_percent=None,
                             memory_utilization_percent=None, power_watts=None,
                             temperature_c=None, xid_errors=None, lost=True)
    assert lost.info.uuid.startswith("GPU-1111")  # identity kept from the inventory
    assert healthy.temperature_c is None and healthy.memory_used_mib == 0 and not healthy.lost
    del nvml.gpus[0].errors["*"]
    back = src.sample(1.0).gpus[0]
    assert not back.lost and back.memory_used_mib == 10240


def test_gpu_lost_at_init_keeps_its_slot() -> None:
    nvml = fixture_nvml()
    nvml.gpus[0].errors["*"] = pynvml.NVML_ERROR_GPU_IS_LOST
    src = source(nvml)
    assert [(g.index, g.uuid) for g in src.inventory()] == [
        (0, "unknown-0"), (1, "GPU-66666666-7777-8888-9999-000000000000")]
    assert src.sample(1.0).gpus[0].lost


def test_mig_enabled_gpu_is_marked() -> None:
    nvml = FakeNvml([FakeGpu(uuid="GPU-mig", mig_enabled=True)])
    nvml.gpus[0].errors["nvmlDeviceGetSamples"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.gpus[0].errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu = source(nvml).sample(1.0).gpus[0]
    assert gpu.info.mig_mode is True and gpu.utilization_percent is None


def test_xid_events_accumulate_and_close_frees_everything() -> None:
    nvml = fixture_nvml()
    src = source(nvml)
    nvml.gpus[0].xid_events.extend([13, 48])
    gpu = src.sample(1.0).gpus[0]
    assert (gpu.xid_errors, gpu.last_xid) == (3, 48)
    src.close()
    src.close()  # idempotent


def test_per_process_utilisation_is_averaged_over_the_interval_per_pid() -> None:
    nvml, now = fixture_nvml(), [NOW]
    nvml.gpus[0].process_util_samples = [
        (8_500_000, 101, 90),  # older than this interval: left out
        (9_200_000, 101, 40), (9_600_000, 101, 60), (9_700_000, 104, 25)]
    src = source(nvml, now)
    first = src.sample(1.0).gpus[0]
    assert {p.pid: p.utilization_percent for p in first.processes} == {101: 50.0, 104: 25.0}
    nvml.gpus[0].process_util_samples.append((10_500_000, 104, 10))
    now[0] = 11.0
    second = src.sample(1.0).gpus[0]  # only the new sample counts; pid 101 had none
    assert {p.pid: p.utilization_percent for p in second.processes} == {101: None, 104: 10.0}


def test_per_process_utilisation_unsupported_is_null() -> None:
    nvml = fixture_nvml()
    nvml.gpus[0].errors["nvmlDeviceGetProcessUtilization"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    first = source(nvml).sample(1.0).gpus[0]
    assert [p.utilization_percent for p in first.processes] == [None, None]
    assert first.utilization_percent == pytest.approx(30.0)  # the rest is still read


def test_out_of_range_readings_are_dropped_and_counted_not_clamped() -> None:
    nvml, now = fixture_nvml(), [NOW]
    garbage = 2147483632  # what NVML hands back on some drivers for an exited process
    nvml.gpus[0].process_util_samples = [(9_200_000, 101, 40), (9_300_000, 101, garbage),
                                         (9_400_000, 104, garbage)]
    src = source(nvml, now)
    first = src.sample(1.0).gpus[0]
    # pid 101's garbage sample is left out of its mean; pid 104 had nothing else: unknown
    assert {p.pid: p.utilization_percent for p in first.processes} == {101: 40.0, 104: None}
    nvml.gpus[1].util_rates = (garbage, 5)  # GPU 1 has no ring samples: rates are read
    assert src.sample(1.0).gpus[1].utilization_percent is None  # not 100%
    assert src.out_of_range == {"process_utilization": 2, "utilization": 1}
