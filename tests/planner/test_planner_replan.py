"""Incremental re-planning: kept placements, evictions, and the make-before-break invariant."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lab.planning.options import GpuType
from lab.planning.packing import ClusterPlan, pack
from lab.planning.replan import replan
from planner import GpuPlan, SessionSpec, plan_shares
from predictor.batching import BatchingProfile

GPU = "titanx"
CAPACITY = 12288
TYPES = [GpuType(GPU, CAPACITY)]
PROFILES = {
    (f"m{i}", GPU): BatchingProfile.linear(f"m{i}", GPU, a, b, memory_mib=mem)
    for i, (a, b, mem) in enumerate(
        [(0.8, 4, 1000), (2.0, 10, 3000), (3.5, 20, 500), (1.2, 25, 7000), (5.0, 8, 2000)]
    )
}


def _hosts(plan: ClusterPlan) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for g in plan.gpus:
        for a in g.plan.allocations:
            out.setdefault(a.session.name, set()).add(g.gpu_id)
    return out


def assert_valid_transition(old: ClusterPlan, new: ClusterPlan, sessions) -> None:
    """End state feasible; old+new models fit together per GPU; moves explain every change."""
    served = {s.name: 0.0 for s in sessions}
    for g in new.gpus:
        assert g.plan.memory_mib <= CAPACITY
        for a in g.plan.allocations:
            assert a.latency_ms <= a.session.slo_ms + 1e-6
            served[a.session.name] += a.rate_rps
        if len(g.plan.allocations) > 1:
            again = plan_shares(
                [(a.session, a.rate_rps) for a in g.plan.allocations], PROFILES, GPU, CAPACITY
            )
            assert isinstance(again, GpuPlan), again
    unplaced = {u.session for u in new.unplaced}
    for s in sessions:
        if s.name not in unplaced:
            assert served[s.name] >= s.rate_rps - 1e-6
    # Make-before-break: a GPU holds its old and its new models at once.
    by_id: dict[str, dict[str, float]] = {}
    for plan in (old, new):
        for g in plan.gpus:
            models = by_id.setdefault(g.gpu_id, {})
            for a in g.plan.allocations:
                models[a.session.name] = PROFILES[(a.session.model, GPU)].memory_mib
    for gpu_id, models in by_id.items():
        assert sum(models.values()) <= CAPACITY + 1e-6, gpu_id
    # Every change of host is a move, and every move's target serves the session.
    old_hosts, new_hosts = _hosts(old), _hosts(new)
    sources = {(m.session, m.source) for m in new.moves if m.source}
    targets = {(m.session, m.target) for m in new.moves if m.target}
    for name in set(old_hosts) | set(new_hosts):
        before, after = old_hosts.get(name, set()), new_hosts.get(name, set())
        assert all((name, g) in targets for g in after - before)
        assert all((name, g) in sources for g in before - after)
    for name, target in targets:
        assert target in new_hosts[name]


SESSIONS = [
    SessionSpec("a", "m0", 100, 120.0),
    SessionSpec("b", "m1", 200, 40.0),
    SessionSpec("c", "m2", 400, 25.0),
    SessionSpec("d", "m3", 200, 60.0),
    SessionSpec("e", "m4", 120, 15.0),
    SessionSpec("f", "m0", 400, 900.0),
]


def test_unchanged_workload_moves_nothing() -> None:
    old = pack(SESSIONS, PROFILES, TYPES)
    new = replan(old, SESSIONS, PROFILES, TYPES)
    assert new.moves == ()
    assert sorted(g.gpu_id for g in new.gpus) == sorted(g.gpu_id for g in old.gpus)


def test_removed_session_stops_and_added_session_starts() -> None:
    old = pack(SESSIONS, PROFILES, TYPES)
    sessions = [s for s in SESSIONS if s.name != "c"] + [SessionSpec("g", "m2", 300, 10.0)]
    new = replan(old, sessions, PROFILES, TYPES)
    assert {(m.session, m.target is None) for m in new.moves} >= {("c", True), ("g", False)}
    assert all(m.session in {"c", "g"} for m in new.moves)
    assert_valid_transition(old, new, sessions)


def test_heavier_session_gets_another_dedicated_gpu_and_keeps_the_old_ones() -> None:
    old = pack(SESSIONS, PROFILES, TYPES)
    sessions = [s if s.name != "f" else SessionSpec("f", "m0", 400, 1900.0) for s in SESSIONS]
    new = replan(old, sessions, PROFILES, TYPES)
    assert_valid_transition(old, new, sessions)
    kept = _hosts(old)["f"] & _hosts(new)["f"]
    assert kept  # the dedicated GPUs it had stay
    scratch = pack(sessions, PROFILES, TYPES)
    assert len(new.moves) < sum(len(g.plan.allocations) for g in scratch.gpus)


rates = st.lists(st.floats(0.3, 2.5), min_size=len(SESSIONS), max_size=len(SESSIONS))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(sorted(m for m, _ in PROFILES)), st.floats(2.0, 300.0)),
        min_size=2,
        max_size=10,
    ),
    st.lists(st.floats(0.2, 3.0), min_size=10, max_size=10),
    st.integers(0, 3),
)
def test_replans_never_overload_a_gpu_during_the_move(workload, factors, dropped) -> None:
    sessions = [SessionSpec(f"s{i}", m, 200.0, r) for i, (m, r) in enumerate(workload)]
    old = pack(sessions, PROFILES, TYPES)
    changed = [
        SessionSpec(s.name, s.model, s.slo_ms, s.rate_rps * f)
        for s, f in zip(sessions[dropped:], factors, strict=False)
    ] + [SessionSpec("new", "m2", 300.0, 20.0)]
    new = replan(old, changed, PROFILES, TYPES)
    assert_valid_transition(old, new, changed)
    # Shares (re)started somewhere never exceed what a fresh plan would place.
    scratch = pack(changed, PROFILES, TYPES)
    started = [m for m in new.moves if m.target is not None]
    assert len(started) <= sum(len(g.plan.allocations) for g in scratch.gpus)
