"""Squishy bin packing, Harpagon's examples, the exact yardstick and query splits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.planning.bounds import gpu_lower_bound
from lab.planning.exact import exact_pack
from lab.planning.options import GpuType, HarpagonOptions
from lab.planning.packing import pack
from lab.planning.query import (
    QueryError,
    QueryModule,
    QuerySpec,
    module_throughput_table,
    split_latency,
)
from lab.planning.saturate import ConfigPlanner
from planner import GpuPlan, SessionSpec, plan_shares
from predictor.batching import BatchingProfile

GPU = "titanx"
TABLE2 = {
    "A": [[4, 50], [8, 75], [16, 100]],
    "B": [[4, 50], [8, 90], [16, 125]],
    "C": [[4, 60], [8, 95], [16, 125]],
}


def table2_profiles() -> dict[tuple[str, str], BatchingProfile]:
    return {
        (m, GPU): BatchingProfile.from_table(m, GPU, r, memory_mib=500) for m, r in TABLE2.items()
    }


TITANX = [GpuType(GPU, 12288)]


def test_table2_low_load_packs_a_with_b_and_c_alone() -> None:
    sessions = [
        SessionSpec("a", "A", 200, 64),
        SessionSpec("b", "B", 250, 32),
        SessionSpec("c", "C", 250, 32),
    ]
    result = pack(sessions, table2_profiles(), TITANX)
    groups = sorted(sorted(a.session.name for a in g.plan.allocations) for g in result.gpus)
    assert groups == [["a", "b"], ["c"]]


def test_heavy_session_is_split_over_several_gpus() -> None:
    result = pack([SessionSpec("a", "A", 200, 400)], table2_profiles(), TITANX)
    shares = [g.plan.allocations[0] for g in result.gpus]
    assert [s.batch for s in shares[:2]] == [16, 16]
    assert sum(s.rate_rps for s in shares) == pytest.approx(400)
    assert result.gpu_count == 3


# Harpagon Table I (durations in ms); fixed batch sizes as in the paper.
HARP = {
    "M1": [[2, 160], [4, 200], [8, 320]],
    "M3": [[2, 100], [8, 250], [32, 800]],
}
HARP_PROFILES = {(m, "g"): BatchingProfile.from_table(m, "g", rows) for m, rows in HARP.items()}
HARP_BATCHES = {(m, "g"): [int(r[0]) for r in rows] for m, rows in HARP.items()}


def _config(model: str, slo_ms: float, rate: float, options: HarpagonOptions):
    planner = ConfigPlanner(HARP_PROFILES, [GpuType("g", 1000)], options, HARP_BATCHES)
    return planner.configure(SessionSpec("s", model, slo_ms, rate))


@pytest.mark.parametrize(
    ("options", "tiers", "residual", "dummy", "cost"),
    [
        (HarpagonOptions(), [(8, 6)], 6.0, 0.0, 6.3),
        (HarpagonOptions(batch_aware_dispatch=True), [(32, 4)], 38.0, 0.0, 5.9),
        (
            HarpagonOptions(batch_aware_dispatch=True, multi_tuple=True),
            [(32, 4), (8, 1)],
            6.0,
            0,
            5.3,
        ),
        (HarpagonOptions(True, True, True), [(32, 5)], 0.0, 2.0, 5.0),
    ],
    ids=["S1-round-robin", "S2-batch-dispatch", "S3-multi-tuple", "S4-dummy"],
)
def test_harpagon_table2_m3(options, tiers, residual, dummy, cost) -> None:
    config = _config("M3", 1000, 198, options)
    assert [(t.batch, t.gpus) for t in config.tiers] == tiers
    assert config.residual_rps == pytest.approx(residual)
    assert config.dummy_rps == pytest.approx(dummy)
    # Harpagon's fractional cost: the residual at batch 2 (20 rps per GPU).
    assert sum(t.gpus for t in config.tiers) + config.residual_rps / 20 == pytest.approx(cost)


@pytest.mark.parametrize(
    ("batch_aware", "batch", "gpus"), [(False, 4, 5), (True, 8, 4)], ids=["round-robin", "batch"]
)
def test_harpagon_example1_m1(batch_aware: bool, batch: int, gpus: int) -> None:
    config = _config("M1", 400, 100, HarpagonOptions(batch_aware_dispatch=batch_aware))
    assert [(t.batch, t.gpus) for t in config.tiers] == [(batch, gpus)]
    assert config.tiers[0].worst_case_ms <= 400 + 1e-9


def test_cost_per_gpu_type_prefers_cheaper_throughput() -> None:
    profiles = {
        ("M", "big"): BatchingProfile.linear("M", "big", 1.0, 5.0),
        ("M", "small"): BatchingProfile.linear("M", "small", 2.0, 5.0),
    }
    types = [GpuType("big", 16000, cost=4.0), GpuType("small", 16000, cost=1.0)]
    session = [SessionSpec("s", "M", 200, 2000)]
    by_count = pack(session, profiles, types, HarpagonOptions())
    by_cost = pack(session, profiles, types, HarpagonOptions(cost_per_gpu_type=True))
    assert {g.plan.gpu_type for g in by_count.gpus} == {"big"}
    assert by_cost.total_cost < sum(4.0 for _ in by_count.gpus)
    assert by_cost.total_cost <= by_count.total_cost * 4


def test_figure4_latency_split_flips_with_gamma() -> None:
    fig3 = {"X": [(40, 200), (50, 250), (60, 300)], "Y": [(40, 300), (50, 400), (60, 500)]}
    fn = module_throughput_table(fig3)
    expected = {0.1: ((60, 40), 272.7), 1: ((50, 50), 153.8), 10: ((40, 60), 40.0)}
    query = QuerySpec("q", 100, 1000, (QueryModule("x", "X"), QueryModule("y", "Y", {"x": 1.0})))
    for gamma, (budgets, avg) in expected.items():
        split = split_latency(query.with_fanouts({("x", "y"): gamma}), fn, step_ms=10)
        assert (split.budgets_ms["x"], split.budgets_ms["y"]) == budgets
        assert 1000 / split.total_gpus == pytest.approx(avg, abs=0.05)


def test_fork_join_split_keeps_every_path_within_the_slo() -> None:
    fn = module_throughput_table({"X": [(40, 200), (60, 300)], "Y": [(40, 300), (60, 500)]})
    query = QuerySpec(
        "q",
        300,
        100,
        (
            QueryModule("a", "X"),
            QueryModule("b", "Y", {"a": 1}),
            QueryModule("c", "Y", {"a": 2}),
            QueryModule("d", "X", {"b": 1, "c": 1}),
        ),
    )
    split = split_latency(query, fn, step_ms=10)
    for path in (["a", "b", "d"], ["a", "c", "d"]):
        assert sum(split.budgets_ms[m] for m in path) <= 300
    assert split.rates_rps["d"] == 300


@pytest.mark.parametrize(
    "modules",
    [
        (QueryModule("a", "X", {"b": 1}), QueryModule("b", "X", {"a": 1})),
        (QueryModule("a", "X", {"zz": 1}),),
    ],
    ids=["cycle", "unknown-parent"],
)
def test_bad_queries_are_rejected(modules) -> None:
    with pytest.raises(QueryError):
        QuerySpec("q", 100, 1, modules)


LINEAR = {
    (f"m{i}", GPU): BatchingProfile.linear(f"m{i}", GPU, a, b, memory_mib=1000)
    for i, (a, b) in enumerate([(0.8, 4), (2.0, 10), (3.5, 20), (1.2, 25), (5.0, 8)])
}
session_st = st.builds(
    SessionSpec,
    name=st.just("x"),
    model=st.sampled_from([m for m, _ in LINEAR]),
    slo_ms=st.sampled_from([80.0, 120.0, 200.0, 400.0]),
    rate_rps=st.floats(1.0, 600.0),
)


def _named(sessions):
    return [SessionSpec(f"s{i}", s.model, s.slo_ms, s.rate_rps) for i, s in enumerate(sessions)]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(session_st, min_size=1, max_size=12),
    st.sampled_from([HarpagonOptions(), HarpagonOptions.harpagon()]),
)
def test_every_plan_meets_every_slo_rate_and_memory(sessions, options) -> None:
    sessions = _named(sessions)
    result = pack(sessions, LINEAR, TITANX, options)
    served = {s.name: 0.0 for s in sessions}
    for gpu in result.gpus:
        plan = gpu.plan
        assert plan.memory_mib <= 12288
        assert sum(a.batch_latency_ms for a in plan.allocations) <= plan.duty_cycle_ms + 1e-6
        for a in plan.allocations:
            assert a.latency_ms <= a.session.slo_ms + 1e-6
            assert a.batch >= a.rate_rps * plan.duty_cycle_ms / 1000 - 1e-6
            served[a.session.name] += a.rate_rps
        if len(plan.allocations) > 1:  # shared GPUs re-check through the admission function
            again = plan_shares(
                [(a.session, a.rate_rps) for a in plan.allocations], LINEAR, GPU, 12288
            )
            assert isinstance(again, GpuPlan)
    unplaced = {u.session for u in result.unplaced}
    for s in sessions:
        if s.name not in unplaced:
            assert served[s.name] >= s.rate_rps + result.dummy_rps.get(s.name, 0) - 1e-6


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.builds(
            SessionSpec,
            name=st.just("x"),
            model=st.sampled_from([m for m, _ in LINEAR]),
            slo_ms=st.sampled_from([80.0, 120.0, 200.0, 400.0]),
            rate_rps=st.floats(1.0, 59.9),  # whole sessions: no dedicated GPUs
        ),
        min_size=1,
        max_size=7,
    )
)
def test_greedy_is_never_better_than_exact(sessions) -> None:
    sessions = _named(sessions)
    exact = exact_pack(sessions, LINEAR, TITANX)
    greedy = pack(sessions, LINEAR, TITANX)
    if (
        exact is not None
        and not greedy.unplaced
        and all(len(g.plan.allocations) and g.plan.occupancy < 1 for g in greedy.gpus)
    ):
        assert greedy.gpu_count >= exact.gpu_count


HEAVY = {
    **LINEAR,
    ("big", GPU): BatchingProfile.linear("big", GPU, 1.5, 12, memory_mib=11500),
    ("half", GPU): BatchingProfile.linear("half", GPU, 0.9, 6, memory_mib=7000),
}
heavy_session_st = st.builds(
    SessionSpec,
    name=st.just("x"),
    model=st.sampled_from(sorted(m for m, _ in HEAVY)),
    slo_ms=st.sampled_from([80.0, 120.0, 200.0, 400.0]),
    rate_rps=st.floats(1.0, 60.0),
)


@settings(max_examples=25, deadline=None)
@given(st.lists(heavy_session_st, min_size=1, max_size=7))
def test_lower_bound_never_exceeds_the_optimum_or_the_greedy(sessions) -> None:
    sessions = _named(sessions)
    bound = gpu_lower_bound(sessions, HEAVY, TITANX)
    greedy = pack(sessions, HEAVY, TITANX)
    exact = exact_pack(sessions, HEAVY, TITANX)
    assert bound.throughput_only <= bound.gpus
    if not greedy.unplaced:
        assert bound.gpus <= greedy.gpu_count
    if exact is not None:
        assert bound.gpus <= exact.gpu_count
