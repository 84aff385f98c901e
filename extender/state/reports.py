"""Agent reports: bearer-token check and validation of the report document.

The token is read from ``reports.token_file`` (re-read on each check, so a
rotated Secret takes effect without restart) or ``reports.token_env``; it is
compared in constant time and never logged. With no token configured every
report is refused: an open endpoint would let anyone steer placements.
"""

from __future__ import annotations

import hmac
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extender.config import ReportsConfig
from extender.core import GpuSpec
from extender.errors import BadRequest, Unauthorized

MAX_GPUS_PER_REPORT = 64
MAX_PROCESSES_PER_GPU = 256
MAX_UID_CHARS = 128


@dataclass(frozen=True)
class ReportedProcess:
    """One process on a GPU: its pod (when attributed), memory and utilisation."""

    pod_uid: str | None
    used_memory_mib: float | None
    util_percent: float | None


@dataclass(frozen=True)
class DecodedReport:
    """A validated report: node, measured inventory and per-GPU load."""

    node: str
    gpus: tuple[GpuSpec, ...]
    util_percent: tuple[float, ...]
    memory_used_mib: tuple[float, ...]
    processes: tuple[tuple[ReportedProcess, ...], ...] = ()
    """Per GPU (same order as ``gpus``), the processes the agent saw on it."""
    sessions: tuple[tuple[ReportedSession, ...], ...] = ()
    """Per GPU, the best-effort sessions its inference server runs (optional)."""


@dataclass(frozen=True)
class ReportedSession:
    """A best-effort session of a GPU's inference server: its pod and the GPU time the
    server has measured for it since the session started (a cumulative counter)."""

    pod_uid: str
    gpu_time_ms: float


def expected_token(cfg: ReportsConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The configured token (file first, then environment), or None."""
    if cfg.token_file:
        try:
            return Path(cfg.token_file).read_text().strip() or None
        except OSError:
            return None
    return (environ if environ is not None else os.environ).get(cfg.token_env) or None


def check_token(header: str | None, cfg: ReportsConfig,
                environ: Mapping[str, str] | None = None) -> None:
    """Raise Unauthorized unless ``header`` is ``Bearer <configured token>``."""
    expected = expected_token(cfg, environ)
    if expected is None:
        raise Unauthorized("no agent token is configured on the extender")
    given = header[7:].strip() if header and header.startswith("Bearer ") else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise Unauthorized("missing or wrong bearer token")


def _num(value: Any, path: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise BadRequest(path, f"must be a number in [{low:g}, {high:g}]")
    return float(value)


def _optional(value: Any, path: str, low: float, high: float) -> float:
    return math.nan if value is None else _num(value, path, low, high)


def decode_report(document: Any) -> DecodedReport:
    """Validate the architecture's report shape; BadRequest names the first bad field."""
    if not isinstance(document, Mapping):
        raise BadRequest("body", "must be a JSON object")
    node = document.get("node")
    if not isinstance(node, str) or not node:
        raise BadRequest("node", "must be a non-empty string")
    gpus_raw = document.get("gpus")
    if not isinstance(gpus_raw, list) or len(gpus_raw) > MAX_GPUS_PER_REPORT:
        raise BadRequest("gpus", f"must be a list of at most {MAX_GPUS_PER_REPORT} GPUs")
    gpus, utils, used, procs, sessions = [], [], [], [], []
    for i, g in enumerate(gpus_raw):
        path = f"gpus[{i}]"
        if not isinstance(g, Mapping):
            raise BadRequest(path, "must be an object")
        index = g.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 1024:
            raise BadRequest(f"{path}.index", "must be an integer in 0..1023")
        uuid, product = g.get("uuid"), g.get("product")
        if not isinstance(uuid, str) or not uuid or not isinstance(product, str) \
                or not product:
            raise BadRequest(f"{path}.uuid/product", "must be non-empty strings")
        total = _num(g.get("memory_total_mib"), f"{path}.memory_total_mib", 1, 1e7)
        # null = the agent lost this GPU's metrics: no observation, reservations decide
        used.append(_optional(g.get("memory_used_mib"), f"{path}.memory_used_mib", 0, 1e7))
        utils.append(_optional(g.get("utilization_percent"), f"{path}.utilization_percent", 0,
                               100))
        gpus.append(GpuSpec(index, uuid, product, total))
        procs.append(_processes(g.get("processes"), f"{path}.processes"))
        sessions.append(_sessions(g.get("sessions"), f"{path}.sessions"))
    if len({g.index for g in gpus}) != len(gpus):
        raise BadRequest("gpus", "GPU indices repeat")
    if len({g.uuid for g in gpus}) != len(gpus):  # placements find their GPUs by UUID
        raise BadRequest("gpus", "GPU UUIDs repeat")
    return DecodedReport(node, tuple(gpus), tuple(utils), tuple(used), tuple(procs),
                         tuple(sessions))


def _sessions(raw: Any, path: str) -> tuple[ReportedSession, ...]:
    """The optional ``sessions`` list of one GPU (absent or null = none reported)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_PROCESSES_PER_GPU:
        raise BadRequest(path, f"must be a list of at most {MAX_PROCESSES_PER_GPU} sessions")
    out = []
    for i, entry in enumerate(raw):
        uid = entry.get("pod_uid") if isinstance(entry, Mapping) else None
        if not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID_CHARS:
            raise BadRequest(f"{path}[{i}].pod_uid",
                             f"must be a string of 1..{MAX_UID_CHARS} characters")
        out.append(ReportedSession(uid, _num(entry.get("gpu_time_ms"),
                                             f"{path}[{i}].gpu_time_ms", 0, 1e15)))
    return tuple(out)


def _processes(raw: Any, path: str) -> tuple[ReportedProcess, ...]:
    """The optional ``processes`` list of one GPU (absent or null = none reported)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_PROCESSES_PER_GPU:
        raise BadRequest(path, f"must be a list of at most {MAX_PROCESSES_PER_GPU} processes")
    out = []
    for i, p in enumerate(raw):
        if not isinstance(p, Mapping):
            raise BadRequest(f"{path}[{i}]", "must be an object")
        uid = p.get("pod_uid")
        if uid is not None and (not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID_CHARS):
            raise BadRequest(f"{path}[{i}].pod_uid",
                             f"must be null or a string of 1..{MAX_UID_CHARS} characters")
        mem = _optional(p.get("used_memory_mib"), f"{path}[{i}].used_memory_mib", 0, 1e7)
        util = _optional(p.get("utilization_percent"), f"{path}[{i}].utilization_percent", 0,
                         100)
        out.append(ReportedProcess(uid, None if math.isnan(mem) else mem,
                                   None if math.isnan(util) else util))
    return tuple(out)
