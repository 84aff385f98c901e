"""The vectorised ``evaluate`` against a plain per-GPU reference on random tables.

``evaluate`` takes shortcuts for speed (broadcast per-type values on one-type
clusters, a ``(nodes, width)`` grid when nodes are alike, curves evaluated only on
shared GPUs, reasons assigned in reverse precedence). The reference below spells
the training rules of ``extender.core.rules`` and ``extender.core.cost`` out one
GPU at a time with the scalar curve, so any shortcut that changes a decision
(feasibility, main reason, node cost, chosen GPUs) fails here.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
from extender_builders import A100, H100

from extender.core import (
    CostPolicy,
    DecisionContext,
    GpuObservation,
    GpuSpec,
    GpuTable,
    InterferenceCurve,
    NodeSpec,
    Placement,
    Purpose,
    Reason,
    Workload,
    choose,
    evaluate,
    parse_demand,
    resolve_demand,
)

NOW_SECONDS = 100.0
STALENESS_SECONDS = 10.0


@dataclass(frozen=True)
class Case:
    """One random scenario: cluster shape, policy and pod."""

    seed: int
    uniform: bool
    types: tuple[str, ...]
    gain_percent: float | None
    cap_percent: float | None


def build_table(case: Case, rng: random.Random) -> GpuTable:
    """Random nodes, training and serving placements, fresh and stale observations."""
    nodes = []
    width = rng.choice([1, 2, 4, 8])
    for i in range(rng.randint(1, 25)):
        count = width if case.uniform else rng.randint(0, 8)
        product = rng.choice(case.types)
        memory = rng.choice([16384, 40960, 81920])
        nodes.append(NodeSpec(f"n{i}", tuple(GpuSpec(g, f"G{i}-{g}", product, memory)
                                             for g in rng.sample(range(count), count))))
    table = GpuTable.build(nodes)
    for k in range(rng.randint(0, 120)):
        spec = rng.choice(nodes)
        if not spec.gpus:
            continue
        if rng.random() < 0.15:
            table.observe(spec.name, [
                GpuObservation(g.index, rng.uniform(0, 150), rng.uniform(0, 40000),
                               rng.choice([85.0, 95.0, 100.0])) for g in spec.gpus])
            continue
        serving = rng.random() < 0.1
        count = 1 if serving else rng.randint(1, len(spec.gpus))
        indices = tuple(g.index for g in rng.sample(spec.gpus, count))
        table.place(Placement(f"u{k}", f"ns/p{k}", spec.name, indices, rng.uniform(1, 90),
                              rng.uniform(100, 20000),
                              Workload.INFERENCE if serving else Workload.TRAINING),
                    rng.choice([None, 90.0, 99.0]))
    return table


def curve(policy: CostPolicy, gpu_type: str, util_percent: float) -> float:
    return policy.curve_for(gpu_type)(util_percent)


def load(table: GpuTable, row: int, reserved: float, observed: float, since: float) -> float:
    fresh = NOW_SECONDS - table.observed_at[row] <= STALENESS_SECONDS
    return max(reserved, observed + since) if fresh and not math.isnan(observed) else reserved


def reference(table: GpuTable, names: list[str], by_type: dict[str, tuple[float, float]],
              need: int, policy: CostPolicy) -> dict[str, tuple[Reason | None, float, list[int]]]:
    """Per known node: (main reason or None, node cost or inf, chosen rows)."""
    out = {}
    for name in names:
        if name not in table.node_index:
            continue
        verdicts = []
        for row in table.node_rows(name):
            gpu_type = table.type_names[table.type_id[row]]
            cap = float(table.capacity_mib[row])
            used = load(table, row, table.reserved_mib[row], table.observed_mib[row],
                        table.since_mib[row])
            util = load(table, row, table.reserved_util[row], table.observed_util[row],
                        table.since_util[row])
            jobs, held = int(table.training_count[row]), int(table.training_width[row])
            reason = None
            if gpu_type not in by_type:
                reason = Reason.DEMAND_UNKNOWN
            else:
                job_util, job_mib = by_type[gpu_type]
                before = held / (1 + curve(policy, gpu_type, util) if jobs >= 2 else 1.0)
                after = (held + 1) / (1 + curve(policy, gpu_type, util + job_util))
                gain = after / before - 1 if jobs > 0 else math.inf
                rules = [
                    (cap < job_mib, Reason.GPU_MEMORY_TOO_SMALL),
                    (table.serving_count[row] > 0, Reason.WORKLOAD_CONFLICT),
                    (cap - used < job_mib, Reason.INSUFFICIENT_GPU_MEMORY),
                    (table.pod_count[row] >= policy.max_pods_per_gpu, Reason.COLOCATION_LIMIT),
                    (policy.min_colocation_gain_percent is not None
                     and gain <= policy.min_colocation_gain_percent / 100,
                     Reason.COLOCATION_SLOWDOWN),
                    (policy.max_colocated_util_percent is not None and jobs > 0
                     and util + job_util > policy.max_colocated_util_percent,
                     Reason.COLOCATION_SLOWDOWN),
                ]
                reason = next((r for hit, r in rules if hit), None)
            cost = math.inf
            if reason is None:
                job_util, job_mib = by_type[gpu_type]
                cost = (policy.w_mem * (used + job_mib) / max(cap, 1.0)
                        + policy.w_util * curve(policy, gpu_type, util + job_util))
            verdicts.append((cost, row, reason))
        fits = sorted((c, r) for c, r, why in verdicts if why is None)
        if len(verdicts) >= need and len(fits) >= need:
            out[name] = (None, sum(c for c, _ in fits[:need]) / need,
                         sorted(r for _, r in fits[:need]))
        elif len(verdicts) >= need:
            reasons = [why for _, _, why in verdicts if why is not None]
            main = max(Reason, key=lambda r: (reasons.count(r), -r.code))
            out[name] = (main, math.inf, [])
        else:
            out[name] = (Reason.TOO_FEW_GPUS if verdicts else Reason.NO_GPU_INVENTORY,
                         math.inf, [])
    return out


CASES = [Case(seed, uniform, types, gain, cap)
         for seed in range(6)
         for uniform, types, gain, cap in [
             (True, (A100,), 0.0, None),
             (False, (A100, H100), 10.0, 150.0),
             (True, (A100, H100), None, 80.0),
             (False, (A100,), -20.0, None),
         ]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: (
    f"seed{c.seed}-{'uniform' if c.uniform else 'ragged'}-{len(c.types)}types"
    f"-gain{c.gain_percent}-cap{c.cap_percent}"))
def test_evaluate_matches_per_gpu_reference(case: Case) -> None:
    rng = random.Random(case.seed)
    table = build_table(case, rng)
    policy = CostPolicy(
        w_mem=rng.choice([1.0, 0.5]), curves={A100: InterferenceCurve(0.4, 0.7, 1.3)},
        max_pods_per_gpu=rng.choice([2, 8]), staleness_seconds=STALENESS_SECONDS,
        min_colocation_gain_percent=case.gain_percent,
        max_colocated_util_percent=case.cap_percent)
    for k in range(8):
        need = rng.choice([1, 1, 2, 3])
        pod = {"metadata": {"name": f"q{k}", "namespace": "ns", "uid": f"q{k}", "annotations": {
                   "tandem.io/gpu-util": str(rng.uniform(1, 100)),
                   "tandem.io/gpu-mem-mib": str(rng.uniform(100, 30000))}},
               "spec": {"containers": [{"name": "c", "resources": {
                   "limits": {"tandem.io/gpu": str(need)}}}]}}
        # An unknown type (no demand) on some calls: its GPUs fail DEMAND_UNKNOWN.
        types = table.type_names[:1] if rng.random() < 0.3 else table.type_names
        demand = resolve_demand(parse_demand(pod), types, None)
        by_type = {t: (d.util_percent, d.mem_mib) for t, d in demand.by_type.items()}
        names = rng.sample([*table.node_names, "ghost"], rng.randint(1, len(table.node_names)))
        expected = reference(table, names, by_type, need, policy)
        ev = evaluate(table, names, demand, DecisionContext(policy, NOW_SECONDS))
        for position, name in enumerate(names):
            if name not in expected:
                assert ev.rejections[name].reason is Reason.UNKNOWN_NODE
                continue
            reason, cost, rows = expected[name]
            got_reason = ev.rejections[name].reason if name in ev.rejections else None
            assert got_reason is reason, (name, got_reason, reason)
            assert ev.chosen_rows(position) == rows
            if math.isfinite(cost):
                assert ev.node_cost[position] == pytest.approx(cost, rel=1e-12)
                placed = choose(ev, position, "uid", "ns/p")
                assert placed is not None
                assert sorted(table.row_of(name, i) for i in placed.gpu_indices) == rows
            else:
                assert ev.node_cost[position] == math.inf
        filtered = evaluate(table, names, demand,
                            DecisionContext(policy, NOW_SECONDS), Purpose.FILTER)
        assert filtered.feasible_names() == [n for n in names
                                             if n in expected and expected[n][0] is None]
