"""Incremental re-planning across epochs (Nexus Section 6.1): move as few shares as possible.

Given the previous ``ClusterPlan`` and this epoch's sessions (new rates, sessions
added or removed):

1. Dedicated GPUs: each session's new configuration asks for ``n`` GPUs per
   (type, batch); up to ``n`` of its old dedicated GPUs with that key are kept
   unchanged, missing ones open, surplus ones stop.
2. Residual shares stay where they were, scaled to the session's new residual
   rate. A GPU that is now overloaded evicts its cheapest shares (least GPU time
   alone, Nexus's "cheapest sessions") until it is not: a single eviction that
   suffices is preferred, so most overloaded GPUs lose one share.
3. Evicted shares and new residuals are packed onto the kept GPUs, then new ones,
   with the same best-fit merge as a fresh plan. When load fell, the emptiest
   GPUs are emptied into the others when every share finds a place (a GPU freed).

Transition invariant (make-before-break), checked by the property tests: for
every GPU, the models of its old and new shares fit in memory *together* (the
new home loads a model before the old one drops it), and the new plan of every
GPU is feasible at the new rates; traffic of a moved share goes to its new GPU,
which never runs more than its new plan, and the old GPU runs a subset of its new
plan once the share left (removing a share from a duty cycle keeps it feasible).
So no GPU is ever asked to serve an overloaded duty cycle during the move.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lab.planning.merge import Packing
from lab.planning.nodes import Item
from lab.planning.options import GpuType, HarpagonOptions
from lab.planning.packing import (
    ClusterPlan,
    Move,
    PlannedGpu,
    dedicated_gpus,
    node_plan,
    residual_items,
)
from lab.planning.saturate import ConfigPlanner
from planner.duty_cycle import plan_shares
from planner.types import GpuPlan, Infeasible, SessionSpec
from predictor.batching import BatchingProfile

_EPS = 1e-9


def replan(
    previous: ClusterPlan,
    sessions: Sequence[SessionSpec],
    profiles: Mapping[tuple[str, str], BatchingProfile],
    gpu_types: Sequence[GpuType],
    options: HarpagonOptions | None = None,
) -> ClusterPlan:
    """This epoch's plan from the previous one, with the moves that get there."""
    options = options or HarpagonOptions()
    planner = ConfigPlanner(profiles, gpu_types, options)
    by_name = {s.name: s for s in sessions}
    configs = {s.name: planner.configure(s) for s in sessions}
    old_dedicated, old_shared = _classify(previous)
    next_id = _next_index(previous)

    def fresh_id() -> str:
        nonlocal next_id
        next_id += 1
        return f"gpu-{next_id - 1}"

    gpus: list[PlannedGpu] = []
    moves: list[Move] = []
    # 1. Dedicated GPUs, kept per (session, type, batch) up to the new count.
    for name, config in configs.items():
        for tier in config.tiers:
            key = (name, tier.gpu_type, tier.batch)
            old = old_dedicated.pop(key, [])
            kept, surplus = old[: tier.gpus], old[tier.gpus :]
            if surplus:
                old_dedicated[key] = surplus
            fresh = dedicated_gpus(config.session, tier, planner, tier.gpus)
            for gpu, same in zip(kept, fresh, strict=False):  # same GPU, this epoch's spec
                gpus.append(PlannedGpu(gpu.gpu_id, same.cost, same.plan))
            for gpu in fresh[len(kept) :]:
                gpu = PlannedGpu(fresh_id(), gpu.cost, gpu.plan)
                gpus.append(gpu)
                moves.append(Move(name, None, gpu.gpu_id, tier.throughput_rps))
    for (name, _, _), stopped in sorted(old_dedicated.items(), key=lambda kv: kv[0]):
        moves.extend(Move(name, g.gpu_id, None, g.plan.allocations[0].rate_rps) for g in stopped)
    # 2. Residual shares stay, scaled; overloaded GPUs evict their cheapest shares.
    old_rates: dict[str, float] = {}
    for gpu in old_shared:
        for a in gpu.plan.allocations:
            old_rates[a.session.name] = old_rates.get(a.session.name, 0.0) + a.rate_rps
    packing = Packing(gpu_types, options.price)
    node_ids: dict[tuple[str, int], str] = {}
    pending: list[Item] = []
    unplaced: list[Infeasible] = []
    for gpu in old_shared:
        staying: list[Item] = []
        for a in gpu.plan.allocations:
            name = a.session.name
            if name not in configs or configs[name].residual_rps <= _EPS:
                moves.append(Move(name, gpu.gpu_id, None, a.rate_rps))
                continue
            rate = a.rate_rps * configs[name].residual_rps / old_rates[name]
            items = residual_items(by_name[name], rate, by_name[name].slo_ms, planner)
            if isinstance(items, Infeasible):
                unplaced.append(items)
                continue
            for item in items:
                item.origin = gpu.gpu_id
            fits_here = len(items) == 1 and gpu.plan.gpu_type in items[0].per_type
            (staying if fits_here else pending).extend(items)
        staying, evicted = _evict(staying, gpu, planner)
        pending.extend(evicted)
        if staying:
            duty = _feasible_duty(staying, gpu, planner)
            i = packing.seed(gpu.plan.gpu_type, staying, duty, gpu.plan.memory_mib)
            node_ids[(gpu.plan.gpu_type, i)] = gpu.gpu_id
    # 3. New residuals, then evicted shares, packed best fit; then consolidation.
    for name, config in configs.items():
        if config.residual_rps > _EPS and name not in old_rates:
            items = residual_items(
                by_name[name], config.residual_rps, by_name[name].slo_ms, planner
            )
            if isinstance(items, Infeasible):
                unplaced.append(items)
            else:
                pending.extend(items)
    for item in sorted(pending, key=lambda it: (-_cost(it), it.session.name)):
        packing.insert(item)
    packing.consolidate()
    for nodes, i in packing.live():
        gpu_id = node_ids.get((nodes.gpu.name, i)) or fresh_id()
        gpus.append(PlannedGpu(gpu_id, nodes.price, node_plan(nodes, i)))
        for item in nodes.items[i]:
            if item.origin != gpu_id:
                moves.append(Move(item.session.name, item.origin, gpu_id, item.rate))
    return ClusterPlan(tuple(gpus), tuple(unplaced), {}, tuple(moves))


def _classify(
    plan: ClusterPlan,
) -> tuple[dict[tuple[str, str, int], list[PlannedGpu]], list[PlannedGpu]]:
    """Dedicated GPUs (one share running back to back) by key, and the shared ones."""
    dedicated: dict[tuple[str, str, int], list[PlannedGpu]] = {}
    shared: list[PlannedGpu] = []
    for gpu in plan.gpus:
        allocs = gpu.plan.allocations
        full = (
            allocs
            and abs(allocs[0].rate_rps * allocs[0].batch_latency_ms - allocs[0].batch * 1000.0)
            < 1e-6 * allocs[0].batch * 1000.0
        )
        if len(allocs) == 1 and full:
            key = (allocs[0].session.name, gpu.plan.gpu_type, allocs[0].batch)
            dedicated.setdefault(key, []).append(gpu)
        elif allocs:
            shared.append(gpu)
    return dedicated, shared


def _next_index(plan: ClusterPlan) -> int:
    """One past the largest numeric suffix of ``gpu-N`` ids (new GPUs never reuse an id)."""
    suffixes = (g.gpu_id.rsplit("-", 1)[-1] for g in plan.gpus)
    numbers = [int(x) for x in suffixes if x.isdigit()]
    return max(numbers, default=-1) + 1


def _cost(item: Item) -> float:
    """GPU time a share takes alone: what moving it costs the target."""
    return min(f.occupancy for f in item.per_type.values())


def _check(items: Sequence[Item], gpu: PlannedGpu, planner: ConfigPlanner) -> GpuPlan | Infeasible:
    shares = [(it.session, it.rate) for it in items]
    capacity = next(g.memory_mib for g in planner.gpu_types if g.name == gpu.plan.gpu_type)
    return plan_shares(shares, planner.profiles, gpu.plan.gpu_type, capacity)


def _evict(
    items: list[Item], gpu: PlannedGpu, planner: ConfigPlanner
) -> tuple[list[Item], list[Item]]:
    """Drop the cheapest shares until the GPU is not overloaded; one eviction if one suffices."""
    evicted: list[Item] = []
    while items and isinstance(_check(items, gpu, planner), Infeasible):
        by_cost = sorted(items, key=lambda it: (_cost(it), it.session.name))
        single = next(
            (
                it
                for it in by_cost
                if isinstance(_check([x for x in items if x is not it], gpu, planner), GpuPlan)
            ),
            None,
        )
        victim = single or by_cost[0]
        items = [x for x in items if x is not victim]
        evicted.append(victim)
    return items, evicted


def _feasible_duty(items: Sequence[Item], gpu: PlannedGpu, planner: ConfigPlanner) -> float:
    """The kept GPU's new duty cycle: ``plan_shares``'s answer at the new rates."""
    plan = _check(items, gpu, planner)
    if not isinstance(plan, GpuPlan):  # _evict left only feasible sets
        raise AssertionError(f"kept GPU {gpu.gpu_id} is overloaded: {plan.message()}")
    return plan.duty_cycle_ms
