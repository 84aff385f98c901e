"""Planner inputs besides sessions and profiles: GPU types and the Harpagon switches."""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.dispatch import Dispatch
from planner.types import PlannerError


@dataclass(frozen=True)
class GpuType:
    """A kind of GPU the planner may use: its memory and its price per GPU."""

    name: str
    memory_mib: float
    cost: float = 1.0
    """Price of one GPU of this type (any unit; only ratios matter). Default 1."""

    def __post_init__(self) -> None:
        if not self.name:
            raise PlannerError("a GPU type needs a name")
        if not (math.isfinite(self.memory_mib) and self.memory_mib > 0):
            raise PlannerError(f"gpu type {self.name}: memory_mib must be > 0")
        if not (math.isfinite(self.cost) and self.cost > 0):
            raise PlannerError(f"gpu type {self.name}: cost must be > 0")


@dataclass(frozen=True)
class HarpagonOptions:
    """Harpagon's improvements over Nexus, each switchable so its effect can be measured.

    All off is Nexus's squishy bin packing (round-robin dispatch, one saturated
    configuration per session, GPU count as the objective).
    """

    batch_aware_dispatch: bool = False
    """Dedicated GPUs receive whole batches from the session's stream: worst case
    ``l(b) + b/w`` (``w`` = rate still to place) instead of ``2*l(b)``."""
    multi_tuple: bool = False
    """Several dedicated configurations per session (Harpagon Algorithm 1), not one."""
    dummy_requests: bool = False
    """Pad a session's rate when that removes a residual (Harpagon Theorem 2)."""
    latency_reassignment: bool = False
    """Queries: give a module's residual the end-to-end slack left by the others."""
    cost_per_gpu_type: bool = False
    """Minimise total price (``GpuType.cost``) rather than the GPU count."""
    latency_cost_split: bool = False
    """Queries: split the SLO with Harpagon's Algorithm 2 (latency-cost efficiency, node
    merger, cost-direct) instead of Nexus's dynamic program on a latency grid."""

    @property
    def dispatch(self) -> Dispatch:
        """The dispatch the plan assumes (the deployed one is ``DEPLOYED_DISPATCH``)."""
        return Dispatch.BATCH_AWARE if self.batch_aware_dispatch else Dispatch.ROUND_ROBIN

    @classmethod
    def nexus(cls) -> HarpagonOptions:
        """Every switch off: plain Nexus."""
        return cls()

    @classmethod
    def harpagon(cls) -> HarpagonOptions:
        """Every switch on."""
        return cls(True, True, True, True, True, True)

    def price(self, gpu_type: GpuType) -> float:
        """What one GPU of this type costs under these options."""
        return gpu_type.cost if self.cost_per_gpu_type else 1.0


SWITCHES = (
    "batch_aware_dispatch",
    "multi_tuple",
    "dummy_requests",
    "latency_reassignment",
    "cost_per_gpu_type",
    "latency_cost_split",
)
