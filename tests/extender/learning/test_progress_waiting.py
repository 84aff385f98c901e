"""Shared windows of a pod with no alone time yet wait for one (extender.learning.step_times)."""

from __future__ import annotations

import math

import pytest
from extender_builders import A100
from test_progress_learning import _model_of, _report

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
