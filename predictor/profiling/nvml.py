"""NVML for the cuda backend: device description and a utilisation/memory sampler.

The ``pynvml`` module (nvidia-ml-py) is passed in, so tests hand in a fake at the
library boundary. Utilisation comes from ``nvmlDeviceGetSamples(...,
NVML_GPU_UTILIZATION_SAMPLES, last_ts)``: the driver keeps a ring buffer of
samples (about one every 167 ms), and asking for those newer than the last one
seen, every 100-250 ms, collects each exactly once. Where that call is not
supported (some virtualised GPUs) the sampler falls back to
``nvmlDeviceGetUtilizationRates`` once per tick and says so in ``source``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from predictor.profiling.errors import BackendUnavailable

_MIB = 1024.0 * 1024.0
# NVML value-type enum (nvmlValueType_t) -> the c_nvmlValue_t union member holding it.
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                 6: "usVal"}  # fmt: skip


def sample_value(value_type: int, value: Any) -> float:
    """The number in NVML's value union ``value`` whose type ``value_type`` names.

    ``nvmlDeviceGetSamples`` answers with one type for all its samples; the agent
    and the profiler both read utilisation samples through this.
    """
    return float(getattr(value, _VALUE_FIELDS.get(int(value_type), "uiVal")))


def read_samples(nvml: ModuleType, handle: Any, kind: int, after_us: int,
                 ) -> list[tuple[int, float]]:
    """The driver's ``kind`` samples (``NVML_GPU_UTILIZATION_SAMPLES``...) newer than
    ``after_us``, as ``(timestamp_us, value)`` oldest first: the one reader of NVML's
    sample ring buffer, for the node agent and the profiler.

    Empty when the driver has nothing newer (``NOT_FOUND``, normal between its
    samples); any other NVMLError (``NOT_SUPPORTED``: use the utilisation rates) is
    the caller's to handle.
    """
    try:
        value_type, samples = nvml.nvmlDeviceGetSamples(handle, kind, after_us)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_FOUND:
            return []
        raise
    return sorted((int(s.timeStamp), sample_value(value_type, s.sampleValue))
                  for s in samples if s.timeStamp > after_us)


def read_process_utilisation(nvml: ModuleType, handle: Any, after_us: int,
                             ) -> list[tuple[int, int, float]]:
    """Per-process SM utilisation samples newer than ``after_us``, as ``(timestamp_us,
    pid, sm_percent)`` oldest first (``nvmlDeviceGetProcessUtilization``): what a node
    agent sees of each pod, read the same way by the agent and the profiler.

    Empty when no process ran since (``NOT_FOUND``); any other NVMLError
    (``NOT_SUPPORTED`` on vGPU, MIG and older cards) is the caller's to handle.
    """
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, after_us)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_FOUND:
            return []
        raise
    return sorted((int(s.timeStamp), int(s.pid), float(s.smUtil))
                  for s in samples or [] if s.timeStamp > after_us)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class NvmlDevice:
    """One GPU as NVML describes it."""

    handle: Any
    index: int
    uuid: str
    product: str
    memory_total_mib: float
    driver_version: str
    cuda_driver_version: str


def open_device(nvml: ModuleType, index: int) -> NvmlDevice:
    """Initialise NVML and describe GPU ``index``; BackendUnavailable with the NVML reason."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        reason = f"NVML cannot start ({exc}): is the NVIDIA driver loaded?"
        raise BackendUnavailable(reason) from exc
    try:
        count = nvml.nvmlDeviceGetCount()
        if not 0 <= index < count:
            raise BackendUnavailable(f"GPU index {index} out of range: NVML sees {count} GPU(s)")
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        return NvmlDevice(
            handle=handle, index=index, uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            product=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_mib=nvml.nvmlDeviceGetMemoryInfo(handle).total / _MIB,
            driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
        )  # fmt: skip
    except nvml.NVMLError as exc:
        raise BackendUnavailable(f"NVML cannot describe GPU {index}: {exc}") from exc


@dataclass
class SamplerResult:
    """What one sampling window collected."""

    values_percent: list[float] = field(default_factory=list)
    source: str = "samples"
    """``samples`` (nvmlDeviceGetSamples) or ``utilization_rates`` (fallback)."""
    device_used_max_mib: float | None = None
    process_used_max_mib: dict[int, float] = field(default_factory=dict)
    process_util_percent: dict[int, list[float]] = field(default_factory=dict)
    """Each watched PID's SM utilisation samples in the window (empty where unsupported)."""
    error: str = ""
    """Set when NVML failed mid-window (e.g. GPU lost); the window is then not usable."""

    def stats(self) -> tuple[float, float, float] | None:
        """(mean, p50, p90) of the values, or None when there are none."""
        if not self.values_percent:
            return None
        v = np.asarray(self.values_percent, dtype=float)
        return float(v.mean()), float(np.percentile(v, 50)), float(np.percentile(v, 90))


class UtilizationSampler:
    """Polls NVML on a thread between ``start`` and ``stop``; ``poll`` is one tick."""

    def __init__(
        self,
        nvml: ModuleType,
        handle: Any,
        interval_ms: float,
        pids: Collection[int] = (),
        wallclock_us: Callable[[], int] = lambda: int(time.time() * 1e6),
    ):
        self.nvml = nvml
        self.handle = handle
        self.interval_s = interval_ms / 1000.0
        self.pids = set(pids)
        self.wallclock_us = wallclock_us
        self.result = SamplerResult()
        self._last_ts = 0
        self._proc_last_ts = 0
        self._proc_supported = True
        self._window = (0, 2**63)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def prime(self) -> None:
        """Mark 'now': only samples newer than this count (drops warm-up samples)."""
        self._window = (self.wallclock_us(), 2**63)
        self._proc_last_ts = self._window[0]
        try:
            samples = read_samples(self.nvml, self.handle,
                                   self.nvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
            self._last_ts = samples[-1][0] if samples else 0
        except self.nvml.NVMLError as exc:
            try:
                self._handle_samples_error(exc)
            except self.nvml.NVMLError as fatal:
                self.result.error = f"NVML failed while sampling: {fatal}"

    def poll(self) -> None:
        """One tick: new utilisation samples, device memory, per-process memory."""
        if self.result.error:
            return
        try:
            self._poll_util()
            used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / _MIB
            prev = self.result.device_used_max_mib
            self.result.device_used_max_mib = used if prev is None else max(prev, used)
            self._poll_processes()
        except self.nvml.NVMLError as exc:
            self.result.error = f"NVML failed while sampling: {exc}"

    def _poll_util(self) -> None:
        if self.result.source == "utilization_rates":
            self.result.values_percent.append(
                float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            )
            return
        try:
            samples = read_samples(self.nvml, self.handle,
                                   self.nvml.NVML_GPU_UTILIZATION_SAMPLES, self._last_ts)
        except self.nvml.NVMLError as exc:
            if self._handle_samples_error(exc):
                self._poll_util()
            return
        lo, hi = self._window
        for at, value in samples:
            self._last_ts = at
            if lo <= at <= hi:
                self.result.values_percent.append(value)

    def _handle_samples_error(self, exc: Exception) -> bool:
        """True when the caller should retry with the fallback source."""
        code = getattr(exc, "value", None)
        if code == self.nvml.NVML_ERROR_NOT_FOUND:
            return False  # no sample newer than last_ts yet: normal between driver samples
        if code == self.nvml.NVML_ERROR_NOT_SUPPORTED:
            self.result.source = "utilization_rates"
            return True
        raise exc

    def _poll_processes(self) -> None:
        if not self.pids:
            return
        self._poll_process_util()
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except self.nvml.NVMLError:
            return  # per-process accounting is optional; device memory remains
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            if p.pid in self.pids and used is not None:
                mib = used / _MIB
                self.result.process_used_max_mib[p.pid] = max(
                    mib, self.result.process_used_max_mib.get(p.pid, 0.0)
                )

    def _poll_process_util(self) -> None:
        if not self._proc_supported:
            return
        try:
            samples = read_process_utilisation(self.nvml, self.handle, self._proc_last_ts)
        except (self.nvml.NVMLError, AttributeError):
            self._proc_supported = False  # optional, like per-process memory
            return
        lo, hi = self._window
        for at, pid, value in samples:
            self._proc_last_ts = max(self._proc_last_ts, at)
            if pid in self.pids and lo <= at <= hi and 0.0 <= value <= 100.0:
                self.result.process_util_percent.setdefault(pid, []).append(value)

    def start(self) -> None:
        """Prime and start polling every interval on a daemon thread."""
        self.prime()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def stop(self) -> SamplerResult:
        """Close the window at 'now', take a last tick and return the result."""
        self._window = (self._window[0], self.wallclock_us())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()
        return self.result
