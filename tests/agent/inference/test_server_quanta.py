"""Olympian quanta (agent.inference.quanta): token passing, policies, Q choice, segment grouping."""

from __future__ import annotations

import pytest

from agent.inference.quanta import (
    JobSpec,
    OverheadCurve,
    QuantaError,
    QuantaScheduler,
    choose_quantum_ms,
    group_segments,
    jain_index,
    weighted_share_errors,
)


def run_backlogged(
    sched: QuantaScheduler, segment_ms: float, segments: int, runnable: set[str] | None = None
) -> list[str]:
    """Run ``segments`` segments of equal cost among always-runnable jobs; returns the order."""
    order = []
    for _ in range(segments):
        name = sched.select(runnable if runnable is not None else set(sched.jobs()))
        assert name is not None
        sched.charge(name, segment_ms, segment_ms)
        order.append(name)
    return order


@pytest.mark.parametrize(
    "jobs",
    [
        pytest.param([JobSpec("a"), JobSpec("b")], id="two-equal"),
        pytest.param([JobSpec(f"j{i}") for i in range(5)], id="five-equal"),
    ],
)
def test_fair_policy_gives_equal_shares(jobs: list[JobSpec]) -> None:
    sched = QuantaScheduler(quantum_ms=1.0)
    for job in jobs:
        sched.register(job)
    run_backlogged(sched, 0.3, 3001)
    costs = sched.cumulative_cost_ms()
    assert jain_index(costs.values()) >= 0.999
    assert max(costs.values()) - min(costs.values()) <= 1.0 + 0.3  # within one quantum


@pytest.mark.parametrize(
    "weights",
    [
        pytest.param({"a": 2, "b": 1}, id="2:1"),
        pytest.param({"a": 1, "b": 2, "c": 3}, id="1:2:3"),
        pytest.param({"a": 10, "b": 1}, id="10:1"),
    ],
)
def test_weighted_policy_shares_follow_weights(weights: dict[str, int]) -> None:
    sched = QuantaScheduler(quantum_ms=1.0)
    for name, w in weights.items():
        sched.register(JobSpec(name, weight=w))
    run_backlogged(sched, 0.25, 4 * 660)
    errors = weighted_share_errors(sched.cumulative_cost_ms(), weights)
    assert all(abs(e) <= 0.02 for e in errors.values()), errors


def test_priority_serves_the_highest_runnable_class_and_equal_classes_fairly() -> None:
    sched = QuantaScheduler(quantum_ms=1.0)
    for name, prio in [("low", 0), ("high1", 5), ("high2", 5)]:
        sched.register(JobSpec(name, priority=prio))
    run_backlogged(sched, 0.5, 400)
    costs = sched.cumulative_cost_ms()
    assert costs["low"] == 0.0
    assert costs["high1"] == pytest.approx(costs["high2"], abs=1.0)
    # Once the high class has no work, the low job gets the GPU.
    assert run_backlogged(sched, 0.5, 4, runnable={"low"}) == ["low"] * 4


def test_higher_priority_arrival_takes_the_token_mid_quantum() -> None:
    sched = QuantaScheduler(quantum_ms=2.0)
    sched.register(JobSpec("low"))
    sched.register(JobSpec("high", priority=1))
    assert sched.select({"low"}) == "low"
    sched.charge("low", 0.5, 0.5)
    assert sched.select({"low", "high"}) == "high"


def test_turn_is_charged_measured_time_and_its_overshoot_is_debt() -> None:
    sched = QuantaScheduler(quantum_ms=1.0)
    sched.register(JobSpec("a"))
    sched.register(JobSpec("b"))
    assert sched.select({"a", "b"}) == "a"
    assert sched.charge("a", 0.7, 0.8) == []
    (record,) = sched.charge("a", 0.7, 2.2)  # measured, not profiled, ends the turn
    assert (record.profiled_ms, record.measured_ms) == (pytest.approx(1.4), pytest.approx(3.0))
    assert sched.debt_ms() == {"a": pytest.approx(2.0), "b": 0.0}
    # "a" owes two quanta: "b" runs three turns before "a" runs again.
    order = []
    for _ in range(4):
        name = sched.select({"a", "b"})
        order.append(name)
        sched.charge(name, 1.0, 1.0)
    assert order == ["b", "b", "b", "a"]


def test_a_job_running_alone_owes_nothing() -> None:
    sched = QuantaScheduler(quantum_ms=1.0)
    sched.register(JobSpec("a"))
    sched.register(JobSpec("b"))
    assert sched.select({"a"}) == "a"
    sched.charge("a", 1.0, 50.0)
    assert sched.select({"a", "b"}) == "b"
    sched.charge("b", 1.0, 1.0)
    assert sched.select({"a", "b"}) == "a"  # the 49 ms taken alone were nobody's


def test_deregistered_holder_passes_the_token() -> None:
    sched = QuantaScheduler(quantum_ms=1.0)
    for name in "abc":
        sched.register(JobSpec(name))
    assert sched.select(set("abc")) == "a"
    sched.deregister("a")
    assert sched.select(set("bc")) == "b"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"name": ""}, "name", id="empty-name"),
        pytest.param({"name": "a", "weight": 0}, "weight", id="zero-weight"),
        pytest.param({"name": "a", "weight": 1.5}, "weight", id="float-weight"),
    ],
)
def test_bad_job_specs_are_rejected(spec: dict, field: str) -> None:
    with pytest.raises(QuantaError, match=field):
        JobSpec(**spec)


def test_unknown_job_and_duplicate_registration_raise() -> None:
    sched = QuantaScheduler(quantum_ms=1.0)
    sched.register(JobSpec("a"))
    with pytest.raises(QuantaError):
        sched.register(JobSpec("a"))
    with pytest.raises(QuantaError):
        sched.charge("zzz", 1.0, 1.0)


@pytest.mark.parametrize(
    ("curves", "tolerance", "expected"),
    [
        pytest.param([[[0.5, 0.08], [1.0, 0.04], [2.0, 0.02], [4.0, 0.01]]], 2.0, 2.0, id="exact"),
        pytest.param([[[0.5, 0.08], [1.0, 0.04], [2.0, 0.02]]], 3.0, 1.5, id="interpolated"),
        pytest.param(
            [[[1.0, 0.01]], [[1.0, 0.05], [2.0, 0.015]]], 2.0, 1.857142857, id="max-of-models"
        ),
        pytest.param([[[1.0, 0.5], [2.0, 0.4]]], 2.0, 10.0, id="never-within-forces-max"),
    ],
)
def test_choose_quantum_takes_the_largest_per_model_quantum(curves, tolerance, expected) -> None:
    built = [OverheadCurve.from_points(f"m{i}", pts) for i, pts in enumerate(curves)]
    assert choose_quantum_ms(built, tolerance, 0.5, 10.0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("costs", "target", "expected"),
    [
        pytest.param([0.1] * 10, 0.5, [(0, 5), (5, 10)], id="even"),
        pytest.param([2.0, 0.1, 0.1], 0.5, [(0, 1), (1, 3)], id="big-atom-alone"),
        pytest.param([0.3], 1.0, [(0, 1)], id="single"),
        pytest.param([], 1.0, [], id="empty"),
    ],
)
def test_group_segments_covers_atoms_in_order(costs, target, expected) -> None:
    assert group_segments(costs, target) == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [pytest.param([1, 1, 1], 1.0, id="equal"), pytest.param([1, 0], 0.5, id="one-starved")],
)
def test_jain_index(values, expected) -> None:
    assert jain_index(values) == pytest.approx(expected)
