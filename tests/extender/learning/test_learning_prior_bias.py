"""The prior's bias learned where it was observed corrects predictions for keys not observed
yet (``prior-corrected:<n>``): bounded, only with several models, shrunk toward no
correction when the ratios scatter, per namespace, never over an observed estimate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts.annotations import PodInputs
from extender.config.sections import LearningConfig
from extender.core import JobDemand, resolve_demand
from extender.learning import bias
from extender.learning.learner import Learner

A, B = "GPU-A", "GPU-B"
PRIORS = {"m1": 20.0, "m2": 30.0, "m3": 40.0, "m4": 25.0, "m5": 35.0, "new": 30.0}


class World:
    """A learner on a fake clock and a predictor answering :data:`PRIORS`."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.cfg = LearningConfig()
        self.learner = Learner(self.cfg, clock=lambda: self.now, wall_clock=lambda: self.now)

    def teach(self, model: str, gpu_type: str, util: float, namespace: str = "team") -> None:
        """A trusted alone estimate of ``model`` on ``gpu_type`` (10 minutes of samples)."""
        key = (model, 32, "training", gpu_type, 1)
        for i in range(10):
            self.now += 60.0
            self.learner.store.add(key, util, True, model, seconds=60.0, new_pod=i == 0,
                                   namespace=namespace)
        self.now += bias.REBUILD_SECONDS  # the pooled levels are recomputed from here

    def resolve(self, model: str, gpu_type: str, namespace: str | None = None,
                ) -> tuple[float, str]:
        def predict(ref: str, batch: int, t: str, workload: str):
            return PRIORS[ref], 1000.0, "xgboost:abc+mem:estimate"
        knowledge = self.learner.knowledge(self.cfg).util(1, namespace)
        demand = resolve_demand(JobDemand(1, PodInputs(model=model, batch_size=32)),
                                [gpu_type], predict, knowledge=knowledge).for_type(gpu_type)
        assert demand is not None
        return demand.util_percent, demand.source

    def predicted_everywhere(self) -> None:
        """Every model resolved once on both types (each resolution records its prediction)."""
        for model in PRIORS:
            for t in (A, B):
                self.resolve(model, t)


def test_models_observed_at_twice_their_prediction_double_an_unobserved_ones() -> None:
    world = World()
    world.predicted_everywhere()
    for model in ("m1", "m2", "m3", "m4"):
        world.teach(model, A, 2 * PRIORS[model])
    util, source = world.resolve("new", A)
    assert source.startswith("prior-corrected:4+mem:")  # the old code kept xgboost:abc
    assert util == pytest.approx(60.0, rel=0.05)
    assert world.resolve("m1", A)[1].startswith("observed:")  # an observation still wins


def test_one_models_ratio_carries_to_its_other_gpu_types() -> None:
    world = World()
    world.predicted_everywhere()
    world.teach("m1", A, 1.5 * PRIORS["m1"])  # one model: no global correction ...
    util, source = world.resolve("m1", B)  # ... but its own ratio on another GPU type
    assert source.startswith("prior-corrected:1")
    assert PRIORS["m1"] < util < 1.5 * PRIORS["m1"] + 0.01  # shrunk toward the prediction
    assert world.resolve("new", B)[1].startswith("xgboost:abc")  # another model: not yet


def test_a_global_correction_needs_several_models() -> None:
    world = World()
    world.predicted_everywhere()
    world.teach("m1", A, 2 * PRIORS["m1"])
    world.teach("m2", A, 2 * PRIORS["m2"])
    assert world.resolve("new", A) == (PRIORS["new"], "xgboost:abc+mem:estimate")
    world.teach("m3", A, 2 * PRIORS["m3"])
    assert world.resolve("new", A)[1].startswith("prior-corrected:3")


def test_the_correction_is_bounded() -> None:
    world = World()
    world.predicted_everywhere()
    for model in ("m1", "m2", "m3", "m4"):
        world.teach(model, A, PRIORS[model] / 4)  # a quarter of the prior
    util, _ = world.resolve("new", A)
    assert util == pytest.approx(PRIORS["new"] / bias.MAX_FACTOR, rel=0.01)


def test_scattered_ratios_shrink_toward_no_correction() -> None:
    world = World()
    world.predicted_everywhere()
    for model, factor in (("m1", 0.6), ("m2", 1.5), ("m3", 0.8), ("m4", 1.3), ("m5", 1.0)):
        world.teach(model, A, factor * PRIORS[model])
    util, source = world.resolve("new", A)
    raw = PRIORS["new"] * 1.0  # the ratios' geometric mean is about 0.99: nothing to learn
    assert source.startswith("xgboost:abc") or abs(util - raw) / raw < 0.05


def test_gpus_at_the_ceiling_do_not_pull_the_ratio_down() -> None:
    world = World()
    world.predicted_everywhere()
    for model in ("m1", "m2", "m4"):
        world.teach(model, A, 2 * PRIORS[model])  # 40, 60, 50: the ratio is 2
    world.teach("m3", A, 96.0)  # twice 40 would be 80: it says the ratio is at least 2.4
    util, _ = world.resolve("new", A)
    assert util >= 0.95 * 2 * PRIORS["new"]


def test_one_namespaces_models_do_not_correct_anothers_predictions() -> None:
    world = World()
    world.predicted_everywhere()
    for model in ("m1", "m2", "m3"):
        world.teach(model, A, 0.5 * PRIORS[model], namespace="tenant-a")
    assert world.resolve("new", A, "tenant-b")[1].startswith("xgboost:abc")
    assert world.resolve("new", A, "tenant-a")[1].startswith("prior-corrected:3")


def test_pooled_levels_separate_a_gpu_types_bias() -> None:
    pairs = []
    for i, model in enumerate(("m1", "m2", "m3", "m4")):
        pred = 20.0 + 5 * i
        pairs.append(((model, 32, "training", A, 1), pred, pred))  # A: the prior is right
        pairs.append(((model, 32, "training", B, 1), 0.5 * pred * (1 + 0.01 * i), pred))
    levels = bias.pooled(pairs)
    assert levels.by_type[B] - levels.by_type.get(A, 0.0) == pytest.approx(-0.69, abs=0.1)


def test_the_correction_can_be_turned_off() -> None:
    world = World()
    world.predicted_everywhere()
    for model in ("m1", "m2", "m3", "m4"):
        world.teach(model, A, 2 * PRIORS[model])
    world.cfg = replace(world.cfg, prior_correction=False)
    assert world.resolve("new", A) == (PRIORS["new"], "xgboost:abc+mem:estimate")
