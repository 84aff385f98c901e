"""Value types of the planner: sessions, per-GPU plans, and why a plan is infeasible.

Error hierarchy (exceptions are for bad *input*; an infeasible plan is a value)::

    PlannerError(ValueError)
     ├── SessionError        a SessionSpec's fields are invalid
     └── PlanFileError       a plan file has problems (every problem with its path)

``Infeasible`` is returned, never raised: admission control (the extender's filter,
the inference server's registration) needs the reason and the numbers behind it to
build a precise refusal.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass


class PlannerError(ValueError):
    """Base of the planner's input errors."""


class SessionError(PlannerError):
    """A session's fields are invalid (empty name, non-positive SLO or rate)."""


class PlanFileError(PlannerError):
    """A plan file is invalid; ``problems`` lists each one as ``path: message``."""

    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class SessionSpec:
    """One inference session: a model served under a latency SLO at a request rate."""

    name: str
    model: str
    slo_ms: float
    rate_rps: float

    def __post_init__(self) -> None:
        if not self.name or not self.model:
            raise SessionError("a session needs a name and a model")
        if not (math.isfinite(self.slo_ms) and self.slo_ms > 0):
            raise SessionError(f"session {self.name}: slo_ms must be > 0, got {self.slo_ms}")
        if not (math.isfinite(self.rate_rps) and self.rate_rps > 0):
            raise SessionError(f"session {self.name}: rate_rps must be > 0, got {self.rate_rps}")


@dataclass(frozen=True)
class SessionAllocation:
    """A session's share on one GPU: its batch per duty cycle and the rate it absorbs.

    ``latency_ms`` is the worst-case latency of a request under this allocation
    (duty cycle plus batch latency); ``batch_latency_ms`` is ``l(batch)``, the GPU
    time the session takes in each duty cycle.
    """

    session: SessionSpec
    batch: int
    rate_rps: float
    latency_ms: float
    batch_latency_ms: float


@dataclass(frozen=True)
class GpuPlan:
    """One GPU's duty cycle: which sessions it runs, at which batch, and how full it is."""

    gpu_type: str
    duty_cycle_ms: float
    occupancy: float
    """Sum of the batches' latencies over the duty cycle, 0..1."""
    allocations: tuple[SessionAllocation, ...]
    memory_mib: float
    """GPU memory the loaded models need."""

    def allocation(self, session_name: str) -> SessionAllocation | None:
        """The allocation of the named session on this GPU, if any."""
        for alloc in self.allocations:
            if alloc.session.name == session_name:
                return alloc
        return None


class InfeasibleReason(enum.Enum):
    """Why a set of sessions cannot share one GPU (stable names for events and messages)."""

    NO_PROFILE = "NoProfile"
    """No batching profile for (model, gpu_type); ``required``/``available`` are 0."""
    SLO_TOO_TIGHT = "SloTooTight"
    """Even batch 1 alone misses the SLO: ``required`` = 2*l(1) ms, ``available`` = SLO ms."""
    RATE_TOO_HIGH = "RateTooHigh"
    """The session alone cannot keep up: ``required`` = rate, ``available`` = max rate (rps)."""
    OCCUPANCY_OVER_ONE = "OccupancyOverOne"
    """Sessions fit alone but not together: best occupancy found vs 1.0."""
    MEMORY = "InsufficientMemory"
    """Models need ``required`` MiB, the GPU has ``available`` MiB."""
    BEST_EFFORT_PIECE = "NoBestEffortSlack"
    """A best-effort job's longest piece (``required`` ms) exceeds the duty cycle's slack
    (``available`` ms), and overrunning a cycle by it would make an SLO session miss."""


@dataclass(frozen=True)
class Infeasible:
    """A refusal as data: the reason, the session concerned (if one), and the numbers."""

    reason: InfeasibleReason
    required: float
    available: float
    session: str | None = None

    def message(self) -> str:
        """Deterministic human-readable text, rendered at the edge."""
        who = f"session {self.session}: " if self.session else ""
        units = _UNITS[self.reason]
        return (
            f"{who}{self.reason.value} (needs {self.required:.4g}{units}, "
            f"available {self.available:.4g}{units})"
        )


_UNITS = {
    InfeasibleReason.NO_PROFILE: "",
    InfeasibleReason.SLO_TOO_TIGHT: " ms",
    InfeasibleReason.RATE_TOO_HIGH: " rps",
    InfeasibleReason.OCCUPANCY_OVER_ONE: "",
    InfeasibleReason.MEMORY: " MiB",
    InfeasibleReason.BEST_EFFORT_PIECE: " ms",
}
