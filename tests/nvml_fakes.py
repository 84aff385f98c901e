"""A fake ``pynvml`` and sampler shared by the profiling tests (no tests here)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

NOT_SUPPORTED, NOT_FOUND, DRIVER_NOT_LOADED, GPU_IS_LOST = 3, 6, 9, 15


class FakeNVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value


@dataclass
class Sample:
    timeStamp: int
    sampleValue: Any


class FakeNvml:
    """The slice of pynvml the profiler calls, driven by a script of samples and errors."""

    NVMLError = FakeNVMLError
    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = NOT_FOUND

    def __init__(
        self,
        samples: list[Any] | None = None,
        init_error: int | None = None,
        rates: list[int] | None = None,
        processes: list[Any] | None = None,
        process_util: list[Any] | None = None,
    ):
        self.samples = samples or []  # each item: list[(ts, value)] or an error code
        self.init_error = init_error
        self.rates = rates or []
        self.processes = processes or []
        # each item: list[(ts, pid, sm_util)] answered once, or an error code
        self.process_util = process_util or []
        self.process_util_calls: list[int] = []
        self.used = 1024 * 1024 * 1024
        self.calls: list[int] = []

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.159.04"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return "GPU-1234"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return SimpleNamespace(total=81559 * 1024 * 1024, used=self.used)

    def nvmlDeviceGetSamples(self, handle: str, kind: int, last_ts: int) -> Any:
        self.calls.append(last_ts)
        step = self.samples.pop(0) if self.samples else NOT_FOUND
        if isinstance(step, int):
            raise FakeNVMLError(step)
        return 1, [Sample(ts, SimpleNamespace(uiVal=v)) for ts, v in step if ts > last_ts]

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        return SimpleNamespace(gpu=self.rates.pop(0), memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return self.processes

    def nvmlDeviceGetProcessUtilization(self, handle: str, last_ts: int) -> list[Any]:
        self.process_util_calls.append(last_ts)
        step = self.process_util.pop(0) if self.process_util else NOT_FOUND
        if isinstance(step, int):
            raise FakeNVMLError(step)
        return [SimpleNamespace(timeStamp=ts, pid=pid, smUtil=sm) for ts, pid, sm in step]


class ScriptedSampler:
    """Stands in for the sampler thread: hands back fixed samples at stop()."""

    def __init__(self, nvml: Any, handle: Any, interval_ms: float, pids: Any = ()):
        from predictor.profiling.nvml import SamplerResult

        self.result = SamplerResult(
            [50.0, 70.0, 90.0],
            device_used_max_mib=3000.0,
            process_used_max_mib={p: 900.0 for p in list(pids)[:1]},
            process_util_percent={p: [40.0, 60.0] for p in list(pids)[:1]},
        )

    def start(self) -> None:
        pass

    def stop(self) -> Any:
        return self.result
