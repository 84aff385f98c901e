"""Runtime configuration and the executor loop's per-session state."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from agent.inference.errors import DropReason
from agent.inference.executors.executors import LoadedModel
from agent.inference.quanta import JobSpec
from agent.inference.runtime.batch_formation import DropPolicy, Request, form_batch
from agent.inference.runtime.holding import Hold
from agent.inference.runtime.stats import SessionStats
from planner import SessionAllocation, SessionSpec
from predictor.batching import BatchingProfile


@dataclass(frozen=True)
class RuntimeConfig:
    """Tunables of the executor loop; units in the names."""

    gpu_type: str
    memory_mib: float = 1e12
    """GPU memory available to models (planner's memory check)."""
    drop_policy: DropPolicy = DropPolicy.EARLY
    overhead_tolerance_percent: float = 2.0
    """Operator's overhead tolerance for choosing Q (Olympian used 2-2.5%)."""
    quantum_ms: float | None = None
    """Fixed Q; None chooses it from the overhead curves."""
    min_quantum_ms: float = 1.0
    max_quantum_ms: float = 2.0
    segment_fraction_of_quantum: float = 0.25
    """Segments target this share of Q so a quantum overshoots by little."""
    overrun_every_cycles: int = 4
    """After this many duty cycles (>= 1) in which no best-effort segment found room in
    the slack, one may overrun the cycle; the SLO sessions' next slot moves back by it."""
    rate_window_ms: float = 1000.0
    rate_ewma_alpha: float = 0.5
    replan_threshold_percent: float = 25.0
    min_replan_interval_ms: float = 5000.0
    max_queue: int = 10_000
    learn_latency_margin: bool = False
    """Plan with profiles scaled by the observed ``latency_quantile`` of (batch time /
    profiled l(b)) over recent batches, refreshed every rate window: the headroom a
    real executor's variance needs. Off for the simulated executor."""
    latency_quantile: float = 0.99
    latency_margin_window: int = 2000
    """Batches the quantile is taken over (the most recent)."""
    min_latency_samples: int = 100

    def __post_init__(self) -> None:
        if not (isinstance(self.overrun_every_cycles, int) and self.overrun_every_cycles >= 1):
            raise ValueError(f"overrun_every_cycles must be an integer >= 1, "
                             f"got {self.overrun_every_cycles!r}")
        if not 0.5 <= self.latency_quantile < 1.0:
            raise ValueError(f"latency_quantile must be in [0.5, 1), got {self.latency_quantile}")
        if self.latency_margin_window < self.min_latency_samples or self.min_latency_samples < 1:
            raise ValueError("need 1 <= min_latency_samples <= latency_margin_window")


def profile_json(profile: BatchingProfile) -> dict[str, Any]:
    """The batching profile a session runs with, as the HTTP API shows it."""
    return {
        "model": profile.model,
        "gpu_type": profile.gpu_type,
        "max_batch": profile.max_batch,
        "alpha_ms": profile.alpha_ms,
        "beta_ms": profile.beta_ms,
        "latency_batch1_ms": profile.latency_ms(1),
    }


@dataclass
class SloState:
    spec: SessionSpec
    loaded: LoadedModel
    profile: BatchingProfile
    batch: int
    queue: deque[Request] = field(default_factory=deque)
    stats: SessionStats = field(default_factory=SessionStats)
    window_start_ms: float = 0.0
    window_count: int = 0
    rate_ewma_rps: float = 0.0
    hold: Hold | None = None
    """The rate held now (``holding.py``); set at registration."""
    priority: int = 0
    """Higher gives way later when the host cannot hold every session (``sacrifice.py``)."""

    def enqueue(self, request: Request) -> None:
        self.queue.append(request)
        self.window_count += 1

    def admitted_spec(self) -> SessionSpec:
        """The session at the rate it was admitted at, for admission: a replan follows
        the rates observed, and before any traffic (between registrations) those made
        every earlier session 0.1 requests/s, so a third session was admitted beside
        two at 100 (and all three shed most of their requests once clients came)."""
        rate = self.hold.admitted_rps if self.hold is not None else self.spec.rate_rps
        return replace(self.spec, rate_rps=rate)

    def follow(self, alloc: SessionAllocation) -> None:
        """Take the plan's batch size; a plan made with headroom carries shortened
        SLOs, so the real one stays."""
        self.batch = alloc.batch
        self.spec = replace(alloc.session, slo_ms=self.spec.slo_ms)

    def take_batch(self, now: float, policy: DropPolicy) -> tuple[list[Request], DropReason,
                                                                  list[Request]]:
        """(batch, why dropped, dropped) off the queue under the drop policy."""
        batch, dropped = form_batch(self.queue, now, self.batch, self.profile.latency_ms, policy)
        why = DropReason.EARLY_DROP if policy is DropPolicy.EARLY else DropReason.DEADLINE_EXPIRED
        for _ in dropped:
            self.stats.record_drop(why)
        return batch, why, dropped

    def observe_rate(self, now: float, window_ms: float, alpha: float) -> float | None:
        """Close the rate window if it is over; the EWMA's relative drift from the
        planned rate then, else None."""
        span = now - self.window_start_ms
        if span < window_ms:
            return None
        rate = self.window_count * 1000.0 / span
        self.rate_ewma_rps = alpha * rate + (1 - alpha) * self.rate_ewma_rps
        self.window_start_ms, self.window_count = now, 0
        return abs(self.rate_ewma_rps - self.spec.rate_rps) / self.spec.rate_rps

    def record_batch(self, requests: list[Request], elapsed_ms: float) -> None:
        self.stats.gpu_time_ms += elapsed_ms
        self.stats.batch_sizes[len(requests)] += 1

    def promised(self) -> dict[str, Any]:
        """What this server promises the session now: its SLO at the rate it holds."""
        hold = self.hold
        return {"slo_ms": self.spec.slo_ms,
                "rate_rps": hold.rate_rps if hold else self.spec.rate_rps,
                "reason": hold.reason if hold else None}

    def to_json(self, total_gpu_ms: float, elapsed_ms: float) -> dict[str, Any]:
        """This session's entry in GET /v1/sessions."""
        return {
            "name": self.spec.name, "kind": "slo", "model": self.spec.model,
            "slo_ms": self.spec.slo_ms, "rate_rps": self.spec.rate_rps,
            "observed_rate_rps": self.rate_ewma_rps, "batch": self.batch,
            "queue": len(self.queue),
            "gpu_share": self.stats.gpu_time_ms / total_gpu_ms if total_gpu_ms else 0.0,
            "priority": self.priority,
            "held": self.hold.to_json() if self.hold else None,
            "promised": self.promised(),
            **self.stats.to_json(elapsed_ms),
        }  # fmt: skip


@dataclass
class InFlight:
    request: Request
    costs_ms: tuple[float, ...]
    index: int
    feed: dict[str, Any]


@dataclass
class BestEffortState:
    job: JobSpec
    loaded: LoadedModel
    profile: BatchingProfile
    queue: deque[Request] = field(default_factory=deque)
    current: InFlight | None = None
    stats: SessionStats = field(default_factory=SessionStats)
    cost_scale: float = 1.0
    """EWMA of measured / profiled segment time: corrects the slack-fit estimate."""

    def runnable(self) -> bool:
        return self.current is not None or bool(self.queue)

    def next_piece(self, target_ms: float) -> InFlight:
        """The request in flight, starting the next queued one (cut into segments of
        about ``target_ms``) when none is."""
        if self.current is None:
            req = self.queue.popleft()
            items = max(int(req.tensor.shape[0]) if getattr(req.tensor, "ndim", 0) else 1, 1)
            whole = self.profile.latency_ms(min(items, self.profile.max_batch))
            whole *= math.ceil(items / self.profile.max_batch)
            costs = self.loaded.segment_costs_ms(whole, target_ms)
            self.current = InFlight(req, costs, 0, {self.loaded.input_name: req.tensor})
        return self.current

    def segment_ran(self, feed: dict[str, Any] | None, profiled_ms: float,
                    measured_ms: float) -> InFlight | None:
        """Count one segment (``feed`` None: it failed); the finished flight, if it was
        the last piece or failed."""
        flight = self.current
        assert flight is not None
        self.stats.gpu_time_ms += measured_ms
        if profiled_ms > 0 and feed is not None:
            self.cost_scale = 0.8 * self.cost_scale + 0.2 * measured_ms / profiled_ms
        if feed is not None:
            flight.feed = feed
        flight.index += 1
        if feed is not None and flight.index < len(flight.costs_ms):
            return None
        self.current = None
        if feed is None:
            self.stats.record_drop(DropReason.EXECUTION_FAILED)
        else:
            self.stats.served += 1
            self.stats.good += 1
            tensor = flight.request.tensor
            self.stats.batch_sizes[int(tensor.shape[0]) if tensor.ndim else 1] += 1
        return flight

    def abandon(self) -> list[Request]:
        """Everything queued or in flight, which no one will run now."""
        pending = list(self.queue) + ([self.current.request] if self.current else [])
        self.queue.clear()
        self.current = None
        return pending

    def to_json(self, total_gpu_ms: float, elapsed_ms: float) -> dict[str, Any]:
        """This session's entry in GET /v1/sessions."""
        return {
            "name": self.job.name, "kind": "best_effort", "model": self.loaded.ref,
            "weight": self.job.weight, "segments": len(self.loaded.segment_fractions or ()),
            "cuts": self.loaded.cuts, "segment_overhead": self.loaded.segment_overhead,
            "priority": self.job.priority,
            "queue": len(self.queue) + (1 if self.current else 0),
            "gpu_share": self.stats.gpu_time_ms / total_gpu_ms if total_gpu_ms else 0.0,
            **self.stats.to_json(elapsed_ms),
        }  # fmt: skip


@dataclass
class Action:
    kind: str  # "batch" | "segment" | "probe"
    session: Any
    requests: list[Request] = field(default_factory=list)
    profiled_ms: float = 0.0
