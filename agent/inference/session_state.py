"""Runtime configuration and the executor loop's per-session state."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agent.inference.batch_formation import DropPolicy, Request
from agent.inference.executors import LoadedModel
from agent.inference.quanta import JobSpec
from agent.inference.stats import SessionStats
from planner import SessionSpec
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

    def to_json(self, total_gpu_ms: float, elapsed_ms: float) -> dict[str, Any]:
        """This session's entry in GET /v1/sessions."""
        return {
            "name": self.spec.name, "kind": "slo", "model": self.spec.model,
            "slo_ms": self.spec.slo_ms, "rate_rps": self.spec.rate_rps,
            "observed_rate_rps": self.rate_ewma_rps, "batch": self.batch,
            "queue": len(self.queue),
            "gpu_share": self.stats.gpu_time_ms / total_gpu_ms if total_gpu_ms else 0.0,
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
    kind: str  # "batch" | "segment"
    session: Any
    requests: list[Request] = field(default_factory=list)
    profiled_ms: float = 0.0
