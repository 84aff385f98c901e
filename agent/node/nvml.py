"""The ``nvml`` GPU source: NVIDIA's NVML through nvidia-ml-py's ``pynvml``.

The NVML module and the wall clock are injected so tests mock at the library
boundary. Error policy, per NVML return code:

- ``NOT_SUPPORTED`` (and any other per-call failure such as ``NO_PERMISSION``):
  that field is ``None``; the rest of the GPU is still reported.
- ``GPU_IS_LOST`` / ``RESET_REQUIRED``: the GPU is reported with its identity and
  null metrics (``lost``); the next interval tries it again.
- ``DRIVER_NOT_LOADED`` / ``LIBRARY_NOT_FOUND`` / ``UNINITIALIZED``: the whole
  source raises ``DriverNotLoaded``; the next call initialises NVML again.

Utilisation is the mean of ``nvmlDeviceGetSamples`` since the newest sample seen
last time (NVML keeps a ring buffer of ~1/6 s samples); only when the buffer has
nothing new does it fall back to ``nvmlDeviceGetUtilizationRates``. A utilisation
reading outside 0..100 (NVML returns garbage such as 2147483632 on some drivers and
for processes that just exited) is dropped, not clamped, and counted per field in
``NvmlGpuSource.out_of_range``.

MIG: a GPU in MIG mode is reported as one GPU with ``mig_mode: true``; NVML has
no whole-GPU utilisation for it (null) and per-instance reporting is not
supported, so the extender must treat it as not shareable.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import DriverNotLoaded, GpuLost
from agent.node.gpus import GpuInfo, GpuSample, NodeSample, ProcessSample
from predictor.profiling.nvml import read_process_utilisation, read_samples

log = logging.getLogger(__name__)

_MIB = 1 << 20
_MAX_EVENTS_PER_SAMPLE = 64  # bound the drain loop; an XID storm is still counted next time


@dataclass
class _Device:
    """Mutable per-GPU reading state (sample cursors, XID tally)."""

    info: GpuInfo
    handle: Any | None  # None until attached, and after the GPU was lost
    events: Any | None
    last_util_us: int = 0
    last_mem_util_us: int = 0
    last_proc_util_us: int = 0
    xid_count: int = 0
    last_xid: int = 0


class NvmlGpuSource:
    """Reads GPUs through an injected ``pynvml``-compatible module."""

    def __init__(self, nvml: Any | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self._clock = wall_clock
        self._devices: list[_Device] | None = None
        self._warned: set[tuple[int, str, Any]] = set()
        self.out_of_range: dict[str, int] = {}
        """Utilisation readings outside 0..100 dropped, per NVML field."""
        m = self._nvml
        self._driver_codes = {
            m.NVML_ERROR_DRIVER_NOT_LOADED,
            m.NVML_ERROR_LIBRARY_NOT_FOUND,
            m.NVML_ERROR_UNINITIALIZED,
            m.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        }
        self._lost_codes = {m.NVML_ERROR_GPU_IS_LOST, m.NVML_ERROR_RESET_REQUIRED}

    # -- protocol ---------------------------------------------------------
    def inventory(self) -> Sequence[GpuInfo]:
        """The GPUs NVML sees; raises ``DriverNotLoaded`` if it cannot start."""
        return [d.info for d in self._ensure_devices()]

    def sample(self, interval_seconds: float) -> NodeSample:
        """Read every GPU once; a lost GPU is reported with null metrics."""
        devices = self._ensure_devices()
        now = self._clock()
        gpus = []
        for device in devices:
            try:
                if device.handle is None:
                    self._attach(device)
                gpus.append(self._sample_device(device, interval_seconds, now))
            except GpuLost as err:
                log.warning("gpu lost", extra={"gpu": device.info.index, "detail": err.detail})
                device.handle = None  # a stale handle is useless; re-acquire next interval
                gpus.append(_lost_sample(device.info))
        return NodeSample(timestamp=now, interval_seconds=interval_seconds, gpus=tuple(gpus))

    def close(self) -> None:
        """Free event sets and shut NVML down (errors ignored: we are leaving)."""
        if self._devices is None:
            return
        for device in self._devices:
            if device.events is not None:
                self._quiet(self._nvml.nvmlEventSetFree, device.events)
        self._quiet(self._nvml.nvmlShutdown)
        self._devices = None

    # -- internals --------------------------------------------------------
    def _ensure_devices(self) -> list[_Device]:
        if self._devices is not None:
            return self._devices
        m = self._nvml
        try:
            m.nvmlInit()
            count = m.nvmlDeviceGetCount()
        except m.NVMLError as err:
            raise DriverNotLoaded(f"NVML init failed: {err}") from err
        devices = []
        for index in range(count):
            # An unidentified entry keeps the slot (indices stay stable) until the GPU answers.
            device = _Device(GpuInfo(index, f"unknown-{index}", "unknown", None), None, None)
            try:
                self._attach(device)
            except GpuLost as err:
                log.warning("gpu lost at init", extra={"gpu": index, "detail": err.detail})
            devices.append(device)
        self._devices = devices
        return devices

    def _attach(self, device: _Device) -> None:
        """(Re)acquire a GPU's handle, identity and XID subscription."""
        m, index = self._nvml, device.info.index
        try:
            handle = m.nvmlDeviceGetHandleByIndex(index)
        except m.NVMLError as err:
            self._raise_typed(index, "handle", err)
            raise GpuLost(index, f"handle: {err}") from err
        info = self._read_info(index, handle)
        if device.events is None:
            device.events = self._register_xid(index, handle)
        device.info, device.handle = info, handle

    def _read_info(self, index: int, handle: Any) -> GpuInfo:
        m = self._nvml
        uuid = _text(self._call(index, "uuid", m.nvmlDeviceGetUUID, handle)) or f"unknown-{index}"
        product = _text(self._call(index, "name", m.nvmlDeviceGetName, handle)) or "unknown"
        memory = self._call(index, "memory", m.nvmlDeviceGetMemoryInfo, handle)
        mig = self._call(index, "mig", m.nvmlDeviceGetMigMode, handle)
        return GpuInfo(
            index=index,
            uuid=uuid,
            product=product,
            memory_total_mib=None if memory is None else int(memory.total // _MIB),
            mig_mode=bool(mig is not None and mig[0] == m.NVML_DEVICE_MIG_ENABLE),
        )

    def _register_xid(self, index: int, handle: Any) -> Any | None:
        m = self._nvml
        events = self._call(index, "events", m.nvmlEventSetCreate)
        if events is None:
            return None
        try:
            m.nvmlDeviceRegisterEvents(handle, m.nvmlEventTypeXidCriticalError, events)
        except m.NVMLError as err:
            self._quiet(m.nvmlEventSetFree, events)
            self._classify(index, "xid", err)
            return None
        return events

    def _sample_device(self, device: _Device, interval_seconds: float, now: float) -> GpuSample:
        m, h, i = self._nvml, device.handle, device.info.index
        memory = self._call(i, "memory", m.nvmlDeviceGetMemoryInfo, h)
        now_us = int(now * 1e6)
        util, device.last_util_us = self._mean_samples(
            device, m.NVML_GPU_UTILIZATION_SAMPLES, device.last_util_us, now_us, interval_seconds)
        mem_util, device.last_mem_util_us = self._mean_samples(
            device, m.NVML_MEMORY_UTILIZATION_SAMPLES, device.last_mem_util_us, now_us,
            interval_seconds)
        if util is None or mem_util is None:
            rates = self._call(i, "utilization", m.nvmlDeviceGetUtilizationRates, h)
            if rates is not None:
                if util is None:
                    util = next(iter(self._in_range(i, "utilization", [float(rates.gpu)])), None)
                if mem_util is None:
                    mem_util = next(iter(self._in_range(i, "memory_utilization",
                                                        [float(rates.memory)])), None)
        power_mw = self._call(i, "power", m.nvmlDeviceGetPowerUsage, h)
        temperature = self._call(i, "temperature", m.nvmlDeviceGetTemperature, h,
                                 m.NVML_TEMPERATURE_GPU)
        procs = self._call(i, "processes", m.nvmlDeviceGetComputeRunningProcesses, h) or []
        per_pid = self._process_utilisation(device, now_us, interval_seconds)
        self._drain_xid(device)
        return GpuSample(
            info=device.info,
            memory_used_mib=None if memory is None else int(memory.used // _MIB),
            utilization_percent=util,
            memory_utilization_percent=mem_util,
            power_watts=None if power_mw is None else power_mw / 1000.0,
            temperature_c=None if temperature is None else int(temperature),
            xid_errors=None if device.events is None else device.xid_count,
            last_xid=None if device.events is None else device.last_xid,
            processes=tuple(
                ProcessSample(
                    pid=int(p.pid),
                    used_memory_mib=None if p.usedGpuMemory is None
                    else int(p.usedGpuMemory // _MIB),
                    utilization_percent=per_pid.get(int(p.pid)),
                )
                for p in procs
            ),
        )

    def _mean_samples(self, device: _Device, kind: int, last_us: int, now_us: int,
                      interval_seconds: float) -> tuple[float | None, int]:
        """Mean of the samples newer than ``last_us`` and the new cursor."""
        try:  # the profiler's reader of the driver's ring buffer (one implementation)
            samples = read_samples(self._nvml, device.handle, kind, last_us)
        except self._nvml.NVMLError as err:
            self._classify(device.info.index, f"samples{kind}", err)
            return None, last_us
        # On the first read the buffer spans up to ~20 s: keep only this interval's part.
        floor_us = last_us if last_us else now_us - int(interval_seconds * 1e6)
        values = [v for at, v in samples if at > floor_us]
        if not values:
            return None, last_us
        values = self._in_range(device.info.index, f"samples{kind}", values)
        return (sum(values) / len(values) if values else None), samples[-1][0]

    def _process_utilisation(self, device: _Device, now_us: int,
                             interval_seconds: float) -> dict[int, float]:
        """Mean SM utilisation per PID over this interval (``nvmlDeviceGetProcessUtilization``).

        Empty where the call is missing or unsupported (older GPUs, vGPU, MIG): the
        extender then learns only from pods alone on a GPU, from the GPU's utilisation.
        """
        m = self._nvml
        if getattr(m, "nvmlDeviceGetProcessUtilization", None) is None:
            return {}
        floor_us = device.last_proc_util_us or now_us - int(interval_seconds * 1e6)
        try:  # the profiler's reader (one implementation)
            samples = read_process_utilisation(m, device.handle, floor_us)
        except m.NVMLError as err:  # NOT_FOUND (no process ran since) is an empty list
            self._classify(device.info.index, "process_utilization", err)
            return {}
        by_pid: dict[int, list[float]] = {}
        newest = device.last_proc_util_us
        for at, pid, sm_util in samples:
            newest = max(newest, at)
            for value in self._in_range(device.info.index, "process_utilization", [sm_util]):
                by_pid.setdefault(pid, []).append(value)
        device.last_proc_util_us = newest
        return {pid: sum(v) / len(v) for pid, v in by_pid.items()}

    def _in_range(self, index: int, field: str, values: list[float]) -> list[float]:
        """The readings within 0..100; the others are counted (and logged once per field)."""
        kept = [v for v in values if 0.0 <= v <= 100.0]
        dropped = len(values) - len(kept)
        if dropped:
            self.out_of_range[field] = self.out_of_range.get(field, 0) + dropped
            if (index, field, "range") not in self._warned:
                self._warned.add((index, field, "range"))
                log.warning("nvml reading out of range dropped",
                            extra={"gpu": index, "field": field,
                                   "value": next(v for v in values if not 0 <= v <= 100)})
        return kept

    def _drain_xid(self, device: _Device) -> None:
        m = self._nvml
        if device.events is None:
            return
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                data = m.nvmlEventSetWait(device.events, 0)
            except m.NVMLError as err:
                if err.value != m.NVML_ERROR_TIMEOUT:
                    self._classify(device.info.index, "xid", err)
                return
            if data.eventType & m.nvmlEventTypeXidCriticalError:
                device.xid_count += 1
                device.last_xid = int(data.eventData)

    def _call(self, index: int, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; per-field failures become None, lost/driver errors are raised typed."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            self._classify(index, field, err)
            return None

    def _classify(self, index: int, field: str, err: Any) -> None:
        self._raise_typed(index, field, err)
        if err.value != self._nvml.NVML_ERROR_NOT_SUPPORTED:
            key = (index, field, int(err.value))
            if key not in self._warned:  # once per GPU, field and code: no log flood
                self._warned.add(key)
                log.warning("nvml field unavailable",
                            extra={"gpu": index, "field": field, "code": int(err.value)})

    def _raise_typed(self, index: int, field: str, err: Any) -> None:
        if err.value in self._lost_codes:
            raise GpuLost(index, f"{field}: {err}") from err
        if err.value in self._driver_codes:
            self._devices = None  # re-initialise on the next call
            raise DriverNotLoaded(f"{field}: {err}") from err

    def _quiet(self, fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            fn(*args)


def _lost_sample(info: GpuInfo) -> GpuSample:
    return GpuSample(info=info, memory_used_mib=None, utilization_percent=None,
                     memory_utilization_percent=None, power_watts=None, temperature_c=None,
                     xid_errors=None, lost=True)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
