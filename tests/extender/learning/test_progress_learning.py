"""Progress samples from agent reports (extender.learning.step_times) and what the pair
learner makes of them: figures, the share threshold and losing pairs refused."""

from __future__ import annotations

import math
from typing import Any

import pytest
from extender_builders import A100, placement

from contracts.agentreport import ReportedProgress
from contracts.annotations import MODEL
from extender.core.pairs import shares
from extender.core.snapshot import GpuSpec
from extender.learning.interference import PairLearner
from extender.learning.step_times import AloneSteps, progress_samples
from extender.state.reports import DecodedReport, ReportedProcess


def _report(steps: dict[str, float], procs: tuple[str | None, ...] | None = None
            ) -> DecodedReport:
    g = GpuSpec(0, "GPU-n1-0", A100, 40960)
    owners = tuple(steps) if procs is None else procs
    return DecodedReport(node="n1", gpus=(g,), util_percent=(90.0,), memory_used_mib=(2000.0,),
                         processes=(tuple(ReportedProcess(uid, 1000.0, None) for uid in owners),),
                         progress=(tuple(ReportedProgress(uid, rate, 10.0)
                                         for uid, rate in steps.items()),))


def _placed(models: dict[str, str]) -> Any:
    return {uid: placement(uid, util=60.0, annotations=((MODEL, m),))
            for uid, m in models.items()}.get


def _model_of(models: dict[str, str]) -> Any:
    return lambda uid, index: models.get(uid)


def test_a_shared_window_is_the_step_time_ratio_to_the_pods_own_alone_time() -> None:
    alone = AloneSteps()
    models = _model_of({"a": "lm", "b": "resnet"})
    assert progress_samples(_report({"a": 10.0}), models, alone, 0.0) == []  # alone: 0.1 s
    assert progress_samples(_report({"b": 4.0}), models, alone, 0.0) == []  # alone: 0.25 s
    got = progress_samples(_report({"a": 5.0, "b": 3.2}), models, alone, 10.0)
    assert [(a, b) for _, a, b, _ in got] == [("lm", "resnet"), ("resnet", "lm")]
    assert got[0][3] == pytest.approx(math.log(2.0))  # 0.2 s a step beside resnet
    assert got[1][3] == pytest.approx(math.log(1.25))


def test_the_alone_time_is_re_measured_and_goes_stale() -> None:
    alone = AloneSteps(max_age_s=100.0)
    alone.record("a", "lm", A100, 10.0, 0.0)
    alone.record("a", "lm", A100, 5.0, 50.0)
    assert alone.alone("a", "lm", A100, 60.0) == pytest.approx(0.15)
    alone.record("b", "lm", A100, 4.0, 70.0)  # another pod of lm, seen alone later
    assert alone.alone("c", "lm", A100, 80.0) == pytest.approx((0.1 + 0.2 + 0.25) / 3)
    assert alone.alone("a", "lm", A100, 60.0) == pytest.approx(0.15)  # its own first
    alone.profile("lm", A100, 0.12)
    assert alone.alone("a", "lm", A100, 1000.0) == 0.12  # stale: a profile first


def test_a_stale_alone_time_is_kept_rather_than_dropped() -> None:
    alone = AloneSteps(max_age_s=100.0)
    alone.record("a", "lm", A100, 10.0, 0.0)
    alone.record("a", "lm", A100, 5.0, 50.0)
    alone.record("b", "lm", A100, 4.0, 70.0)
    assert alone.alone("a", "lm", A100, 1000.0) == pytest.approx(0.15)  # its own newest
    assert alone.alone("c", "lm", A100, 1000.0) == pytest.approx((0.1 + 0.2 + 0.25) / 3)
    assert alone.alone("c", "bert", A100, 1000.0) is None  # never seen alone
    alone.record("a", "lm", A100, 2.0, 1000.0)  # re-measured: the fresh figure again
    assert alone.alone("a", "lm", A100, 1010.0) == pytest.approx(0.5)
    # A pod shared past max_age_s still teaches: its window is a sample at once.
    got = progress_samples(_report({"a": 1.0, "d": 3.2}), _model_of({"a": "lm", "d": "bert"}),
                           alone, 5000.0)
    assert [(a, b) for _, a, b, _ in got] == [("lm", "bert")]
    assert got[0][3] == pytest.approx(math.log(1.0 / 0.5))


@pytest.mark.parametrize("report, reason", [
    (_report({"a": 5.0, "b": 3.0}, ("a", "b", None)), "not-a-pair"),  # an unattributed process
    (_report({"a": 5.0}, ("a", "b")), "not-a-pair"),  # b holds the GPU, counts nothing
    (_report({"a": 5.0, "c": 3.0}), "not-placed"),
    (_report({"a": 5.0, "b": 3.0}), "no-alone-time"),
])
def test_no_sample_is_guessed(report: DecodedReport, reason: str) -> None:
    alone = AloneSteps()
    assert progress_samples(report, _model_of({"a": "lm", "b": "resnet"}), alone, 0.0) == []
    assert alone.skipped.get(reason)


def test_the_learner_learns_from_progress_and_refuses_a_pair_measured_to_lose() -> None:
    learner = PairLearner(progress_refit_seconds=0.0)
    placed = _placed({"a": "lm", "b": "resnet", "c": "bert", "d": "gpt"})
    for uid in "abcd":
        learner.observe_progress(_report({uid: 10.0}), placed)
    # lm and resnet: 1.25x each (combined 1.6); bert and gpt: 2.5x each (combined 0.8)
    assert learner.observe_progress(_report({"a": 8.0, "b": 8.0}), placed) == 2
    assert learner.observe_progress(_report({"c": 4.0, "d": 4.0}), placed) == 2
    model = learner.current()
    assert model is not None
    value, source = model.figure(A100, "lm", "resnet", 1.0)
    assert source == "progress:1" and 1.1 < value < 1.4
    assert model.can_share(A100, "lm", "resnet")
    assert not model.can_share(A100, "bert", "gpt")
    view = learner.view()[0]["progress"]
    assert view["refused_losing"] == [["bert", "gpt"]]
    assert view["sources"]["progress"] == 4
    assert learner.stats()["progress_samples"] == 4 and learner.stats()["losing"] == 1


def test_the_threshold_counts_the_uncertainty() -> None:
    sure, unsure = 0.01, 0.3
    assert shares((math.log(1.8), sure), (math.log(1.8), sure))  # combined 1.11
    assert not shares((math.log(1.8), unsure), (math.log(1.8), unsure))
    assert shares((math.log(1.8), unsure), (math.log(1.8), unsure), z=-1.0)  # while exploring


def test_status_says_how_many_pairs_came_from_progress_and_were_refused() -> None:
    from contracts.state import StateDocument
    from extender.ops.status import summarize
    from extender.ops.status_render import render

    learner = PairLearner(progress_refit_seconds=0.0)
    placed = _placed({"c": "bert", "d": "gpt"})
    for uid in "cd":
        learner.observe_progress(_report({uid: 10.0}), placed)
    learner.observe_progress(_report({"c": 4.0, "d": 4.0}), placed)
    doc = summarize(StateDocument(nodes=(), learning={"pairs": learner.view()}), "test", None)
    assert doc["interference"][0]["progress_pairs"] == 2
    assert doc["interference"][0]["refused_losing"] == 1
    assert "2 from progress (1 refused as losing)" in render(doc)


def test_progress_samples_are_persisted_and_read_back() -> None:
    learner = PairLearner(progress_refit_seconds=0.0)
    placed = _placed({"c": "bert", "d": "gpt", "a": "lm"})
    for uid in "cda":
        learner.observe_progress(_report({uid: 10.0}), placed)
    learner.observe_progress(_report({"c": 4.0, "d": 4.0}), placed)  # losing
    learner.observe_progress(_report({"a": 8.0, "c": 9.0}), placed)
    learner.observe_progress(_report({"a": 7.0, "c": 9.0}), placed)
    doc = learner.to_document()
    assert len(doc["progress"]) == 4
    back = PairLearner(progress_refit_seconds=0.0)
    assert back.load_document(doc) == 4
    assert list(back.progress.stats) == list(learner.progress.stats)  # oldest first
    for key, st in learner.progress.stats.items():
        assert back.progress.stats[key] == pytest.approx(st, abs=1e-6)
    assert back.stats()["progress_samples"] == 6
    model = back.current()
    assert model is not None and not model.can_share(A100, "bert", "gpt")  # still refused
    assert model.figure(A100, "lm", "bert", 1.0)[1] == "progress:2"
    back.reset()
    assert back.progress.stats == {} and back.to_document()["progress"] == []


@pytest.mark.parametrize("row", [
    [A100, "a", "b", 0, 0.1, 0.0], [A100, "a", "b", 1, 9.0, 0.0], [A100, "a", "b", 1, 0.1, -1],
    [A100, "a", "b", 1.5, 0.1, 0.0], [A100, "a"], "junk"])
def test_a_bad_progress_row_is_refused_and_nothing_is_replaced(row: Any) -> None:
    learner = PairLearner()
    learner.progress.add(A100, "x", "y", 0.3)
    with pytest.raises(ValueError, match="progress row|pairs:"):
        learner.load_document({"pairs": [], "progress": [row]})
    assert learner.progress.stats[(A100, "x", "y")][0] == 1


def test_a_pair_measured_a_minute_ago_reaches_decisions() -> None:
    """The completion is refitted within a minute of new samples (jobs arrive every tens of
    seconds: figures ten minutes late decided nothing)."""
    now = [0.0]
    learner = PairLearner(clock=lambda: now[0])
    placed = _placed({"a": "lm", "b": "resnet", "c": "bert"})
    for uid in "abc":
        learner.observe_progress(_report({uid: 10.0}), placed)
    learner.observe_progress(_report({"a": 8.0, "b": 8.0}), placed)
    model = learner.current()
    assert model is not None and model.figure(A100, "lm", "bert", 1.0)[1] == "curve"
    now[0] = 61.0
    learner.observe_progress(_report({"a": 5.0, "c": 9.0}), placed)
    model = learner.current()
    assert model is not None
    assert model.figure(A100, "lm", "bert", 1.0)[1] == "progress:1"
    assert model.figure(A100, "resnet", "bert", 1.0)[1] == "completed"
