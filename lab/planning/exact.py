"""Exact residual packing for small instances: the yardstick for the greedy packer.

Nexus's integer program (Section 6.1) assigns each residual session to one GPU,
subject to the duty-cycle constraints. With the per-GPU feasibility check
``plan_shares`` as an oracle, it becomes set partitioning: enumerate every subset
of sessions and GPU type that one GPU can host, then choose the cheapest
partition. The partition is solved exactly by dynamic programming over subsets
(``3^n`` steps; meant for n <= 12), so no solver tolerance enters the yardstick.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lab.planning.options import GpuType, HarpagonOptions
from planner.duty_cycle import plan_shares
from planner.types import GpuPlan, PlannerError, SessionSpec
from predictor.batching import BatchingProfile

MAX_EXACT_SESSIONS = 14


@dataclass(frozen=True)
class ExactPlan:
    """An optimal partition: one GpuPlan per GPU, and its total price."""

    gpus: tuple[GpuPlan, ...]
    cost: float

    @property
    def gpu_count(self) -> int:
        """Number of GPUs used."""
        return len(self.gpus)


def exact_pack(
    sessions: Sequence[SessionSpec],
    profiles: Mapping[tuple[str, str], BatchingProfile],
    gpu_types: Sequence[GpuType],
    options: HarpagonOptions | None = None,
) -> ExactPlan | None:
    """Cheapest assignment of whole sessions to GPUs; None if some session fits nowhere."""
    options = options or HarpagonOptions()
    n = len(sessions)
    if n > MAX_EXACT_SESSIONS:
        raise PlannerError(f"exact_pack handles at most {MAX_EXACT_SESSIONS} sessions, got {n}")
    full = (1 << n) - 1
    best_gpu: dict[int, tuple[float, GpuPlan]] = {}
    for mask in range(1, full + 1):
        chosen = [sessions[i] for i in range(n) if mask >> i & 1]
        for gpu in gpu_types:
            price = options.price(gpu)
            if mask in best_gpu and best_gpu[mask][0] <= price:
                continue
            plan = plan_shares(
                [(s, s.rate_rps) for s in chosen], profiles, gpu.name, gpu.memory_mib
            )
            if isinstance(plan, GpuPlan):
                best_gpu[mask] = (price, plan)
    # cost[mask]: cheapest partition of mask; each step covers the lowest session.
    inf = float("inf")
    cost = [inf] * (full + 1)
    pick = [0] * (full + 1)
    cost[0] = 0.0
    for mask in range(1, full + 1):
        low = mask & -mask
        rest = mask ^ low
        sub = rest
        while True:
            group = sub | low
            entry = best_gpu.get(group)
            if entry is not None and entry[0] + cost[mask ^ group] < cost[mask]:
                cost[mask] = entry[0] + cost[mask ^ group]
                pick[mask] = group
            if sub == 0:
                break
            sub = (sub - 1) & rest
    if cost[full] == inf:
        return None
    plans = []
    mask = full
    while mask:
        plans.append(best_gpu[pick[mask]][1])
        mask ^= pick[mask]
    return ExactPlan(tuple(plans), cost[full])
