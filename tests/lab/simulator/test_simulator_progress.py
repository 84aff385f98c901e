"""The simulator's ``progress`` signal: NVML as time-sliced GPUs show it, each pod's steps
per second from its true slowdown with the measured noise, and the extender's learner
learning who slows whom from it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_simulator_pairwise import DOC, P100, FirstGpu

from extender.config.sections import LearningConfig
from extender.core.snapshot import NodeName, Placement, PodUid
from extender.learning.learner import Learner
from lab.simulator.agents import SimAgents, SimClock
from lab.simulator.cluster import uniform_cluster
from lab.simulator.engine import Engine, SchedulingContext
from lab.simulator.jobs import SimJob
from lab.simulator.signal import SignalModel, parse_signal
from lab.simulator.truth import parse_truth


def test_progress_shows_nvml_as_time_sliced_and_parses() -> None:
    signal = SignalModel("progress")
    assert signal.progress and not SignalModel("time-sliced").progress
    assert signal.shown(20.0, 1.0, 4.0, 93.0) == pytest.approx(93.0)
    problems: list[str] = []
    assert parse_signal({"model": "progress"}, "signal", problems) == signal and not problems


def _run(signal: str) -> Learner:
    truth = replace(parse_truth({**DOC, "noise": {"util_stddev_percent": 0}}),
                    signal=SignalModel(signal))
    clock = SimClock()
    learner = Learner(LearningConfig(pairs=True), clock=clock, wall_clock=clock)
    agents = SimAgents(truth, learner, clock)
    jobs = [SimJob("lm-alone", 0.0, 400.0, util_percent=40.0, model="LM-bs5"),
            SimJob("rn-alone", 500.0, 400.0, util_percent=60.0, model="ResNet-50-bs64"),
            SimJob("lm", 1000.0, 3000.0, util_percent=40.0, model="LM-bs5"),
            SimJob("rn", 1000.0, 3000.0, util_percent=60.0, model="ResNet-50-bs64")]
    Engine(uniform_cluster(1, 1, P100, 16384), jobs, FirstGpu(), truth=truth,
           agents=agents).run()
    return learner


def test_the_learner_learns_each_jobs_own_slowdown_from_progress() -> None:
    learner = _run("progress")
    assert learner.pairs.stats()["samples"] == 0  # the NVML figures teach nothing
    assert learner.pairs.stats()["progress_samples"] >= 10
    model = learner.pairs.model()
    assert model is not None
    lm, source = model.figure(P100, "LM-bs5", "ResNet-50-bs64", 1.0)
    resnet, _ = model.figure(P100, "ResNet-50-bs64", "LM-bs5", 1.0)
    assert source.startswith("progress:")
    assert lm == pytest.approx(3.56, rel=0.1)  # the truth's figures, within the noise
    assert resnet == pytest.approx(1.25, rel=0.1)


def test_without_progress_time_sliced_gpus_teach_no_pairs() -> None:
    learner = _run("time-sliced")
    assert learner.pairs.stats()["progress_samples"] == 0
    assert learner.pairs.model() is None


def test_simulated_pods_name_a_counter_unless_the_gpus_are_time_sliced() -> None:
    from contracts.annotations import MODEL, PROGRESS
    from lab.simulator.belief import SimWorld, pod_annotations
    from lab.simulator.engine import JobRun

    for signal, counted in (("progress", True), ("proportional", True), ("time-sliced", False)):
        truth = replace(parse_truth(DOC), signal=SignalModel(signal))
        world = SimWorld.build(truth, "online", LearningConfig(pairs=True), [P100])
        run = JobRun(0, SimJob("lm", 0.0, 10.0, util_percent=40.0, model="LM-bs5"))
        demand = world.knowledge.demand(run)
        assert demand.job.progress is counted
        assert (PROGRESS in dict(pod_annotations(demand))) is counted
        assert dict(pod_annotations(demand))[MODEL] == "LM-bs5"


def test_decisions_see_what_the_agents_reported_by_then() -> None:
    """The learner has a shared GPU's periods before the next decision, not only once the
    GPU's jobs change (a real agent reports every interval)."""
    truth = replace(parse_truth({**DOC, "noise": {"util_stddev_percent": 0}}),
                    signal=SignalModel("progress"))
    clock = SimClock()
    learner = Learner(LearningConfig(pairs=True), clock=clock, wall_clock=clock)
    seen: list[tuple[float, int]] = []

    class Watching(FirstGpu):
        def schedule(self, ctx):  # type: ignore[no-untyped-def]
            seen.append((ctx.now_s, learner.pairs.stats()["progress_samples"]))
            return super().schedule(ctx)

    jobs = [SimJob("lm-alone", 0.0, 400.0, util_percent=40.0, model="LM-bs5"),
            SimJob("rn-alone", 500.0, 400.0, util_percent=60.0, model="ResNet-50-bs64"),
            SimJob("lm", 1000.0, 3000.0, util_percent=40.0, model="LM-bs5"),
            SimJob("rn", 1000.0, 3000.0, util_percent=60.0, model="ResNet-50-bs64"),
            SimJob("late", 2000.0, 100.0, util_percent=10.0, model="LM-bs5")]
    Engine(uniform_cluster(1, 1, P100, 16384), jobs, Watching(),
           truth=truth, agents=SimAgents(truth, learner, clock)).run()
    at_late = dict(seen)[2000.0]
    assert at_late >= 2 * 15  # both pods, a sample a minute for the 1,000 s they shared


LOSING = {"interference": {P100: {"slowdown": {"A": {"B": 2.5}, "B": {"A": 2.5}}}}}
"""A pair that progresses less together than taking turns (1/2.5 + 1/2.5 = 0.8)."""


class FirstThenSecondGpu(FirstGpu):
    """Places a job on GPU 0, and on GPU 1 once it was evicted (a test policy)."""

    def schedule(self, ctx: SchedulingContext) -> int:
        runs, self.queue = self.queue, []
        for run in runs:
            ctx.place(run, [Placement(PodUid(run.job.id), run.job.id, NodeName("gpu-node-1"),
                                      (min(run.evictions, 1),), run.pred_util, run.pred_mem)])
        return len(runs)


def _losing_pair(revert_s: float) -> Engine:
    truth = replace(parse_truth({**LOSING, "noise": {"util_stddev_percent": 0}}),
                    signal=SignalModel("progress"))
    clock = SimClock()
    learner = Learner(LearningConfig(pairs=True, revert_losing_seconds=revert_s), clock=clock,
                      wall_clock=clock)
    jobs = [SimJob("a-alone", 0.0, 400.0, util_percent=40.0, model="A"),
            SimJob("b-alone", 500.0, 400.0, util_percent=40.0, model="B"),
            SimJob("a", 1000.0, 3000.0, util_percent=40.0, model="A"),
            SimJob("b", 1030.0, 3000.0, util_percent=40.0, model="B")]
    return Engine(uniform_cluster(1, 2, P100, 16384), jobs, FirstThenSecondGpu(), truth=truth,
                  agents=SimAgents(truth, learner, clock)).run()


def test_the_newest_pod_of_a_pair_measured_to_lose_is_moved_with_revert_on() -> None:
    """``learning.revert_losing_seconds``: the agents' reports name the newest pod of a GPU
    whose pair was measured to lose, and the simulated cluster evicts it, as the extender's
    report path does; within minutes, since the agents report through the window."""
    moved = _losing_pair(600.0)
    b = moved.runs[3]
    assert moved.reverts == 1 and b.evictions == 1 and moved.runs[2].evictions == 0
    assert b.rows == () and 1030.0 < b.start_s <= 1030.0 + 240.0  # moved within 4 minutes
    kept = _losing_pair(0.0)
    assert kept.reverts == 0 and kept.runs[3].evictions == 0
    assert b.finish_s < kept.runs[3].finish_s  # alone on GPU 1, it finishes sooner
