"""The agent report (``POST /v1/agents/report``): one typed value, one encoder, one decoder.

The node agent builds an :class:`AgentReport` from its samples and sends
:func:`encode_report`; the extender reads the body with :func:`decode_report`,
which enforces the limits in docs/architecture.md ("Agent report"): at most
:data:`MAX_GPUS_PER_REPORT` GPUs with distinct indices (0..1023) and distinct
non-empty UUIDs, at most :data:`MAX_PROCESSES_PER_GPU` processes per GPU,
``pod_uid`` of 1..:data:`MAX_UID_CHARS` characters, utilisation in 0..100. A
problem is a :class:`ReportError` naming the field (``gpus[0].processes[1].pod_uid``).

Adding an optional field: give the dataclass a field with a ``None`` default and
add one row to the matching ``_*_OPTIONAL`` table (JSON key, attribute, reader);
the encoder and the decoder both follow the table, so older agents (field absent)
and older extenders (field ignored) keep working.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

REPORT_PATH = "/v1/agents/report"
MAX_GPUS_PER_REPORT = 64
MAX_PROCESSES_PER_GPU = 256
MAX_UID_CHARS = 128
MAX_ID_CHARS = 256
MAX_MIB = 1e7
MAX_RATE = 1e9
"""The largest steps (or samples) per second a progress entry may give."""


class ReportError(ValueError):
    """The report does not have the contract's shape; ``path`` names the field."""

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class ReportedProcess:
    """One process on a GPU: its pod (when attributed), memory and utilisation."""

    pod_uid: str | None
    used_memory_mib: float | None
    util_percent: float | None
    """Mean SM utilisation over the interval (``utilization_percent``); None when unknown."""
    pid: int | None = None
    container_id: str | None = None


@dataclass(frozen=True)
class ReportedSession:
    """A best-effort session of the GPU's inference server: its pod, and the GPU time the
    server measured for it since the session started (a cumulative counter)."""

    pod_uid: str
    gpu_time_ms: float


@dataclass(frozen=True)
class ReportedProgress:
    """A pod's training progress over the interval, from the step counter its progress
    annotation names (``tandem.io/progress``): steps per second, and samples per second
    where it counts them too."""

    pod_uid: str
    steps_per_s: float
    window_s: float
    """Seconds between the two scrapes the rate comes from."""
    samples_per_s: float | None = None


@dataclass(frozen=True)
class ReportedGpu:
    """One GPU: identity, inventory and what was measured over the interval."""

    index: int
    uuid: str
    product: str
    memory_total_mib: float
    memory_used_mib: float | None = None
    """None: the agent lost this GPU's metrics (no observation; reservations decide)."""
    utilization_percent: float | None = None
    memory_utilization_percent: float | None = None
    power_watts: float | None = None
    temperature_c: float | None = None
    xid_errors: int | None = None
    mig_mode: bool | None = None
    processes: tuple[ReportedProcess, ...] = ()
    sessions: tuple[ReportedSession, ...] = ()
    """Best-effort sessions of the GPU's inference server (``sessions``; absent: none)."""
    progress: tuple[ReportedProgress, ...] = ()
    """Progress of the pods on this GPU that expose a step counter (``progress``; absent:
    none)."""


@dataclass(frozen=True)
class AgentReport:
    """One sampling round of one node."""

    node: str
    gpus: tuple[ReportedGpu, ...] = ()
    timestamp: float | None = None
    interval_seconds: float | None = None


# ---- field readers (value, path) -> typed value; None passes for optional fields ----------
Reader = Callable[[Any, str], Any]


def _number(low: float, high: float) -> Reader:
    def read(value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not low <= value <= high:
            raise ReportError(path, f"must be a number in [{low:g}, {high:g}]")
        return float(value)
    return read


def _integer(low: int, high: int) -> Reader:
    def read(value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ReportError(path, f"must be an integer in {low}..{high}")
        return value
    return read


def _text(min_chars: int, max_chars: int) -> Reader:
    def read(value: Any, path: str) -> str:
        if not isinstance(value, str) or not min_chars <= len(value) <= max_chars:
            raise ReportError(path, f"must be null or a string of {min_chars}..{max_chars} "
                              "characters")
        return value
    return read


def _flag(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ReportError(path, "must be true, false or null")
    return value


_PERCENT = _number(0, 100)
_MIB = _number(0, MAX_MIB)

# (JSON key, attribute, reader): optional fields, null or absent = None.
_REPORT_OPTIONAL: tuple[tuple[str, str, Reader], ...] = (
    ("timestamp", "timestamp", _number(0, 1e11)),
    ("interval_seconds", "interval_seconds", _number(0, 86400)),
)
_GPU_OPTIONAL: tuple[tuple[str, str, Reader], ...] = (
    ("memory_used_mib", "memory_used_mib", _MIB),
    ("utilization_percent", "utilization_percent", _PERCENT),
    ("memory_utilization_percent", "memory_utilization_percent", _PERCENT),
    ("power_watts", "power_watts", _number(0, 1e5)),
    ("temperature_c", "temperature_c", _number(-273, 1000)),
    ("xid_errors", "xid_errors", _integer(0, 2**53)),
    ("mig_mode", "mig_mode", _flag),
)
_PROCESS_OPTIONAL: tuple[tuple[str, str, Reader], ...] = (
    ("pid", "pid", _integer(0, 2**63)),
    ("used_memory_mib", "used_memory_mib", _MIB),
    ("pod_uid", "pod_uid", _text(1, MAX_UID_CHARS)),
    ("container_id", "container_id", _text(0, MAX_ID_CHARS)),
    ("utilization_percent", "util_percent", _PERCENT),
)


def _optional(raw: Mapping[str, Any], table: tuple[tuple[str, str, Reader], ...],
              path: str) -> dict[str, Any]:
    prefix = f"{path}." if path else ""
    return {attr: None if raw.get(key) is None else read(raw[key], prefix + key)
            for key, attr, read in table}


# ---- encoder ---------------------------------------------------------------------------
def encode_report(report: AgentReport) -> dict[str, Any]:
    """The JSON object of ``report`` (every optional field written, null when None)."""
    out: dict[str, Any] = {"node": report.node}
    out.update({key: getattr(report, attr) for key, attr, _ in _REPORT_OPTIONAL})
    out["gpus"] = [_encode_gpu(g) for g in report.gpus]
    return out


def _encode_gpu(g: ReportedGpu) -> dict[str, Any]:
    out: dict[str, Any] = {"index": g.index, "uuid": g.uuid, "product": g.product,
                           "memory_total_mib": g.memory_total_mib}
    out.update({key: getattr(g, attr) for key, attr, _ in _GPU_OPTIONAL})
    out["processes"] = [{key: getattr(p, attr) for key, attr, _ in _PROCESS_OPTIONAL}
                        for p in g.processes]
    if g.sessions:  # optional: older extenders ignore it
        out["sessions"] = [{"pod_uid": s.pod_uid, "gpu_time_ms": s.gpu_time_ms}
                           for s in g.sessions]
    if g.progress:  # optional: older extenders ignore it
        out["progress"] = [{"pod_uid": p.pod_uid, "steps_per_s": p.steps_per_s,
                            "window_s": p.window_s, "samples_per_s": p.samples_per_s}
                           for p in g.progress]
    return out


# ---- decoder ---------------------------------------------------------------------------
def decode_report(document: Any) -> AgentReport:
    """The typed report; ReportError names the first bad field."""
    if not isinstance(document, Mapping):
        raise ReportError("body", "must be a JSON object")
    node = document.get("node")
    if not isinstance(node, str) or not node:
        raise ReportError("node", "must be a non-empty string")
    gpus_raw = document.get("gpus")
    if not isinstance(gpus_raw, list) or len(gpus_raw) > MAX_GPUS_PER_REPORT:
        raise ReportError("gpus", f"must be a list of at most {MAX_GPUS_PER_REPORT} GPUs")
    gpus = tuple(_decode_gpu(g, f"gpus[{i}]") for i, g in enumerate(gpus_raw))
    if len({g.index for g in gpus}) != len(gpus):
        raise ReportError("gpus", "GPU indices repeat")
    if len({g.uuid for g in gpus}) != len(gpus):  # placements find their GPUs by UUID
        raise ReportError("gpus", "GPU UUIDs repeat")
    return AgentReport(node, gpus, **_optional(document, _REPORT_OPTIONAL, ""))


def _decode_gpu(raw: Any, path: str) -> ReportedGpu:
    if not isinstance(raw, Mapping):
        raise ReportError(path, "must be an object")
    index = _integer(0, 1023)(raw.get("index"), f"{path}.index")
    uuid, product = raw.get("uuid"), raw.get("product")
    if not isinstance(uuid, str) or not uuid or not isinstance(product, str) or not product:
        raise ReportError(f"{path}.uuid/product", "must be non-empty strings")
    total = _number(1, MAX_MIB)(raw.get("memory_total_mib"), f"{path}.memory_total_mib")
    return ReportedGpu(index, uuid, product, total,
                       processes=_decode_processes(raw.get("processes"), f"{path}.processes"),
                       sessions=_decode_sessions(raw.get("sessions"), f"{path}.sessions"),
                       progress=_decode_progress(raw.get("progress"), f"{path}.progress"),
                       **_optional(raw, _GPU_OPTIONAL, path))


def _decode_processes(raw: Any, path: str) -> tuple[ReportedProcess, ...]:
    """The optional ``processes`` list of one GPU (absent or null = none reported)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_PROCESSES_PER_GPU:
        raise ReportError(path, f"must be a list of at most {MAX_PROCESSES_PER_GPU} processes")
    out = []
    for i, p in enumerate(raw):
        if not isinstance(p, Mapping):
            raise ReportError(f"{path}[{i}]", "must be an object")
        values = _optional(p, _PROCESS_OPTIONAL, f"{path}[{i}]")
        out.append(ReportedProcess(**values))
    return tuple(out)


def _decode_sessions(raw: Any, path: str) -> tuple[ReportedSession, ...]:
    """The optional ``sessions`` list of one GPU (absent or null = none reported)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_PROCESSES_PER_GPU:
        raise ReportError(path, f"must be a list of at most {MAX_PROCESSES_PER_GPU} sessions")
    out = []
    for i, s in enumerate(raw):
        if not isinstance(s, Mapping):
            raise ReportError(f"{path}[{i}]", "must be an object")
        out.append(ReportedSession(_text(1, MAX_UID_CHARS)(s.get("pod_uid"),
                                                           f"{path}[{i}].pod_uid"),
                                   _number(0, 1e15)(s.get("gpu_time_ms"),
                                                    f"{path}[{i}].gpu_time_ms")))
    return tuple(out)


def _decode_progress(raw: Any, path: str) -> tuple[ReportedProgress, ...]:
    """The optional ``progress`` list of one GPU (absent or null = none reported); a pod
    listed twice is refused."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_PROCESSES_PER_GPU:
        raise ReportError(path, f"must be a list of at most {MAX_PROCESSES_PER_GPU} entries")
    out = []
    for i, p in enumerate(raw):
        at = f"{path}[{i}]"
        if not isinstance(p, Mapping):
            raise ReportError(at, "must be an object")
        samples = p.get("samples_per_s")
        out.append(ReportedProgress(
            _text(1, MAX_UID_CHARS)(p.get("pod_uid"), f"{at}.pod_uid"),
            _number(0, MAX_RATE)(p.get("steps_per_s"), f"{at}.steps_per_s"),
            _number(1e-3, 86400)(p.get("window_s"), f"{at}.window_s"),
            None if samples is None else _number(0, MAX_RATE)(samples, f"{at}.samples_per_s")))
    if len({p.pod_uid for p in out}) != len(out):
        raise ReportError(path, "a pod is listed twice")
    return tuple(out)


__all__ = ["AgentReport", "ReportError", "ReportedGpu", "ReportedProcess", "ReportedProgress",
           "ReportedSession", "decode_report", "encode_report"]
