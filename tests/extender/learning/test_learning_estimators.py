"""Estimators fed the way a real agent feeds them: 1 Hz NVML samples with warm-up and phases."""

from __future__ import annotations

import random

import pytest

from contracts.annotations import BATCH_SIZE, MODEL
from contracts.gpus import GpuRef
from extender.config.sections import LearningConfig
from extender.core import Placement
from extender.learning.curves import CurveGuards, CurveLearner
from extender.learning.learner import Learner
from extender.state.reports import ReportedProcess
from predictor.curves import InterferenceCurve, fit_partial

A100 = "NVIDIA A100-SXM4-40GB"
TYPE = "NVIDIA-A100-SXM4-40GB"
PRIOR = InterferenceCurve()
GPUS = tuple(GpuRef(i, f"GPU-{i}") for i in range(4))
"""The node's GPUs as its agent reports them (index and UUID)."""


class World:
    """One node's agent reporting one GPU at 1 Hz to a learner with the default config."""

    def __init__(self, cfg: LearningConfig | None = None) -> None:
        self.now = 1000.0
        self.learner = Learner(cfg or LearningConfig(), wall_clock=lambda: self.now,
                               clock=lambda: self.now)
        self.placements: dict[str, Placement] = {}

    def place(self, uid: str, model: str = "m.onnx", gpu: int = 0) -> None:
        self.placements[uid] = Placement(uid, f"team/{uid}", "n1", (gpu,), 100.0, 1000.0,
                                         annotations=((BATCH_SIZE, "32"), (MODEL, model)))

    def run(self, seconds: int, util: float | tuple[float, float], uid: str = "p1",
            gpu: int = 0, rng: random.Random | None = None) -> None:
        for _ in range(seconds):
            self.now += 1.0
            value = util if isinstance(util, float) else (rng or random).uniform(*util)
            self.learner.store.observe_gpu("n1", GPUS, gpu, A100, value,
                                           (ReportedProcess(uid, 900.0, None),),
                                           self.placements.get)

    def answer(self, model: str = "m.onnx") -> tuple[float, int] | None:
        return self.learner.store.lookup(model, 32, TYPE, "training")


def test_five_seconds_of_warm_up_do_not_make_a_trusted_estimate() -> None:
    world = World()
    world.place("p1")
    world.run(5, (0.0, 10.0), rng=random.Random(1))
    found = world.answer()
    assert found is None or found[1] == 0  # not trusted: resolution keeps the prediction
    assert world.learner.stats()["estimates"]["trusted"] == 0


def test_a_pods_warm_up_is_skipped_and_time_makes_trust() -> None:
    world = World()
    world.place("p1")
    world.run(60, 5.0)  # loading data, compiling: the first learning.warmup_seconds
    world.run(119, 80.0)
    assert world.answer()[1] == 0  # 119 s observed: below learning.min_observed_seconds
    world.run(200, 80.0)
    util, samples = world.answer()
    assert util == pytest.approx(80.0) and samples >= 300  # the 5% warm-up left no trace
    assert world.learner.store.rejected["warm-up"] == 60


def test_a_short_phase_moves_an_estimate_by_its_share_of_the_time() -> None:
    world = World(LearningConfig(spread_margin=0))
    world.place("p1")
    world.run(61, 80.0)  # warm-up
    world.run(300, 80.0)
    world.run(30, 15.0)  # an evaluation phase
    util, _ = world.answer()
    assert util >= 70.0  # the per-sample EWMA gave 17.8%


def test_a_flood_of_reports_weighs_the_time_it_covers_only() -> None:
    world = World(LearningConfig(spread_margin=0))
    world.place("p1")
    world.run(61, 80.0)
    world.run(600, 80.0)
    store = world.learner.store
    for _ in range(30):  # 30 forged reports within one second
        world.now += 0.01
        store.observe_gpu("n1", GPUS, 0, A100, 1.0, (ReportedProcess("p1", 900.0, None),),
                          world.placements.get)
    assert world.answer()[0] >= 79.0
    assert store.rejected["rate-limited"] >= 29


def test_the_spread_is_a_safety_margin_that_shrinks_with_time() -> None:
    rng = random.Random(2)
    world = World()
    world.place("p1")
    world.run(61, 50.0)
    world.run(300, (30.0, 70.0), rng=rng)
    early, _ = world.answer()
    world.run(3000, (30.0, 70.0), rng=rng)
    late, _ = world.answer()
    assert early > late > 50.0  # an upper bound of the mean, tighter with more minutes
    assert early - 50.0 > 3.0


def test_curve_points_at_most_once_a_minute_per_gpu() -> None:
    now = [0.0]
    curves = CurveLearner(CurveGuards(), lambda: now[0])
    assert curves.add_point(TYPE, 80.0, 1.4, gpu=("n1", 0))
    now[0] += 30.0
    assert not curves.add_point(TYPE, 80.0, 1.4, gpu=("n1", 0))
    assert curves.add_point(TYPE, 80.0, 1.4, gpu=("n1", 1))  # another GPU
    now[0] += 31.0
    assert curves.add_point(TYPE, 80.0, 1.4, gpu=("n1", 0))
    assert curves.view()[0]["points_held"] == 3


def test_a_refit_on_noise_never_fits_the_held_out_points_worse() -> None:
    rng = random.Random(4)
    now = [0.0]
    curves = CurveLearner(CurveGuards(min_points=30, refit_interval_seconds=0, max_step=10),
                          lambda: now[0])
    for _ in range(60):  # noise around the prior: nothing better to learn
        u = rng.uniform(20, 90)
        curves.add_point(TYPE, u, PRIOR.slowdown(u) + rng.gauss(0, 0.02))
    # The prior already explains the points: a refit on noise must not replace it.
    curves.maybe_refit(TYPE, PRIOR)
    learned = curves.curves().get(TYPE, PRIOR)
    held = [(u, s) for i, (u, s) in enumerate(curves.to_document()[0]["data"]) if i % 5 == 0]

    def median_error(curve: InterferenceCurve) -> float:
        errors = sorted(abs(curve.slowdown(u) - s) for u, s in held)
        return errors[len(errors) // 2]
    assert median_error(learned) <= median_error(PRIOR)


def test_a_curve_fitted_just_above_100_percent_keeps_the_prior_far_past_it() -> None:
    truth = InterferenceCurve(slope=0.4, over_slope=0.6, over_quadratic=0.8)
    learned_at_200, naive_at_200 = [], []
    for seed in range(6):
        rng = random.Random(seed)
        curves = CurveLearner(CurveGuards(min_points=30, refit_interval_seconds=0,
                                          max_step=10), lambda: 0.0)
        points = []
        for _ in range(80):  # noisy points only at 100-125%
            u = rng.uniform(100, 125)
            points.append((u, truth.slowdown(u) + rng.gauss(0, 0.15)))
            curves.add_point(TYPE, *points[-1])
        assert curves.maybe_refit(TYPE, PRIOR)
        learned = curves.curves()[TYPE]
        assert abs(learned.slowdown(110.0) - truth.slowdown(110.0)) < 0.15  # fits the points
        learned_at_200.append(learned.slowdown(200.0))
        naive_at_200.append(fit_partial(*zip(*points, strict=True), PRIOR).slowdown(200.0))
    # A quadratic fitted on 100-125% alone says anything at 200% (the noise decides);
    # pinned to the prior past the points, the learned curve stays at the prior's 3x there.
    assert max(naive_at_200) - min(naive_at_200) > 1.0
    assert all(abs(v - PRIOR.slowdown(200.0)) < 0.2 for v in learned_at_200)


def _report(gpus: dict[int, list[tuple[str | None, float | None]]], util: float):
    from extender.core import GpuSpec
    from extender.state.reports import DecodedReport
    idx = sorted(gpus)
    return DecodedReport("n1", tuple(GpuSpec(i, f"GPU-{i}", A100, 40960.0) for i in idx),
                         tuple(util for _ in idx), tuple(1000.0 for _ in idx),
                         tuple(tuple(ReportedProcess(uid, 900.0, u) for uid, u in gpus[i])
                               for i in idx))


def test_a_data_parallel_pod_is_alone_only_when_none_of_its_gpus_is_shared() -> None:
    world = World(LearningConfig(min_observed_seconds=0, spread_margin=0))
    world.placements["dp"] = Placement("dp", "team/dp", "n1", (0, 1), 100.0, 1000.0,
                                       annotations=((BATCH_SIZE, "32"), (MODEL, "m.onnx")))
    world.place("other", model="o.onnx", gpu=1)
    world.place("single", gpu=2)
    for _ in range(120):
        world.now += 1.0
        # dp alone on GPU 0 (no per-process figures), sharing GPU 1 with another pod;
        # a one-GPU pod of the same model alone on GPU 2
        world.learner.observe(_report({0: [("dp", None)], 1: [("dp", 30.0), ("other", 40.0)],
                                       2: [("single", None)]}, 55.0), world.placements.get)
    store = world.learner.store
    # GPU 0's 55% is not dp's own alone figure: it waits for GPU 1 at each exchange
    assert store.lookup("m.onnx", 32, TYPE, "training", gpus=2, shared=True)[0] == 30.0
    # the one-GPU pod of the same model is learned apart (keyed by GPU count)
    assert store.lookup("m.onnx", 32, TYPE, "training")[0] == 55.0
    keys = {(e["model"], e["gpus"]) for e in store.view()["alone"]}
    assert keys == {("m.onnx", 1)}
    # until the two-GPU pod has its own, it is predicted from the one-GPU pod's (an upper
    # bound of a data-parallel pod's per-GPU use), never from its own shared GPU 0
    knowledge = world.learner.knowledge(world.learner.cfg).util(gpus=2)
    assert knowledge.observed("m.onnx", 32, TYPE, "training")[0] == 55.0
