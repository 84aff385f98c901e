"""The fragmentation measure and the packing score in tandem's decision core (issue #41)."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.annotations import PodInputs
from contracts.gpus import GpuSpec
from extender.config.loader import ConfigError
from extender.config.schema import build_config
from extender.core import CostPolicy
from extender.core.choice import choose, decided_by
from extender.core.decide import DecisionContext, Purpose, evaluate
from extender.core.demand import JobDemand, resolve_demand
from extender.core.fragmentation import (
    Pod,
    Shape,
    Shapes,
    ShapeStats,
    fragmentation,
    placement_deltas,
)
from extender.core.packing import PackingInput, PackingPolicy, node_order
from extender.core.snapshot import NodeName, NodeSpec, Placement, PodUid
from extender.core.table import GpuTable


def brute_force(free, cpu, mem, weighted):
    """F from the definition, one shape and one GPU at a time."""
    total = sum(weighted.values())
    out = 0.0
    for shape, count in weighted.items():
        p = count / total
        gpus_free = [max(f, 0.0) for f in free]
        usable = [f for f in gpus_free if f >= shape.per_gpu] if shape.gpus else []
        fits = cpu >= shape.cpu and mem >= shape.mem and len(usable) >= shape.gpus > 0
        out += p * (sum(gpus_free) - (sum(usable) if fits else 0.0))
    return out


def test_fragmentation_matches_its_definition_on_random_states():
    rng = np.random.default_rng(7)
    weighted = {Shape(1, 500.0, 4.0, 8.0): 3.0, Shape(1, 1000.0, 8.0, 8.0): 5.0,
                Shape(2, 1000.0, 16.0, 32.0): 1.0, Shape(0, 0.0, 2.0, 2.0): 2.0,
                Shape(1, 250.0, 1.0, 1.0): 1.0}
    shapes = Shapes.of(weighted)
    free = rng.choice([0.0, 100.0, 250.0, 500.0, 750.0, 1000.0], size=(40, 4))
    cpu, mem = rng.integers(0, 20, 40).astype(float), rng.integers(0, 40, 40).astype(float)
    got = fragmentation(free, cpu, mem, shapes)
    want = [brute_force(free[i], cpu[i], mem[i], weighted) for i in range(40)]
    assert got == pytest.approx(want)


def test_one_gpu_deltas_equal_the_difference_of_whole_states():
    rng = np.random.default_rng(3)
    weighted = {Shape(1, 300.0, 2.0, 2.0): 2.0, Shape(1, 1000.0, 4.0, 4.0): 3.0,
                Shape(4, 1000.0, 8.0, 8.0): 1.0}
    shapes = Shapes.of(weighted, "volume")
    free = rng.choice([0.0, 300.0, 700.0, 1000.0], size=(12, 4))
    cpu, mem = rng.integers(0, 12, 12).astype(float), rng.integers(0, 12, 12).astype(float)
    pod = Pod(1, 300.0, 2.0, 2.0)
    deltas = placement_deltas(free, free >= 300.0, cpu, mem, shapes, pod)
    for n in range(12):
        for g in range(4):
            if not (free[n, g] >= 300.0 and cpu[n] >= 2 and mem[n] >= 2):
                assert deltas[n, g] == np.inf
                continue
            after = free[n:n + 1].copy()
            after[0, g] -= 300.0
            want = (fragmentation(after, cpu[n:n + 1] - 2, mem[n:n + 1] - 2, shapes)
                    - fragmentation(free[n:n + 1], cpu[n:n + 1], mem[n:n + 1], shapes))[0]
            assert deltas[n, g] == pytest.approx(want)


def test_a_cpu_only_pod_that_strands_a_nodes_gpus_costs_them():
    shapes = Shapes.of({Shape(1, 1000.0, 8.0, 0.0): 1.0})
    free = np.array([[1000.0, 1000.0], [1000.0, 1000.0]])
    # node 0 keeps 8 cores after the pod, node 1 would keep 4: its two GPUs are stranded
    deltas = placement_deltas(free, np.zeros((2, 2), bool), np.array([16.0, 12.0]),
                              np.zeros(2) + 100, shapes, Pod(0, 0.0, 8.0, 0.0))
    assert deltas[0, 0] == 0.0 and deltas[1, 0] == pytest.approx(2000.0)


def test_shape_stats_stay_bounded_and_round_trip():
    stats = ShapeStats(max_shapes=3, window=4)
    for milli in (100.0, 200.0, 100.0, 300.0, 400.0):
        stats.observe(Shape(1, milli))
    assert len(stats.counts) == 3 and Shape(1, 100.0) in stats.counts
    assert stats.counts[Shape(1, 100.0)] == 1.0  # halved after 4 pods
    again = ShapeStats.from_document(stats.document(), max_shapes=3, window=4)
    assert again.counts == stats.counts
    with pytest.raises(ValueError, match="bad shape row"):
        ShapeStats.from_document([[1.5, 100, 0, 0, 1]])


def node(name, gpus):
    return NodeSpec(NodeName(name), tuple(GpuSpec(i, "", "T4", 1000.0) for i in range(gpus)))


def demand(table, mem, gpus=1):
    return resolve_demand(JobDemand(gpus, PodInputs(util_percent=mem / 10, mem_mib=mem)),
                          table.type_names, None)


def test_the_core_packs_a_share_beside_another_instead_of_opening_a_gpu():
    table = GpuTable.build([node("a", 2), node("b", 2)], [Placement(
        PodUid("u0"), "x", NodeName("a"), (0,), util_percent=40.0, mem_mib=400.0)])
    shapes = Shapes.of({Shape(1, 400.0): 1.0, Shape(1, 1000.0): 1.0})
    context = DecisionContext(CostPolicy(), 0.0, packing=PackingInput(shapes))
    ev = evaluate(table, ["a", "b"], demand(table, 400.0), context, Purpose.SCORE)
    assert ev.scores() == [10, 0]
    placed = choose(ev, 0, "u1", "y")
    assert placed is not None and placed.gpu_indices == (0,)
    assert decided_by(ev, 0) in ("fit", "fragmentation")
    horus = evaluate(table, ["a", "b"], demand(table, 400.0), DecisionContext(CostPolicy(), 0.0))
    spread = choose(horus, 0, "u1", "y")  # Horus alone: the emptiest GPU
    assert spread is not None and spread.gpu_indices == (1,) and decided_by(horus, 0) is None


def test_a_node_whose_cpu_the_pod_would_exhaust_is_avoided():
    table = GpuTable.build([node("a", 2), node("b", 2)])
    shapes = Shapes.of({Shape(1, 1000.0, 8000.0, 0.0): 1.0})
    packing = PackingInput(shapes, cpu_free=np.array([9000.0, 64000.0]),
                           mem_free=np.array([1e6, 1e6]), pod_cpu=4000.0)
    ev = evaluate(table, ["a", "b"], demand(table, 1000.0),
                  DecisionContext(CostPolicy(), 0.0, packing=packing), Purpose.SCORE)
    assert ev.scores()[1] == 10 and decided_by(ev, 1) == "fragmentation"


def test_the_node_order_gathers_equal_placements_on_the_earlier_node():
    # Two empty nodes, equal in fragmentation and fit: the order decides, and with it off
    # the table's first node is taken.
    table = GpuTable.build([node("a", 2), node("b", 2)])
    shapes = Shapes.of({Shape(1, 1000.0): 1.0})
    order = np.array([0.9, 0.1])  # "b" first
    policy = CostPolicy(packing=PackingPolicy(w_order=0.05))
    ev = evaluate(table, ["a", "b"], demand(table, 400.0), DecisionContext(
        policy, 0.0, packing=PackingInput(shapes, node_order=order)), Purpose.SCORE)
    assert ev.scores() == [0, 10] and decided_by(ev, 1) == "fit"
    off = evaluate(table, ["a", "b"], demand(table, 400.0), DecisionContext(
        CostPolicy(packing=PackingPolicy(w_order=0.0)), 0.0,
        packing=PackingInput(shapes, node_order=order)), Purpose.SCORE)
    assert off.node_cost[0] == off.node_cost[1]
    # fragmentation still outweighs the order: "a" holds a 600 share, the 400 fills its GPU
    table.place(Placement(PodUid("u0"), "x", NodeName("a"), (0,), util_percent=60.0,
                          mem_mib=600.0))
    ev = evaluate(table, ["a", "b"], demand(table, 400.0), DecisionContext(
        policy, 0.0, packing=PackingInput(shapes, node_order=order)), Purpose.SCORE)
    assert ev.scores()[0] == 10


def test_node_order_is_a_stable_hash_of_the_names():
    names = [f"node-{i}" for i in range(200)]
    order = node_order(names)
    assert ((order >= 0) & (order < 1)).all() and len(set(order.tolist())) == 200
    assert node_order(names[::-1]).tolist() == order.tolist()[::-1]  # per name, not position
    # scattered: the first hundred names are not the first hundred in the order
    assert 30 < int((np.argsort(order)[:100] < 100).sum()) < 70


def test_packing_keys_are_checked():
    policy = build_config({"packing": {"w_fit": 2, "weighting": "count", "w_order": 1}}
                          ).policy.packing
    assert policy.w_fit == 2.0 and policy.weighting == "count" and policy.w_order == 1.0
    with pytest.raises(ConfigError, match="packing.w_order"):
        build_config({"packing": {"w_order": -0.5}})
    with pytest.raises(ConfigError, match="packing.weighting"):
        build_config({"packing": {"weighting": "size"}})
    with pytest.raises(ConfigError, match="packing.w_fragmentation"):
        build_config({"packing": {"w_fragmentation": -1}})
