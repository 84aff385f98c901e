"""Squishy bin packing (Nexus Algorithm 1) across heterogeneous GPU types.

1. Saturate: each session gets dedicated GPUs (``saturate.ConfigPlanner``).
2. Residual: each leftover rate is sized alone (largest duty cycle meeting
   ``d + l(ceil(r*d)) <= L``, Nexus Eq. 2) and its occupancy computed.
3. Merge, best-fit decreasing: residuals in decreasing occupancy go to the GPU
   whose duty cycle, shrunk to the smaller of the two, still fits every batch and
   whose resulting occupancy is highest; memory must fit too. Otherwise a new GPU
   opens, of the type where the residual costs least.

Each finished GPU's duty cycle comes from ``plan_shares`` so the plan the agent
applies is exactly the one the admission filter checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from lab.planning.merge import merge_best
from lab.planning.nodes import Item, ItemFit, TypeNodes
from lab.planning.options import GpuType, HarpagonOptions
from lab.planning.saturate import ConfigPlanner, ProfileIndex, SessionConfig, Tier
from planner.duty_cycle import batch_for, max_duty_cycle_ms, plan_shares
from planner.types import (
    GpuPlan,
    Infeasible,
    InfeasibleReason,
    SessionAllocation,
    SessionSpec,
)
from predictor.batching import BatchingProfile

_EPS = 1e-9


@dataclass(frozen=True)
class PlannedGpu:
    """One GPU of a cluster plan: a stable id, its price and its duty cycle."""

    gpu_id: str
    cost: float
    plan: GpuPlan


@dataclass(frozen=True)
class Move:
    """A session share changing GPU between epochs (make-before-break).

    ``source`` None: a new share; ``target`` None: a share that stops.
    """

    session: str
    source: str | None
    target: str | None
    rate_rps: float


@dataclass(frozen=True)
class ClusterPlan:
    """The planner's answer: GPUs with their duty cycles, and what could not be placed."""

    gpus: tuple[PlannedGpu, ...]
    unplaced: tuple[Infeasible, ...] = ()
    dummy_rps: Mapping[str, float] = field(default_factory=dict)
    moves: tuple[Move, ...] = ()

    @property
    def gpu_count(self) -> int:
        """Number of GPUs used."""
        return len(self.gpus)

    @property
    def total_cost(self) -> float:
        """Sum of the GPUs' prices."""
        return sum(g.cost for g in self.gpus)


def pack(
    sessions: Sequence[SessionSpec],
    profiles: Mapping[tuple[str, str], BatchingProfile],
    gpu_types: Sequence[GpuType],
    options: HarpagonOptions | None = None,
    *,
    residual_slo_ms: Mapping[str, float] | None = None,
    allowed_batches: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> ClusterPlan:
    """Place every session on as few (or as cheap) GPUs as the greedy finds."""
    options = options or HarpagonOptions()
    planner = ConfigPlanner(profiles, gpu_types, options, allowed_batches)
    configs = [planner.configure(s, (residual_slo_ms or {}).get(s.name)) for s in sessions]
    return pack_configs(configs, planner, residual_slo_ms or {})


def pack_configs(
    configs: Sequence[SessionConfig],
    planner: ConfigPlanner,
    residual_slo_ms: Mapping[str, float],
    start_index: int = 0,
) -> ClusterPlan:
    """Dedicated GPUs for the tiers, then best-fit-decreasing packing of residuals."""
    types = {g.name: g for g in planner.gpu_types}
    gpus: list[PlannedGpu] = []
    unplaced: list[Infeasible] = []
    items: list[Item] = []
    for config in configs:
        gpus.extend(_dedicated(config, types, planner, start_index + len(gpus)))
        if config.residual_rps > 0:
            slo = residual_slo_ms.get(config.session.name, config.session.slo_ms)
            parts = residual_items(config.session, config.residual_rps, slo, planner)
            if isinstance(parts, Infeasible):
                unplaced.append(parts)
            else:
                items.extend(parts)
    packing = merge_best(items, planner.gpu_types, planner.options.price)
    for nodes, i in packing.live():
        plan = node_plan(nodes, i)
        gpus.append(PlannedGpu(f"gpu-{start_index + len(gpus)}", nodes.price, plan))
    dummy = {c.session.name: c.dummy_rps for c in configs if c.dummy_rps > 0}
    return ClusterPlan(tuple(gpus), tuple(unplaced), dummy)


def _dedicated(
    config: SessionConfig, types: Mapping[str, GpuType], planner: ConfigPlanner, first: int
) -> list[PlannedGpu]:
    out: list[PlannedGpu] = []
    for tier in config.tiers:
        for gpu in dedicated_gpus(config.session, tier, planner, tier.gpus):
            out.append(PlannedGpu(f"gpu-{first + len(out)}", gpu.cost, gpu.plan))
    return out


def dedicated_gpus(
    session: SessionSpec, tier: Tier, planner: ConfigPlanner, count: int
) -> list[PlannedGpu]:
    """``count`` GPUs running ``session`` alone at the tier's batch (ids left blank)."""
    alloc = SessionAllocation(
        session, tier.batch, tier.throughput_rps, tier.worst_case_ms, tier.batch_latency_ms
    )
    gpu = next(g for g in planner.gpu_types if g.name == tier.gpu_type)
    memory = planner.profiles[(session.model, gpu.name)].memory_mib
    plan = GpuPlan(gpu.name, tier.batch_latency_ms, 1.0, (alloc,), memory)
    return [PlannedGpu("", planner.options.price(gpu), plan) for _ in range(max(0, count))]


def residual_items(
    session: SessionSpec, rate: float, slo_ms: float, planner: ConfigPlanner
) -> list[Item] | Infeasible:
    """The residual as packable items, split evenly if it does not fit one GPU alone."""
    if slo_ms != session.slo_ms:  # a reassigned residual budget (queries)
        session = replace(session, slo_ms=slo_ms)
    first_refusal: Infeasible | None = None
    for parts in range(1, 65):
        share = rate / parts
        per_type: dict[str, ItemFit] = {}
        for gpu in planner.gpu_types:
            idx = planner.index(session.model, gpu.name)
            if idx is None:
                continue
            fit = _fit_alone(session, share, gpu, idx, planner)
            if isinstance(fit, Infeasible):
                first_refusal = first_refusal or fit
            else:
                per_type[gpu.name] = fit
        if per_type:
            return [Item(session, share, slo_ms, dict(per_type)) for _ in range(parts)]
        if first_refusal is None or first_refusal.reason is not InfeasibleReason.RATE_TOO_HIGH:
            break
    if first_refusal is None:
        return Infeasible(InfeasibleReason.NO_PROFILE, 0.0, 0.0, session.name)
    return first_refusal


def _fit_alone(
    session: SessionSpec, rate: float, gpu: GpuType, idx: ProfileIndex, planner: ConfigPlanner
) -> ItemFit | Infeasible:
    """The share alone on ``gpu``: Eq. 3.1's longest cycle, or ``plan_shares``'s refusal.

    Usually the batch at the longest cycle fits in it; only when it does not (or
    memory or the SLO refuses) is the full admission check needed.
    """
    d = max_duty_cycle_ms(idx.profile, session.slo_ms, rate)
    if d is not None and idx.profile.memory_mib <= gpu.memory_mib + _EPS:
        lat = idx.latencies[batch_for(rate, d) - 1]
        if lat <= d + _EPS and 2.0 * idx.latencies[0] <= session.slo_ms + _EPS:
            return ItemFit(d, idx.latencies, idx.latency_array, idx.profile.memory_mib, lat / d)
    alone = plan_shares([(session, rate)], planner.profiles, gpu.name, gpu.memory_mib)
    if isinstance(alone, Infeasible):
        return alone
    d = alone.duty_cycle_ms
    lat = idx.latencies[batch_for(rate, d) - 1]
    return ItemFit(d, idx.latencies, idx.latency_array, idx.profile.memory_mib, lat / d)


def node_plan(nodes: TypeNodes, i: int) -> GpuPlan:
    """The node's duty cycle as merged: each share at ``ceil(r*d)``, batches within ``d``.

    This is the plan ``plan_shares`` checks (``d`` never exceeds any share's longest
    cycle, and the batches fit); the property tests re-check every one through it.
    """
    t = nodes.gpu.name
    duty = float(nodes.duty[i])
    allocations = []
    busy = 0.0
    memory = 0.0
    for item in nodes.items[i]:
        fit = item.per_type[t]
        b = batch_for(item.rate, duty)
        lat = fit.latencies[b - 1]
        busy += lat
        memory += fit.memory_mib
        allocations.append(SessionAllocation(item.session, b, item.rate, duty + lat, lat))
    return GpuPlan(t, duty, min(1.0, busy / duty), tuple(allocations), memory)
