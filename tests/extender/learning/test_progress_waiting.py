"""Shared windows of a pod with no alone time yet wait for one (extender.learning.step_times)."""

from __future__ import annotations

import math

import pytest
from extender_builders import A100
from test_progress_learning import _model_of, _placed, _report

from extender.learning.progress_tracker import ProgressTracker
from extender.learning.step_times import MAX_WAITING, AloneSteps, progress_samples


def test_a_pod_that_started_shared_teaches_once_it_runs_alone() -> None:
    alone = AloneSteps(max_age_s=100.0)
    models = _model_of({"a": "lm", "b": "resnet"})
    assert progress_samples(_report({"a": 5.0, "b": 3.2}), models, alone, 0.0) == []
    assert alone.skipped["no-alone-time"] == 2
    got = progress_samples(_report({"a": 10.0}), models, alone, 20.0)  # b left: a alone
    assert [(a, b) for _, a, b, _ in got] == [("lm", "resnet")]
    assert got[0][3] == pytest.approx(math.log(2.0))  # 0.2 s a step against 0.1 alone
    assert progress_samples(_report({"a": 10.0}), models, alone, 30.0) == []  # used once
    progress_samples(_report({"b": 4.0}), models, alone, 500.0)  # resnet alone, too late
    assert alone.settle("resnet", A100, 500.0) == []


def test_waiting_windows_are_bounded_per_model() -> None:
    alone = AloneSteps()
    for i in range(MAX_WAITING + 10):
        alone.wait(f"p{i}", "lm", "resnet", A100, 0.2, float(i))
    alone.record("q", "lm", A100, 10.0, 100.0)
    assert len(alone.settle("lm", A100, 100.0)) == MAX_WAITING


def _three(known: dict[tuple[str, str], float]) -> list[tuple[str, str, str, float]]:
    """lm, resnet and bert on one GPU after each ran alone (0.1, 0.25, 0.5 s a step)."""
    alone = AloneSteps()
    models = _model_of({"a": "lm", "b": "resnet", "c": "bert"})
    for uid, rate in (("a", 10.0), ("b", 4.0), ("c", 2.0)):
        progress_samples(_report({uid: rate}), models, alone, 0.0)
    return progress_samples(_report({"a": 10.0 / 1.8, "b": 4.0 / 1.5, "c": 2.0 / 1.2}),
                            models, alone, 10.0,
                            lambda t, a, b: known.get((a, b)) if t == A100 else None)


def test_three_pods_teach_the_one_partner_not_measured_through_the_additive_rule() -> None:
    # lm runs 1.8x slower beside resnet and bert; beside resnet alone it was measured 1.3x.
    got = _three({("lm", "resnet"): math.log(1.3), ("resnet", "lm"): math.log(1.2)})
    assert [(a, b) for _, a, b, _ in got] == [("lm", "bert"), ("resnet", "bert")]
    assert got[0][3] == pytest.approx(math.log(1.5))  # 1 + (0.8 - 0.3)
    assert got[1][3] == pytest.approx(math.log(1.3))  # 1 + (0.5 - 0.2); bert knows neither
    # Two partners not measured, or a known part that already explains it all: no sample.
    assert _three({}) == []
    assert _three({("lm", "resnet"): math.log(2.0), ("lm", "bert"): math.log(1.1)}) == []


def test_the_tracker_attributes_three_pods_through_its_last_fit() -> None:
    tracker = ProgressTracker({}, 1000, refit_seconds=0.0)
    placed = _placed({"a": "lm", "b": "resnet", "c": "bert"})
    for uid, rate in (("a", 10.0), ("b", 4.0), ("c", 2.0)):
        tracker.observe(_report({uid: rate}), placed, 0.0)
    for t in range(1, 4):  # lm and resnet measured as a pair
        tracker.observe(_report({"a": 10.0 / 1.3, "b": 4.0 / 1.2}), placed, float(t))
    three = _report({"a": 10.0 / 1.8, "b": 4.0 / 1.5, "c": 2.0 / 1.2})
    assert tracker.observe(three, placed, 5.0) == 0  # no fit yet: nothing is known
    assert tracker.estimates(6.0) is not None
    assert tracker.observe(three, placed, 7.0) == 2
    stats = tracker.pairs.stats
    assert math.exp(stats[(A100, "lm", "bert")][1]) == pytest.approx(1.5, rel=0.05)
    assert (A100, "bert", "lm") not in stats
