"""The merge scan's two evaluation strategies agree exactly, and the early exit is sound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.planning import scan as scan_module
from lab.planning.bounds import CostFloor
from lab.planning.exact import exact_pack
from lab.planning.merge import Packing, default_orders, merge_best
from lab.planning.options import GpuType, HarpagonOptions
from lab.planning.packing import pack, residual_items
from lab.planning.saturate import ConfigPlanner
from planner import SessionSpec
from predictor.batching import BatchingProfile

GPU = "titanx"
TYPES = [GpuType(GPU, 12288), GpuType("t4", 6000, cost=0.6)]
PROFILES = {
    (f"m{i}", gpu): BatchingProfile.linear(f"m{i}", gpu, a * k, b * k, memory_mib=mem)
    for i, (a, b, mem) in enumerate(
        [(0.8, 4, 900), (2.0, 10, 2500), (3.5, 20, 4000), (1.2, 25, 1500), (5.0, 8, 5200)]
    )
    for gpu, k in ((GPU, 1.0), ("t4", 1.7))
}
session_st = st.builds(
    SessionSpec,
    name=st.just("x"),
    model=st.sampled_from([f"m{i}" for i in range(5)]),
    slo_ms=st.sampled_from([80.0, 120.0, 200.0, 400.0]),
    rate_rps=st.floats(1.0, 300.0),
)


def _items(sessions: list[SessionSpec], options: HarpagonOptions, types=TYPES):
    planner = ConfigPlanner(PROFILES, types, options)
    items = []
    for i, s in enumerate(sessions):
        s = SessionSpec(f"s{i}", s.model, s.slo_ms, s.rate_rps)
        config = planner.configure(s)
        if config.residual_rps > 0:
            parts = residual_items(s, config.residual_rps, s.slo_ms, planner)
            if isinstance(parts, list):
                items.extend(parts)
    return items


@settings(max_examples=25, deadline=None)
@given(
    st.lists(session_st, min_size=1, max_size=30),
    st.sampled_from([HarpagonOptions(), HarpagonOptions(cost_per_gpu_type=True)]),
)
def test_scalar_and_vector_scans_return_identical_candidates(sessions, options) -> None:
    """At every step of a best-fit pass (and of consolidation), both strategies agree."""
    items = _items(sessions, options)
    packing = Packing(TYPES, options.price)
    for order in default_orders(TYPES, options.price).values():
        for item in sorted(items, key=order):
            for t, fit in item.per_type.items():
                nodes = packing.types[t]
                for banned in (set(), {0}):
                    if nodes.n:
                        vector = scan_module.scan_vector(nodes, item.rate, fit, banned)
                        scalar = scan_module.scan_scalar(nodes, item.rate, fit, banned)
                        assert scalar == vector
            packing.insert(item)
    packing.consolidate()


@pytest.mark.parametrize("threshold", [0, 10**9], ids=["always-vector", "always-scalar"])
def test_whole_plans_do_not_depend_on_the_strategy(monkeypatch, threshold: int) -> None:
    sessions = [
        SessionSpec(f"s{i}", f"m{i % 5}", [80.0, 120.0, 200.0, 400.0][i % 4], 3.0 + 7.3 * i)
        for i in range(60)
    ]
    reference = pack(sessions, PROFILES, TYPES, HarpagonOptions(cost_per_gpu_type=True))
    monkeypatch.setattr(scan_module, "SCALAR_MAX_NODES", threshold)
    assert pack(sessions, PROFILES, TYPES, HarpagonOptions(cost_per_gpu_type=True)) == reference


LOW_RATE = st.builds(
    SessionSpec,
    name=st.just("x"),
    model=st.sampled_from([f"m{i}" for i in range(5)]),
    slo_ms=st.sampled_from([80.0, 120.0, 200.0, 400.0]),
    rate_rps=st.floats(1.0, 40.0),
)


@settings(max_examples=20, deadline=None)
@given(st.lists(LOW_RATE, min_size=1, max_size=7))
def test_cost_floor_never_exceeds_the_optimum(sessions) -> None:
    sessions = [SessionSpec(f"s{i}", s.model, s.slo_ms, s.rate_rps) for i, s in enumerate(sessions)]
    types = TYPES[:1]
    items = _items(sessions, HarpagonOptions(), types)
    exact = exact_pack(sessions, PROFILES, types)
    if exact is None or len(items) != len(sessions):
        return  # the exact solver packs whole sessions only
    floor_price, floor_count = CostFloor(items, types, HarpagonOptions().price).value()
    assert floor_count <= exact.gpu_count
    assert floor_price <= exact.cost + 1e-6


def test_early_exit_skips_the_other_orders_once_the_floor_is_reached() -> None:
    # Two small sessions that share one GPU: the first order is already optimal.
    sessions = [SessionSpec("a", "m0", 200.0, 20.0), SessionSpec("b", "m1", 200.0, 10.0)]
    calls: list[str] = []

    def counted(name: str, key):
        def wrapped(item):
            calls.append(name)
            return key(item)

        return wrapped

    orders = {
        name: counted(name, key)
        for name, key in default_orders(TYPES[:1], HarpagonOptions().price).items()
    }
    items = _items(sessions, HarpagonOptions(), TYPES[:1])
    best = merge_best(items, TYPES[:1], HarpagonOptions().price, orders)
    assert best.cost() == (1.0, 1)
    assert set(calls) == {"nexus_occupancy"}
