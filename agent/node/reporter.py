"""The agent report (``contracts.agentreport``) and its push to the extender.

``POST {extender}/v1/agents/report`` with ``Authorization: Bearer <token>``.
Network errors, 5xx and 429 are retried with exponential backoff and jitter
until the interval's deadline (the next report supersedes this one: the extender
keeps reports as soft state); other 4xx are permanent for this report. The token
is read from a file (a mounted Secret, re-read each push so rotation works) or an
environment variable; it never appears in logs, errors or reprs.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent.errors import ConfigError, ExtenderUnavailable, ReportRejected
from agent.node.gpus import GpuSample, NodeSample
from contracts.agentreport import (
    REPORT_PATH,
    AgentReport,
    ReportedGpu,
    ReportedProcess,
    ReportedProgress,
    ReportedSession,
    encode_report,
)
from contracts.tokens import BearerToken, TokenError

log = logging.getLogger(__name__)

TOKEN_ENV = "TANDEM_AGENT_TOKEN"


def build_report(node: str, sample: NodeSample,
                 sessions: Mapping[int, tuple[ReportedSession, ...]] | None = None,
                 progress: Mapping[int, tuple[ReportedProgress, ...]] | None = None,
                 ) -> dict[str, Any]:
    """The report JSON object for one sampling round (``contracts.agentreport``);
    ``sessions``: per GPU index, its server's best-effort sessions (:func:`session_entries`);
    ``progress``: per GPU index, the progress of its pods (:mod:`agent.node.progress`).

    A GPU whose identity was never read (lost since start: no memory total) is left
    out, since the extender needs its total to accept the report; a GPU lost later
    keeps its identity and is sent with null metrics.
    """
    return encode_report(AgentReport(
        node=node,
        gpus=tuple(_gpu_entry(g, (sessions or {}).get(g.info.index, ()),
                              (progress or {}).get(g.info.index, ()))
                   for g in sample.gpus if g.info.memory_total_mib is not None),
        timestamp=round(sample.timestamp, 3),
        interval_seconds=sample.interval_seconds,
    ))


def session_entries(gpu_time_ms: Mapping[int, Mapping[str, float]],
                    pods: Iterable[Any]) -> dict[int, tuple[ReportedSession, ...]]:
    """Per GPU index, each best-effort session its server lists with the GPU time it used,
    matched to its pod by session name (``<namespace>.<name>``): the extender learns the
    session's utilisation from it."""
    uid_of = {(p.gpu_index, f"{p.namespace}.{p.name}"): p.uid for p in pods}
    return {index: tuple(ReportedSession(uid_of[(index, name)], round(ms, 3))
                         for name, ms in sorted(times.items()) if (index, name) in uid_of)
            for index, times in gpu_time_ms.items()}


def _gpu_entry(g: GpuSample, sessions: tuple[ReportedSession, ...] = (),
               progress: tuple[ReportedProgress, ...] = ()) -> ReportedGpu:
    return ReportedGpu(
        index=g.info.index,
        uuid=g.info.uuid,
        product=g.info.product,
        memory_total_mib=g.info.memory_total_mib or 0,
        memory_used_mib=g.memory_used_mib,
        utilization_percent=_round(g.utilization_percent, 2),
        memory_utilization_percent=_round(g.memory_utilization_percent, 2),
        power_watts=_round(g.power_watts, 1),
        temperature_c=g.temperature_c,
        xid_errors=g.xid_errors,
        mig_mode=g.info.mig_mode,
        processes=tuple(
            ReportedProcess(pod_uid=p.pod_uid, used_memory_mib=p.used_memory_mib,
                            util_percent=_round(p.utilization_percent, 2), pid=p.pid,
                            container_id=p.container_id)
            for p in g.processes),
        sessions=sessions,
        progress=progress,
    )


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)


class TokenSource(BearerToken):
    """The bearer token, from a file (re-read every call) or an environment variable."""

    def __init__(self, path: Path | None = None, env: str = TOKEN_ENV,
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(path, env, environ)
        self.get()  # fail at start, with a clear message, rather than at the first push

    def get(self) -> str:
        """The current token; ``ConfigError`` if none is configured or the file is empty."""
        try:
            return super().get()
        except TokenError as err:
            raise ConfigError(str(err)) from None


@dataclass(frozen=True)
class BackoffPolicy:
    """Retry schedule: delay k is ``min(max, initial * multiplier**k)``, jittered down."""

    initial_seconds: float = 0.1
    multiplier: float = 2.0
    max_seconds: float = 2.0
    max_attempts: int = 5
    jitter_ratio: float = 0.5
    """each delay is drawn uniformly from ``[d * (1 - jitter_ratio), d]`` so agents spread out"""

    def __post_init__(self) -> None:
        if self.initial_seconds <= 0 or self.multiplier < 1 or self.max_seconds <= 0:
            raise ConfigError("backoff: initial and max must be > 0, multiplier >= 1")
        if self.max_attempts < 1 or not 0 <= self.jitter_ratio <= 1:
            raise ConfigError("backoff: max_attempts >= 1 and jitter_ratio in [0, 1]")

    def delay_seconds(self, retry: int, rng: random.Random) -> float:
        """The pause before retry number ``retry`` (0-based)."""
        ceiling = min(self.max_seconds, self.initial_seconds * self.multiplier**retry)
        return ceiling * (1 - self.jitter_ratio * rng.random())


def _retryable(status_code: int) -> bool:
    return status_code >= 500 or status_code == 429


class Reporter:
    """Pushes reports to the extender with retries inside a deadline."""

    def __init__(self, extender_url: str, token: TokenSource, *,
                 transport: httpx.BaseTransport | None = None,
                 backoff: BackoffPolicy = BackoffPolicy(),
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, timeout_seconds: float = 2.0) -> None:
        self._client = httpx.Client(base_url=extender_url, transport=transport,
                                    timeout=timeout_seconds)
        self._token = token
        self._backoff = backoff
        self._sleep = sleep
        self._monotonic = monotonic
        self._rng = rng if rng is not None else random.Random()

    def push(self, report: dict[str, Any], deadline_seconds: float) -> int:
        """Send one report; returns the number of attempts, raises ``ReportError``."""
        start = self._monotonic()
        last_error = ""
        for attempt in range(1, self._backoff.max_attempts + 1):
            headers = self._token.headers()
            try:
                response = self._client.post(REPORT_PATH, json=report, headers=headers)
            except httpx.HTTPError as err:
                last_error = type(err).__name__  # class name only: messages may echo requests
            else:
                if response.status_code < 300:
                    return attempt
                if not _retryable(response.status_code):
                    raise ReportRejected(response.status_code)
                last_error = f"HTTP {response.status_code}"
            if attempt == self._backoff.max_attempts:
                break
            delay = self._backoff.delay_seconds(attempt - 1, self._rng)
            if self._monotonic() + delay - start > deadline_seconds:
                break  # the next interval's report will supersede this one
            log.info("report retry", extra={"attempt": attempt, "error": last_error,
                                            "delay_seconds": round(delay, 3)})
            self._sleep(delay)
        raise ExtenderUnavailable(attempt, last_error)

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()
