"""The agent loop: sample, attribute, publish, report, sync sessions; once per interval.

With a server supervisor, each sample's GPU indices also tell it which per-GPU
inference servers to keep running (``agent/node/supervisor.py``).

Each step is independent and failure-tolerant: a down GPU source publishes
"source down" and skips the push (the extender's staleness limit then falls back
to reservations), an unreachable extender costs only this interval's report, and
a failed state fetch keeps the previous view.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from agent.errors import ConfigError, GpuSourceError, ReportError, StateError
from agent.node.attribution import ProcAttributor
from agent.node.exporter import AgentCollector, Observation
from agent.node.extender_view import StateClient, ViewHolder
from agent.node.gpus import GpuSource, NodeSample
from agent.node.progress import ProgressScraper, targets
from agent.node.reporter import Reporter, TokenSource, build_report, session_entries
from agent.node.sessions import SessionSync, SyncResult
from agent.node.supervisor import ServerSupervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    """Settings of one agent process."""

    node: str
    interval_seconds: float = 1.0
    """report period; 0.1..3600"""
    push_deadline_ratio: float = 0.8
    """share of the interval that retries of one report may use"""

    def __post_init__(self) -> None:
        if not self.node:
            raise ConfigError("node name is empty: pass --node or set NODE_NAME")
        if not 0.1 <= self.interval_seconds <= 3600:
            raise ConfigError(f"interval {self.interval_seconds} s: expected 0.1..3600")
        if not 0 < self.push_deadline_ratio <= 1:
            raise ConfigError("push_deadline_ratio: expected (0, 1]")


@dataclass(frozen=True)
class StepResult:
    """What one step did (for logs, ``--once --json`` and tests)."""

    report: dict[str, Any] | None
    push_attempts: int = 0
    push_error: str | None = None
    source_error: str | None = None
    state_error: str | None = None
    sessions: SyncResult | None = None


class Agent:
    """Wires a GPU source to the extender, Prometheus and the inference servers."""

    def __init__(self, config: AgentConfig, source: GpuSource, *,
                 registry: CollectorRegistry,
                 attributor: ProcAttributor | None = None,
                 reporter: Reporter | None = None,
                 state: StateClient | None = None,
                 views: ViewHolder | None = None,
                 sessions: SessionSync | None = None,
                 token: TokenSource | None = None,
                 servers: ServerSupervisor | None = None,
                 progress: ProgressScraper | None = None,
                 proc_root: Path = Path("/proc")) -> None:
        self.config = config
        self.registry = registry
        self._source = source
        self._attributor = attributor or ProcAttributor(Path("/proc"))
        self._reporter = reporter
        self._state = state
        self.views = views or ViewHolder()
        self._sessions = sessions
        self._token = token
        self._servers = servers
        self._progress = progress
        self._proc_root = proc_root
        self._latest: Observation | None = None
        self._lock = threading.Lock()
        registry.register(AgentCollector(self.latest, config.node))
        self._reports = Counter("tandem_agent_reports", "Report pushes by outcome.",
                                ["outcome"], registry=registry)
        self._errors = Counter("tandem_agent_errors", "Agent step errors by kind.",
                               ["kind"], registry=registry)
        self._progress_skipped = Counter(
            "tandem_agent_progress_skipped",
            "Pods with a progress annotation left out of a report, by reason.",
            ["reason"], registry=registry)
        if progress is not None:
            progress.on_skip = lambda reason: self._progress_skipped.labels(reason).inc()

    @property
    def servers(self) -> ServerSupervisor | None:
        """The per-GPU server supervisor, if this agent runs the servers."""
        return self._servers

    def gpu_uuids(self) -> list[str]:
        """The UUIDs of this node's GPUs (empty while the GPU source is down)."""
        try:
            return [g.uuid for g in self._source.inventory()]
        except GpuSourceError:
            return []

    def latest(self) -> Observation | None:
        """The newest observation (read by the Prometheus collector at scrape time)."""
        with self._lock:
            return self._latest

    def step(self) -> StepResult:
        """One round; never raises for source, extender or server failures."""
        state_error = self._refresh_view()
        view = self.views.get()
        try:
            sample: NodeSample | None = self._attribute(
                self._source.sample(self.config.interval_seconds))
        except GpuSourceError as err:
            self._errors.labels("gpu_source").inc()
            log.warning("gpu source down", extra={"node": self.config.node, "error": str(err)})
            with self._lock:
                self._latest = Observation(None, view)
            return StepResult(None, source_error=str(err), state_error=state_error)
        with self._lock:
            self._latest = Observation(sample, view)
        if self._servers is not None:  # one inference server per GPU the source lists
            self._servers.ensure(g.info.index for g in sample.gpus)
        report = build_report(self.config.node, sample, session_entries(
            self._sessions.gpu_time_ms, view.pods()) if self._sessions and view else None,
            self._scrape_progress(sample, view))
        attempts, push_error = self._push(report)
        synced = self._sessions.sync(view) if self._sessions and view is not None else None
        return StepResult(report, attempts, push_error, None, state_error, synced)

    def run(self, stop: threading.Event, monotonic: Callable[[], float] = time.monotonic,
            max_steps: int | None = None) -> int:
        """Step every interval until ``stop`` is set; returns the number of steps."""
        steps = 0
        next_at = monotonic()
        while not stop.is_set() and (max_steps is None or steps < max_steps):
            self.step()
            steps += 1
            next_at += self.config.interval_seconds
            now = monotonic()
            if next_at < now:  # a slow step: skip missed ticks instead of bursting
                next_at = now
            stop.wait(next_at - now)
        return steps

    def _refresh_view(self) -> str | None:
        if self._state is None:
            return None
        try:
            token = self._token.get() if self._token is not None else None
            self.views.set(self._state.fetch(self.config.node, token))
        except (StateError, ConfigError) as err:
            self._errors.labels("state").inc()
            log.warning("extender state unavailable", extra={"error": str(err)})
            return str(err)
        return None

    def _scrape_progress(self, sample: NodeSample, view: Any) -> dict[int, Any] | None:
        """Per GPU index, the progress of the pods with a progress annotation
        (:mod:`agent.node.progress`); None without a scraper or a view."""
        if self._progress is None or view is None:
            return None
        pids: dict[str, list[int]] = {}
        for gpu in sample.gpus:
            for proc in gpu.processes:
                if proc.pod_uid and proc.pid is not None:
                    pids.setdefault(proc.pod_uid, []).append(proc.pid)
        pods = [(p.uid, p.gpu_index, dict(p.annotations)) for p in view.pods()]
        found = targets(pods, pids, self._proc_root, self._progress.skip)
        return self._progress.scrape(found)

    def _attribute(self, sample: NodeSample) -> NodeSample:
        gpus = []
        for gpu in sample.gpus:
            processes = []
            for proc in gpu.processes:
                found = None if proc.pod_uid else self._attributor.attribute(proc.pid)
                processes.append(proc if found is None else replace(
                    proc, pod_uid=found.pod_uid, container_id=found.container_id))
            gpus.append(replace(gpu, processes=tuple(processes)))
        return replace(sample, gpus=tuple(gpus))

    def _push(self, report: dict[str, Any]) -> tuple[int, str | None]:
        if self._reporter is None:
            return 0, None
        deadline = self.config.interval_seconds * self.config.push_deadline_ratio
        try:
            attempts = self._reporter.push(report, deadline)
        except (ReportError, ConfigError) as err:
            self._reports.labels(type(err).__name__).inc()
            log.warning("report not delivered", extra={"error": str(err)})
            return getattr(err, "attempts", 1), str(err)
        self._reports.labels("ok").inc()
        return attempts, None
