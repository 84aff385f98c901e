"""Pairwise interference: the learner, the pair figures, placement by them, exploration's bound."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from extender_builders import A100, TTL, assume_best, gpu_types, measured, node, placement

from contracts.annotations import (
    GPU_UTIL,
    INTERFERENCE_SOURCE,
    MODEL,
    PREDICTION_SOURCE,
    PodInputs,
    decode_outputs,
)
from extender.cluster.source import output_annotations
from extender.config.sections import LearningConfig
from extender.core import CostPolicy, DecisionContext, JobDemand, Purpose, evaluate, resolve_demand
from extender.core.pairs import PairModel, TypePairs, judge_gpu
from extender.core.reasons import Reason
from extender.core.snapshot import GpuSpec
from extender.core.table import GpuTable
from extender.learning.interference import PairLearner
from extender.learning.knowledge import FixedBeliefs
from extender.learning.learner import Learner
from extender.state.reports import DecodedReport, ReportedProcess

GAIN_ON = CostPolicy(min_colocation_gain_percent=0.0)


def _table(resident: dict[int, str], util: float = 40.0) -> GpuTable:
    """One node, one GPU per entry, each running one training pod of the given model."""
    table = GpuTable.build([node("n1", count=len(resident))])
    for gpu, model in resident.items():
        table.place(placement(f"u{gpu}", gpus=(gpu,), util=util, mem=1000.0,
                              annotations=measured(model)))
    return table


def _choose(table: GpuTable, model: str, policy: CostPolicy,
            purpose: Purpose = Purpose.PLACE, progress: bool = True) -> tuple[list[int], Any]:
    demand = resolve_demand(JobDemand(1, PodInputs(model=model, util_percent=40.0,
                                                   mem_mib=1000.0), progress=progress),
                            table.type_names, None)
    ev = evaluate(table, ["n1"], demand, DecisionContext(policy, 0.0), purpose)
    return ev.chosen_rows(0), ev


def _pairs(pairs: dict[tuple[str, str], float], n: int = 3, bonus: float = 0.0,
           cannot: frozenset[frozenset[str]] = frozenset()) -> PairModel:
    return PairModel({A100: TypePairs({k: (math.log(v), n) for k, v in pairs.items()},
                                      cannot=cannot)}, prior_weight=0.0, explore_bonus=bonus)


def test_placement_reads_the_asymmetric_figures_the_curve_cannot_tell_apart() -> None:
    table = _table({0: "resnet", 1: "bert"})
    # new beside resnet: new 1.2x slower, but resnet 3x slower; beside bert 1.4x each.
    model = _pairs({("new", "resnet"): 1.2, ("resnet", "new"): 3.0,
                    ("new", "bert"): 1.4, ("bert", "new"): 1.4})
    curve_rows, curve_ev = _choose(table, "new", GAIN_ON)
    rows, ev = _choose(table, "new", GAIN_ON.with_pairs(model))
    assert curve_rows == [0]  # equal utilisation: the curve takes the first GPU
    assert rows == [1]
    assert ev.interference_sources == {0: "pair:3", 1: "pair:3"}
    assert curve_ev.interference_sources == {}


def test_without_learned_pairs_decisions_are_the_curves() -> None:
    table = _table({0: "resnet", 1: "bert"})
    _, plain = _choose(table, "new", GAIN_ON)
    _, empty = _choose(table, "new", GAIN_ON.with_pairs(PairModel()))
    other_type = PairModel({"NVIDIA-Tesla-K80": TypePairs({("new", "bert"): (0.1, 2)})})
    _, elsewhere = _choose(table, "new", GAIN_ON.with_pairs(other_type))
    assert np.array_equal(plain.node_cost, empty.node_cost)
    assert np.array_equal(plain.node_cost, elsewhere.node_cost)


def test_a_pair_that_cannot_share_is_refused_and_a_losing_pair_fails_the_rule() -> None:
    table = _table({0: "resnet"})
    refused = _pairs({}, cannot=frozenset({frozenset(("new", "resnet"))}))
    _, ev = _choose(table, "new", CostPolicy().with_pairs(refused), Purpose.SCORE)
    assert not ev.feasible[0]
    assert Reason.COLOCATION_SLOWDOWN in ev.rejections["n1"].gpu_counts
    losing = _pairs({("new", "resnet"): 2.5, ("resnet", "new"): 2.5})  # 2/2.5 < 1: slower
    _, ev = _choose(table, "new", GAIN_ON.with_pairs(losing), Purpose.SCORE)
    assert not ev.feasible[0]
    winning = _pairs({("new", "resnet"): 1.2, ("resnet", "new"): 1.2})  # 2/1.2 > 1
    _, ev = _choose(table, "new", GAIN_ON.with_pairs(winning), Purpose.SCORE)
    assert ev.feasible[0]


def test_with_only_refusals_known_the_curve_judges_and_the_refusals_stand() -> None:
    only_refused = _pairs({}, bonus=0.05, cannot=frozenset({frozenset(("new", "resnet"))}))
    table = _table({0: "resnet", 1: "bert"})
    assert _choose(table, "new", GAIN_ON)[0] == [0]  # the curve: the first GPU
    rows, ev = _choose(table, "new", GAIN_ON.with_pairs(only_refused))
    assert rows == [1] and ev.interference_sources == {}  # beside resnet: seen not to fit
    bert = _table({0: "bert"})
    _, plain = _choose(bert, "new", GAIN_ON, Purpose.SCORE)
    _, ev = _choose(bert, "new", GAIN_ON.with_pairs(only_refused), Purpose.SCORE)
    assert np.array_equal(ev.node_cost, plain.node_cost)  # the curve's cost, no bonus


@pytest.mark.parametrize("gap", [0.03, 0.08])
def test_exploration_gives_up_at_most_the_bonus(gap: float) -> None:
    """An untried pair wins over a known one only when its predicted loss is within the bonus."""
    bonus = 0.05
    known = {("new", "resnet"): 1.25, ("resnet", "new"): 1.25}
    loss_known = judge_gpu(_pairs(known), A100, "new", ["resnet"], [1], lambda i, j: 2.0).loss
    # "bert" never seen with "new": its figure is the profiles', set so its loss = known + gap
    s = 2.0 / (2.0 - (loss_known + gap))  # loss of a symmetric pair s: 2 (1 - 1/s)
    zero = {"new": 0.0, "bert": 0.0}
    model = PairModel({A100: TypePairs({k: (math.log(v), 3) for k, v in known.items()},
                                       math.log(s), zero, zero)}, 0.0, bonus)
    untried = judge_gpu(model, A100, "new", ["bert"], [1], lambda i, j: 2.0)
    assert untried.source == "profile"
    assert untried.loss == pytest.approx(loss_known + gap - bonus)
    table = _table({0: "resnet", 1: "bert"})
    rows, _ = _choose(table, "new", CostPolicy().with_pairs(model))
    # The bound: exploration is chosen only when it costs at most `bonus` more predicted loss.
    assert rows == ([1] if gap <= bonus else [0])


def _report(utils: dict[str, float], node_name: str = "n1") -> DecodedReport:
    g = GpuSpec(0, "GPU-n1-0", A100, 40960)
    return DecodedReport(node=node_name, gpus=(g,), util_percent=(sum(utils.values()),),
                         memory_used_mib=(2000.0,),
                         processes=(tuple(ReportedProcess(uid, 1000.0, u)
                                          for uid, u in utils.items()),))


def test_the_learner_learns_each_direction_of_a_pair_from_utilisation() -> None:
    now = [0.0]
    learner = Learner(LearningConfig(min_observations=1, min_observed_seconds=0.0,
                                     warmup_seconds=0.0, pairs=True), clock=lambda: now[0],
                      wall_clock=lambda: now[0])
    placed = {uid: placement(uid, util=60.0, annotations=((MODEL, m),))
              for uid, m in (("a", "lm"), ("b", "resnet"))}

    def report(utils: dict[str, float], placement_of: Any) -> None:
        now[0] += 10.0  # reports ten seconds apart (a pod's first one only starts its clock)
        learner.observe(_report(utils), placement_of)

    for uid in ("a", "b"):  # each alone first: its alone estimate
        for _ in range(2):
            report({uid: 60.0}, {uid: placed[uid]}.get)
    for _ in range(3):
        report({"a": 20.0, "b": 48.0}, placed.get)  # lm 3x, resnet 1.25x
    model = learner.knowledge(LearningConfig(pairs=True)).policy(CostPolicy()).pairs
    assert model is not None
    lm, source = model.figure(A100, "lm", "resnet", 1.5)
    resnet, _ = model.figure(A100, "resnet", "lm", 1.5)
    assert source == "pair:3"
    assert lm > 2.5 and resnet < 1.4  # asymmetric, shrunk a little toward the profile
    assert learner.knowledge(LearningConfig(pairs=False)).policy(CostPolicy()).pairs is None
    assert learner.view()["pairs"][0]["pairs"][0]["samples"] == 3


def test_pair_learning_is_bounded_persists_and_resets() -> None:
    learner = PairLearner(max_entries=3)
    for k in range(5):
        learner.add(A100, f"m{k}", "x", 1.5)
    learner.refuse(A100, "m0", "x")
    assert learner.stats() == {"samples": 5, "group_samples": 0, "pairs": 3, "groups": 0,
                               "inferred_pairs": 0,
                               "cannot_share": 1, "prior_pairs": 0,
                               "progress_samples": 0, "losing": 0}
    again = PairLearner(max_entries=3)
    again.load_document(learner.to_document())
    model = again.model()
    assert model is not None and not model.can_share(A100, "x", "m0")
    assert model.figure(A100, "m4", "x", 9.0) == (pytest.approx(1.5), "pair:1")
    assert model.figure(A100, "m0", "x", 9.0)[1] != "pair:1"  # dropped as least recent
    with pytest.raises(ValueError):
        again.load_document({"pairs": [[A100, "a", "b", 0, 0.1, 0.0]]})
    again.reset()
    assert again.model() is None


def test_profiles_generalise_to_pairs_never_seen_together() -> None:
    learner = PairLearner()
    for a, b, s in (("lm", "resnet", 3.0), ("resnet", "lm", 1.2), ("lm", "bert", 2.5),
                    ("bert", "lm", 1.1), ("cnn", "resnet", 1.3), ("resnet", "cnn", 1.3)):
        learner.add(A100, a, b, s)
    model = learner.model()
    assert model is not None
    sensitive, source = model.figure(A100, "lm", "cnn", 1.5)
    calm, _ = model.figure(A100, "cnn", "lm", 1.5)
    assert source == "profile" and sensitive > calm
    assert model.figure(A100, "lm", "unknown", 1.5) == (1.5, "curve")


def test_no_model_on_a_resident_pod_keeps_the_curve() -> None:
    table = GpuTable.build([node("n1", count=1)])
    table.place(placement("u0", util=40.0, mem=1000.0))  # no model annotation
    _, ev = _choose(table, "new", GAIN_ON.with_pairs(_pairs({("new", ""): 3.0})))
    assert ev.interference_sources == {}
    assert table.row_models[0] == (("", 40.0, 1, False),)


def test_bind_reports_where_the_interference_figure_came_from() -> None:
    from extender.state.ledger import ClusterState

    model = _pairs({("new", "resnet"): 1.2, ("resnet", "new"): 1.3})
    state = ClusterState(FixedBeliefs(CostPolicy().with_pairs(model)), lambda: 0.0, TTL)
    state.set_nodes([node("n1", 1)])
    state.confirm(placement("u0", util=40.0, mem=1000.0, annotations=measured("resnet")))
    demand = resolve_demand(JobDemand(1, PodInputs(model="new", util_percent=40.0,
                                                   mem_mib=1000.0), progress=True),
                            gpu_types(state), None)
    *_, source = assume_best(state, "n1", demand, None, "u1", "d/p")
    assert source == "pair:3"
    ann = output_annotations(placement("u1"), ["GPU-n1-0"], 0.5, None, "asserted", source)
    assert ann[INTERFERENCE_SOURCE] == "pair:3"
    decoded = decode_outputs(ann)
    assert decoded is not None and decoded.interference_source == "pair:3"


def test_status_shows_pair_sources_and_what_was_learned() -> None:
    from contracts.state import decode_state
    from extender.ops.status import summarize
    from extender.ops.status_render import render

    learner = PairLearner()
    learner.add(A100, "lm", "resnet", 3.0)
    state = {"nodes": {"n1": {"gpus": [{"index": 0, "product": A100, "memory_mib": 40960,
                                        "reserved_mib": 1000, "pods": [
                                            {"pod": "d/p", "workload": "training",
                                             "util_percent": 40.0, "mem_mib": 1000.0,
                                             "annotations": {INTERFERENCE_SOURCE: "pair:3"}}]}]}},
             "learning": {"pairs": learner.view()}}
    doc = summarize(decode_state(state), "http://x", None)
    assert doc["nodes"][0]["gpus"][0]["pods"][0]["interference"] == "pair:3"
    assert doc["interference"] == [{"gpu_type": A100, "pairs": 1, "profiled_models": 2,
                                    "cannot_share": 0, "prior_pairs": 0,
                                    "inferred_pairs": 0, "progress_pairs": 0,
                                    "refused_losing": 0}]
    text = render(doc)
    assert "interference pair:3" in text and "1 pairs, 2 models profiled" in text
    assert "interference" not in summarize(decode_state({"nodes": {}}), "http://x", None)


class _Memory:
    """A persistence that keeps the document in memory (the ConfigMap's load/save)."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] | None = None

    def load(self) -> dict[str, Any] | None:
        return self.doc

    def save(self, doc: dict[str, Any]) -> None:
        self.doc = json.loads(json.dumps(doc))  # what a ConfigMap round trip keeps


def test_learned_pairs_survive_a_restart_through_the_learning_document() -> None:
    cfg = LearningConfig(pairs=True, persist_interval_seconds=1.0)
    store = _Memory()
    first = Learner(cfg, store, clock=lambda: 0.0, wall_clock=lambda: 0.0)  # type: ignore[arg-type]
    first.pairs.add(A100, "lm", "resnet", 3.0)
    first.pairs.add_group(A100, "lm", ["bert", "resnet"], 4.0)  # a GPU shared by three
    assert first.maybe_persist(force=True)
    assert store.doc is not None and store.doc["pairs"]["pairs"][0][:4] == [A100, "lm", "resnet", 1]
    second = Learner(cfg, store, clock=lambda: 0.0, wall_clock=lambda: 0.0)  # type: ignore[arg-type]
    second.start()
    model = second.knowledge(cfg).policy(CostPolicy()).pairs
    assert model is not None and model.figure(A100, "lm", "resnet", 1.0)[1] == "pair:1"
    assert model.figure(A100, "lm", "bert", 1.0)[1] == "group:1"  # the group sample came back


def test_pods_in_their_warm_up_give_no_pair_sample() -> None:
    now = [0.0]
    learner = PairLearner(warmup_seconds=60.0, clock=lambda: now[0])
    placed = {uid: placement(uid, annotations=((MODEL, m),))
              for uid, m in (("a", "lm"), ("b", "resnet"))}
    taken = []
    for t in (0.0, 30.0, 70.0):
        now[0] = t
        taken.append(learner.observe(_report({"a": 20.0, "b": 48.0}), placed.get,
                                     lambda m, b, g: 60.0))
    assert taken == [0, 0, 2]


@pytest.mark.parametrize("extra, learned", [
    ((), True),  # the predictor's figure stands in for the alone estimate not yet trusted
    (((GPU_UTIL, "60"),), False),  # an owner's assertion never does
    (((PREDICTION_SOURCE, "cold-start+mem:xgboost:abc"),), False),  # nor the placeholder
])
def test_pairs_are_learned_before_the_alone_estimates_are_trusted(
        extra: tuple[tuple[str, str], ...], learned: bool) -> None:
    learner = PairLearner()
    placed = {"a": placement("a", util=60.0, annotations=((MODEL, "lm"), *extra)),
              "b": placement("b", util=60.0, annotations=((MODEL, "resnet"),))}
    taken = learner.observe(_report({"a": 20.0, "b": 48.0}), placed.get, lambda m, b, g: None)
    model = learner.model()
    if not learned:
        assert taken == 0 and model is None
        return
    assert taken == 2 and model is not None
    assert model.figure(A100, "lm", "resnet", 1.0) == (pytest.approx(3.0, rel=0.25), "pair:1")
    # a trusted alone estimate, once there, is the baseline instead of the prediction
    learner.observe(_report({"a": 20.0, "b": 48.0}), placed.get,
                    lambda m, b, g: 30.0 if m == "lm" else None)
    assert learner.view()[0]["pairs"][0]["samples"] == 2
    assert learner.view()[0]["pairs"][0]["slowdown"] < 2.5
