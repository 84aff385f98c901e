"""Nexus/Harpagon planning: per-GPU duty cycles, squishy bin packing, latency splits.

Pure library (no I/O, no clock): the extender's admission filter, the agent's
inference server and ``tandem plan`` all import it.
"""

from planner.duty_cycle import (
    SaturatedConfig,
    batch_for,
    max_duty_cycle_ms,
    max_rate_alone_rps,
    plan_gpu,
    plan_shares,
    saturated_config,
)
from planner.types import (
    GpuPlan,
    Infeasible,
    InfeasibleReason,
    PlanFileError,
    PlannerError,
    SessionAllocation,
    SessionError,
    SessionSpec,
)

__all__ = [
    "GpuPlan",
    "Infeasible",
    "InfeasibleReason",
    "PlanFileError",
    "PlannerError",
    "SaturatedConfig",
    "SessionAllocation",
    "SessionError",
    "SessionSpec",
    "batch_for",
    "max_duty_cycle_ms",
    "max_rate_alone_rps",
    "plan_gpu",
    "plan_shares",
    "saturated_config",
]
