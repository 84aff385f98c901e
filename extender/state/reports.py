"""Agent reports: bearer-token check, and the report in the form the ledger takes.

The report's shape and limits are the contract in :mod:`contracts.agentreport`
(the agent encodes with it, this module decodes with it).

The token is read from ``reports.token_file`` (re-read on each check, so a
rotated Secret takes effect without restart) or ``reports.token_env`` by
``contracts.tokens`` (stripped, compared in constant time, never logged). With
no token configured every report is refused: an open endpoint would let anyone
steer placements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contracts.agentreport import (
    AgentReport,
    ReportedProcess,
    ReportedProgress,
    ReportedSession,
    ReportError,
)
from contracts.agentreport import decode_report as contract_decode
from contracts.tokens import bearer_of, same_token, token_or_none
from extender.config.sections import ReportsConfig
from extender.core import GpuSpec
from extender.errors import BadRequest, Unauthorized


@dataclass(frozen=True)
class DecodedReport:
    """A report as the ledger and the learner take it: node, measured inventory (the core's
    ``GpuSpec``), per-GPU load (NaN where the agent lost a metric) and processes."""

    node: str
    gpus: tuple[GpuSpec, ...]
    util_percent: tuple[float, ...]
    memory_used_mib: tuple[float, ...]
    processes: tuple[tuple[ReportedProcess, ...], ...] = ()
    """Per GPU (same order as ``gpus``), the processes the agent saw on it."""
    sessions: tuple[tuple[ReportedSession, ...], ...] = ()
    """Per GPU, the best-effort sessions its inference server runs (GPU time used)."""
    progress: tuple[tuple[ReportedProgress, ...], ...] = ()
    """Per GPU, the progress of its pods that expose a step counter."""

    @classmethod
    def of(cls, report: AgentReport) -> DecodedReport:
        """The extender's form of a decoded ``contracts.agentreport.AgentReport``."""
        return cls(
            report.node,
            tuple(GpuSpec(g.index, g.uuid, g.product, g.memory_total_mib) for g in report.gpus),
            tuple(_nan(g.utilization_percent) for g in report.gpus),
            tuple(_nan(g.memory_used_mib) for g in report.gpus),
            tuple(g.processes for g in report.gpus),
            tuple(g.sessions for g in report.gpus),
            tuple(g.progress for g in report.gpus))


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def expected_token(cfg: ReportsConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The configured token (file first, then environment, stripped), or None."""
    return token_or_none(cfg.token_file or None, cfg.token_env, environ)


def check_token(header: str | None, cfg: ReportsConfig,
                environ: Mapping[str, str] | None = None) -> None:
    """Raise Unauthorized unless ``header`` is ``Bearer <configured token>``."""
    expected = expected_token(cfg, environ)
    if expected is None:
        raise Unauthorized("no agent token is configured on the extender")
    if not same_token(bearer_of(header), expected):
        raise Unauthorized("missing or wrong bearer token")


def decode_report(document: Any) -> DecodedReport:
    """The report body through the one decoder; BadRequest names the first bad field."""
    try:
        return DecodedReport.of(contract_decode(document))
    except ReportError as exc:
        raise BadRequest(exc.path, exc.problem) from None
