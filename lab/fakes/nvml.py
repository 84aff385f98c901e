"""The one in-memory stand-in for ``pynvml`` at the library boundary (the agent's and the
profiler's tests, the overhead benchmark).

It exposes the real module's constants, error classes and sample structs, and
the functions ``NvmlGpuSource`` and the profiler's sampler call. Each GPU is a mutable
``FakeGpu`` so a test can change it mid-run (a GPU lost, a field unsupported); ``errors``
maps an NVML function name (or ``"*"`` for all) to the NVML return code it raises. A
GPU's ``*_script`` fields replace its ring buffer with one scripted answer per call
(``FakeNvml.scripted``). Calls cost nothing, so a benchmark over it measures only the
agent's own work.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

NOT_SUPPORTED, NOT_FOUND = pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NOT_FOUND
DRIVER_NOT_LOADED, GPU_IS_LOST = pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.NVML_ERROR_GPU_IS_LOST
"""Return codes a script may name (pynvml's own values)."""

_SAMPLE_PERIOD_US = 166_667  # NVML's ring buffer holds one sample per ~1/6 s
_BUFFER = 120


@dataclass
class FakeGpu:
    """One fake GPU; every field may be changed between calls."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int = 81559 << 20
    memory_used_bytes: int = 0
    util_samples: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=_BUFFER))
    mem_util_samples: deque[tuple[int, int]] = field(
        default_factory=lambda: deque(maxlen=_BUFFER))
    util_rates: tuple[int, int] = (0, 0)
    power_mw: int = 70_000
    temperature_c: int = 35
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    process_util_samples: list[tuple[int, int, int]] = field(default_factory=list)
    """``(timestamp_us, pid, sm_util)`` as ``nvmlDeviceGetProcessUtilization`` returns them."""
    mig_enabled: bool = False
    xid_events: deque[int] = field(default_factory=deque)
    errors: dict[str, int] = field(default_factory=dict)
    sample_script: list[Any] | None = None
    """When set, each ``nvmlDeviceGetSamples`` takes the next step instead of reading the
    ring: ``[(timestamp_us, value), ...]`` (those newer than asked come back) or an NVML
    return code to raise; NOT_FOUND once the script is spent."""
    rates_script: list[int] | None = None
    """When set, each ``nvmlDeviceGetUtilizationRates`` answers the next GPU percentage."""
    process_util_script: list[Any] | None = None
    """As ``sample_script``, for ``nvmlDeviceGetProcessUtilization``:
    ``[(timestamp_us, pid, sm_util), ...]`` or a return code."""

    def add_samples(self, start_us: int, end_us: int, util: int, mem_util: int) -> None:
        """Append ring-buffer samples every ~1/6 s in ``(start_us, end_us]``."""
        t = start_us + _SAMPLE_PERIOD_US
        while t <= end_us:
            self.util_samples.append((t, util))
            self.mem_util_samples.append((t, mem_util))
            t += _SAMPLE_PERIOD_US


class FakeNvml:
    """Module-like object with pynvml's names; ``init_error`` makes ``nvmlInit`` fail.

    Method names are pynvml's (camelCase) because the agent calls them by those names.
    """

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")) or name.startswith("NVMLError"):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.init_error = init_error
        self.calls = 0
        self.sample_calls: list[int] = []
        """The ``since`` timestamp of each ``nvmlDeviceGetSamples`` call, in order."""
        self.process_util_calls: list[int] = []

    @classmethod
    def scripted(cls, samples: list[Any] | None = None, rates: list[int] | None = None,
                 processes: list[tuple[int, int | None]] | None = None,
                 process_util: list[Any] | None = None, init_error: int | None = None,
                 ) -> FakeNvml:
        """One H100 (``GPU-1234``, 1 GiB used) answering from the scripts given."""
        gpu = FakeGpu(uuid="GPU-1234", memory_used_bytes=1 << 30, processes=processes or [],
                      sample_script=list(samples or []), rates_script=list(rates or []),
                      process_util_script=list(process_util or []))
        return cls([gpu], init_error)

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> FakeNvml:
        """Build from a JSON fixture (see ``tests/data/agent/nvml_*.json``)."""
        gpus = []
        for raw in document["gpus"]:
            gpu = FakeGpu(uuid=raw["uuid"], name=raw["name"],
                          memory_total_bytes=raw["memory_total_mib"] << 20,
                          memory_used_bytes=raw["memory_used_mib"] << 20,
                          util_rates=tuple(raw.get("util_rates", (0, 0))),
                          power_mw=raw.get("power_mw", 0),
                          temperature_c=raw.get("temperature_c", 0),
                          processes=[tuple(p) for p in raw.get("processes", [])],
                          mig_enabled=raw.get("mig_enabled", False),
                          errors={k: getattr(pynvml, v) for k, v in raw.get("errors", {}).items()})
            gpu.util_samples.extend(tuple(s) for s in raw.get("util_samples", []))
            gpu.mem_util_samples.extend(tuple(s) for s in raw.get("mem_util_samples", []))
            gpu.xid_events.extend(raw.get("xid_events", []))
            gpus.append(gpu)
        return cls(gpus)

    # -- helpers ------------------------------------------------------------
    def _gpu(self, handle: Any, function: str) -> FakeGpu:
        self.calls += 1
        gpu = self.gpus[handle.index]
        code = gpu.errors.get(function, gpu.errors.get("*"))
        if code is not None:
            raise pynvml.NVMLError(code)
        return gpu

    # -- the pynvml surface the agent uses ------------------------------------
    def nvmlInit(self) -> None:
        self.calls += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls += 1

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self.calls += 1
        return 12040

    def nvmlSystemGetDriverVersion(self) -> str:
        self.calls += 1
        return "580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        self.calls += 1
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        handle = SimpleNamespace(index=index)
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=gpu.memory_total_bytes, used=gpu.memory_used_bytes,
                               free=gpu.memory_total_bytes - gpu.memory_used_bytes)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        mode = int(self._gpu(handle, "nvmlDeviceGetMigMode").mig_enabled)
        return [mode, mode]

    def nvmlEventSetCreate(self) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(index=None)

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, events: Any) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        events.index = handle.index

    def nvmlEventSetWait(self, events: Any, timeout_ms: int) -> Any:
        gpu = self._gpu(SimpleNamespace(index=events.index), "nvmlEventSetWait")
        if not gpu.xid_events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        data = pynvml.c_nvmlEventData_t()
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = gpu.xid_events.popleft()
        return data

    def nvmlEventSetFree(self, events: Any) -> None:
        self.calls += 1

    def nvmlDeviceGetSamples(self, handle: Any, kind: int, since_us: int) -> tuple[int, list]:
        gpu = self._gpu(handle, "nvmlDeviceGetSamples")
        self.sample_calls.append(since_us)
        if gpu.sample_script is not None:
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, _samples(
                _step(gpu.sample_script), since_us)
        ring = gpu.util_samples if kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES \
            else gpu.mem_util_samples
        fresh = _samples(ring, since_us)
        if not fresh:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, fresh

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        fake = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if fake.rates_script is not None:
            return SimpleNamespace(gpu=fake.rates_script.pop(0), memory=0)
        gpu, memory = fake.util_rates
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTemperature").temperature_c

    def nvmlDeviceGetProcessUtilization(self, handle: Any, since_us: int) -> list:
        gpu = self._gpu(handle, "nvmlDeviceGetProcessUtilization")
        self.process_util_calls.append(since_us)
        ring = (_step(gpu.process_util_script) if gpu.process_util_script is not None
                else gpu.process_util_samples)
        fresh = [(t, pid, sm) for t, pid, sm in ring if t > since_us]
        if not fresh and gpu.process_util_script is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        samples = []
        for t, pid, sm in fresh:
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.timeStamp, sample.pid, sample.smUtil = t, pid, sm
            samples.append(sample)
        return samples

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]


def _step(script: list[Any]) -> list[Any]:
    """The script's next answer; a return code is raised."""
    step = script.pop(0) if script else pynvml.NVML_ERROR_NOT_FOUND
    if isinstance(step, int):
        raise pynvml.NVMLError(step)
    return step


def _samples(ring: Any, since_us: int) -> list[Any]:
    """``c_nvmlSample_t`` for the ``(timestamp_us, value)`` pairs newer than ``since_us``."""
    out = []
    for t, v in ring:
        if t > since_us:
            sample = pynvml.c_nvmlSample_t()
            sample.timeStamp = t
            sample.sampleValue.uiVal = v
            out.append(sample)
    return out


class ScriptedSampler:
    """Stands in for the profiler's sampler thread: hands back fixed samples at stop()."""

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
