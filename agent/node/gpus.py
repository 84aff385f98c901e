"""GPU samples as values, and the ``GpuSource`` protocol behind ``--gpus nvml|sim:FILE``.

A source answers two questions: which GPUs this node has (``inventory``), and what
they did since the last call (``sample``). Fields a device cannot report are
``None`` (JSON null), never a made-up zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from agent.errors import ConfigError
from contracts.gpus import GpuRef


@dataclass(frozen=True)
class ProcessSample:
    """One compute process on a GPU, with its pod when attribution found it."""

    pid: int
    used_memory_mib: int | None
    pod_uid: str | None = None
    container_id: str | None = None
    utilization_percent: float | None = None
    """The process's share of the GPU's SMs over the interval (NVML per-process samples);
    None where the GPU or driver does not give it."""


@dataclass(frozen=True)
class GpuInfo(GpuRef):
    """Static identity of one GPU: index and UUID (``contracts.gpus``), product, memory."""

    product: str
    memory_total_mib: int | None
    mig_mode: bool | None = False


@dataclass(frozen=True)
class GpuSample:
    """What one GPU did over the last interval.

    ``lost`` marks a GPU that stopped answering: its identity is kept from the
    inventory and every metric is ``None`` so the extender falls back to
    reservations for it. ``last_xid`` is the code of the newest XID event (0 if
    none seen), the value dcgm-exporter publishes as ``DCGM_FI_DEV_XID_ERRORS``.
    """

    info: GpuInfo
    memory_used_mib: int | None
    utilization_percent: float | None
    memory_utilization_percent: float | None
    power_watts: float | None
    temperature_c: int | None
    xid_errors: int | None
    last_xid: int | None = None
    processes: tuple[ProcessSample, ...] = ()
    lost: bool = False

    @property
    def memory_free_mib(self) -> int | None:
        """Total minus used, or None when either is unknown."""
        if self.info.memory_total_mib is None or self.memory_used_mib is None:
            return None
        return max(0, self.info.memory_total_mib - self.memory_used_mib)


@dataclass(frozen=True)
class NodeSample:
    """One sampling round over every GPU of the node."""

    timestamp: float
    interval_seconds: float
    gpus: tuple[GpuSample, ...] = field(default_factory=tuple)


@runtime_checkable
class GpuSource(Protocol):
    """Where GPU metrics come from (NVML, or an explicit simulation)."""

    def inventory(self) -> Sequence[GpuInfo]:
        """The node's GPUs; raises ``DriverNotLoaded`` when the source is down."""
        ...

    def sample(self, interval_seconds: float) -> NodeSample:
        """Metrics since the previous call (utilisation averaged over the interval)."""
        ...


@dataclass(frozen=True)
class GpuSourceSpec:
    """A parsed ``--gpus`` value: ``nvml`` or ``sim`` with its file."""

    kind: str
    path: Path | None = None


def parse_gpu_source(text: str) -> GpuSourceSpec:
    """Parse ``nvml`` or ``sim:FILE``; anything else is a ``ConfigError`` naming both."""
    if text == "nvml":
        return GpuSourceSpec("nvml")
    if text.startswith("sim:") and len(text) > len("sim:"):
        return GpuSourceSpec("sim", Path(text[len("sim:") :]))
    raise ConfigError(f"--gpus {text!r}: expected 'nvml' or 'sim:FILE'")


Clock = Callable[[], float]
