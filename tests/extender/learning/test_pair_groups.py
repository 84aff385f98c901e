"""Pairs learned from GPUs shared by three or more (group samples, docs/interference.md)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from extender_builders import A100, placement
from scipy.optimize import lsq_linear
from scipy.sparse import csr_matrix

from contracts.annotations import MODEL
from contracts.interferencefile import PairTable
from extender.config.loader import load_config
from extender.config.sections import LearningConfig
from extender.core.pairs import judge_gpu
from extender.core.snapshot import GpuSpec
from extender.learning.interference import PairLearner
from extender.learning.learner import Learner
from extender.learning.pair_fit import MAX_EXTRA, least_squares
from extender.ops.metrics import LearnerCollector
from extender.state.reports import DecodedReport, ReportedProcess


def _report(utils: dict[str, float]) -> DecodedReport:
    g = GpuSpec(0, "GPU-n1-0", A100, 40960)
    return DecodedReport(node="n1", gpus=(g,), util_percent=(sum(utils.values()),),
                         memory_used_mib=(2000.0,),
                         processes=(tuple(ReportedProcess(uid, 1000.0, u)
                                          for uid, u in utils.items()),))


def _placed(models: dict[str, str]) -> Any:
    return {uid: placement(uid, util=60.0, annotations=((MODEL, m),))
            for uid, m in models.items()}.get


def test_a_gpu_shared_by_three_gives_each_pod_a_group_sample() -> None:
    learner = PairLearner(group_refit_seconds=0.0)
    learner.add(A100, "lm", "resnet", 2.0)  # lm beside resnet alone: extra 1.0
    placed = _placed({"a": "lm", "b": "resnet", "c": "bert"})
    # lm at 60 alone shows 20 beside resnet and bert: 3x, extra 2.0 = 1.0 (resnet) + 1.0 (bert)
    taken = learner.observe(_report({"a": 20.0, "b": 40.0, "c": 50.0}), placed,
                            lambda m, b, g: 60.0)
    assert taken == 3
    model = learner.model()
    assert model is not None
    value, source = model.figure(A100, "lm", "bert", 1.2)
    assert source == "group:1"
    # one sample, held lightly toward the median of the pairs seen (extra 1.0): near 2.0
    assert value == pytest.approx(2.0, abs=0.1)
    assert model.figure(A100, "lm", "resnet", 1.2)[1] == "pair:1"  # seen pairs keep their own
    assert learner.stats()["groups"] == 3 and learner.stats()["inferred_pairs"] == 5
    view = learner.view()[0]
    assert view["groups"] == 3
    assert {(p["model"], p["beside"]) for p in view["inferred"]} == {
        ("lm", "bert"), ("resnet", "lm"), ("resnet", "bert"), ("bert", "lm"), ("bert", "resnet")}


def test_off_a_gpu_shared_by_three_gives_nothing() -> None:
    learner = PairLearner(groups=False)
    placed = _placed({"a": "lm", "b": "resnet", "c": "bert"})
    assert learner.observe(_report({"a": 20.0, "b": 40.0, "c": 50.0}), placed,
                           lambda m, b, g: 60.0) == 0
    assert learner.model() is None
    assert load_config(None, environ={}).learning.pair_groups is True


def test_a_group_with_a_pod_warming_up_or_unmodelled_gives_nothing() -> None:
    now = [0.0]
    learner = PairLearner(warmup_seconds=60.0, clock=lambda: now[0])
    placed = _placed({"a": "lm", "b": "resnet", "c": "bert"})
    utils = {"a": 20.0, "b": 40.0, "c": 50.0}
    assert learner.observe(_report(utils), placed, lambda m, b, g: 60.0) == 0
    now[0] = 70.0
    assert learner.observe(_report({**utils, "d": 10.0}), placed, lambda m, b, g: 60.0) == 0
    assert learner.observe(_report(utils), placed, lambda m, b, g: 60.0) == 3


def test_a_model_there_twice_counts_twice() -> None:
    learner = PairLearner(group_refit_seconds=0.0)
    for _ in range(5):  # lm beside two resnets: 2.2x, so lm beside one resnet: 1.6x
        learner.add_group(A100, "lm", ["resnet", "resnet"], 2.2)
    model = learner.model()
    assert model is not None
    value, source = model.figure(A100, "lm", "resnet", 1.0)
    assert source == "group:10"
    assert value == pytest.approx(1.6, abs=0.05)


def _truth(n: int, seed: int) -> np.ndarray:
    """Asymmetric pair extras no curve or profile generates: log-normal, pair by pair."""
    rng = np.random.default_rng(seed)
    extra = np.exp(rng.normal(math.log(0.5), 0.8, (n, n)))
    return np.minimum(extra, 5.0)


@pytest.mark.parametrize("seed", range(5))
def test_groups_recover_pairs_never_seen_two_to_a_gpu(seed: int) -> None:
    n = 8
    names = [f"m{i}" for i in range(n)]
    extra = _truth(n, seed)
    rng = np.random.default_rng(100 + seed)
    learner = PairLearner(group_refit_seconds=0.0)
    for i, j in rng.integers(0, n, (6, 2)):  # a few pairs seen two to a GPU
        if i != j:
            learner.add(A100, names[i], names[j], 1.0 + float(extra[i, j]))
    for _ in range(150):  # GPUs shared by three or four, every pod's sum of pair extras
        members = rng.choice(n, size=int(rng.integers(3, 5)), replace=False)
        for a in members:
            others = [b for b in members if b != a]
            learner.add_group(A100, names[a], [names[b] for b in others],
                              1.0 + float(sum(extra[a, b] for b in others)))
    model = learner.model()
    assert model is not None
    solved, median = [], []
    guess = float(np.median(extra))
    for i in range(n):
        for j in range(n):
            value, source = model.figure(A100, names[i], names[j], 1.0 + guess)
            if i != j and source.startswith("group:"):
                solved.append(abs(math.log(value) - math.log1p(extra[i, j])))
                median.append(abs(math.log1p(guess) - math.log1p(extra[i, j])))
    assert len(solved) >= 40
    # the solve is at least three times closer to the truth than a single figure for all
    assert np.mean(solved) < np.mean(median) / 3


def test_the_matrix_keeps_its_pairs_and_anchors_the_ones_it_does_not_list() -> None:
    table = PairTable({"lm": {"resnet": 3.0}}, frozenset())  # lm beside resnet: extra 2.0

    def learned(prior: dict[str, PairTable] | None) -> Any:
        learner = PairLearner(group_refit_seconds=0.0, prior=prior)
        for _ in range(5):
            learner.add_group(A100, "lm", ["bert", "resnet"], 3.5)  # extras sum to 2.5
        model = learner.model()
        assert model is not None
        return model

    with_matrix, without = learned({A100: table}), learned(None)
    assert with_matrix.figure(A100, "lm", "resnet", 1.0) == (pytest.approx(3.0), "matrix")
    bert, source = with_matrix.figure(A100, "lm", "bert", 1.0)
    assert source == "group:5" and bert == pytest.approx(1.5, abs=0.1)  # 2.5 - 2.0
    # without the matrix the crowd cannot tell the two apart: an even split
    even = [without.figure(A100, "lm", b, 1.0)[0] for b in ("bert", "resnet")]
    assert even[0] == pytest.approx(even[1]) == pytest.approx(2.25, abs=0.1)


def test_group_samples_persist_bounded_and_reset() -> None:
    learner = PairLearner(max_entries=2, group_refit_seconds=0.0)
    for k in range(3):
        learner.add_group(A100, f"m{k}", ["x", "y"], 1.5)
    learner.add_group(A100, "m9", ["x", "y"], 50.0)  # clipped to the largest extra
    doc = learner.to_document()
    assert [row[:3] for row in doc["groups"]] == [[A100, "m2", ["x", "y"]],
                                                  [A100, "m9", ["x", "y"]]]
    assert doc["groups"][1][4] == MAX_EXTRA
    again = PairLearner(max_entries=2, group_refit_seconds=0.0)
    assert again.load_document(doc) == 2
    model = again.model()
    assert model is not None and model.figure(A100, "m2", "x", 1.0)[1] == "group:1"
    assert again.load_document({"pairs": []}) == 0  # a document from before groups
    for bad in ([[A100, "a", ["x"], 1, 0.5]], [[A100, "a", ["x", "y"], 0, 0.5]],
                [[A100, "a", ["x", "y"], 1, 25.0]], [[A100, "a", "xy", 1, 0.5]]):
        with pytest.raises(ValueError, match="bad group row"):
            again.load_document({"groups": bad})
    again.load_document(doc)
    again.reset()
    assert again.model() is None and again.to_document()["groups"] == []


def test_the_solve_waits_for_its_refit_interval() -> None:
    now = [0.0]
    learner = PairLearner(clock=lambda: now[0], group_refit_seconds=60.0)
    learner.add_group(A100, "lm", ["bert", "resnet"], 3.0)
    first = learner.model()
    assert first is not None
    before = first.figure(A100, "lm", "bert", 1.0)
    for _ in range(20):
        learner.add_group(A100, "lm", ["bert", "resnet"], 1.2)
    assert learner.model().figure(A100, "lm", "bert", 1.0) == before  # type: ignore[union-attr]
    now[0] = 61.0
    assert learner.model().figure(A100, "lm", "bert", 1.0)[0] < before[0]  # type: ignore[union-attr]


def test_decisions_read_the_model_the_last_report_built(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """The fit and the solve run on the report's path; a decision neither fits nor solves,
    except to see a refusal at once."""
    import extender.learning.interference as pairs_module

    now = [0.0]
    learner = PairLearner(clock=lambda: now[0], group_refit_seconds=60.0)
    placed = _placed({"a": "lm", "b": "resnet", "c": "bert"})
    learner.observe(_report({"a": 20.0, "b": 40.0, "c": 50.0}), placed, lambda m, b, g: 60.0)
    built = learner.current()
    assert built is not None and built.figure(A100, "lm", "bert", 1.0)[1] == "group:1"
    fits = []
    real_fit = pairs_module.fit_profiles
    monkeypatch.setattr(pairs_module, "fit_profiles",
                        lambda *a, **k: fits.append(1) or real_fit(*a, **k))
    learner.add(A100, "lm", "resnet", 2.0)  # a sample outside a report: seen at the next one
    now[0] = 61.0  # and the solve is due
    assert learner.current() is built and not fits
    learner.observe(_report({"a": 20.0, "b": 40.0, "c": 50.0}), placed, lambda m, b, g: 60.0)
    assert len(fits) == 1
    rebuilt = learner.current()
    assert rebuilt is not built and rebuilt.figure(A100, "lm", "resnet", 1.0)[1] == "pair:1"
    assert rebuilt.figure(A100, "lm", "bert", 1.0)[1] == "group:2"  # solved in the report
    learner.refuse(A100, "lm", "bert")
    assert not learner.current().can_share(A100, "lm", "bert")  # type: ignore[union-attr]
    assert len(fits) == 2


def test_placement_reads_a_solved_pair_and_status_and_metrics_show_groups() -> None:
    from contracts.state import decode_state
    from extender.ops.status import summarize
    from extender.ops.status_render import render

    full = Learner(LearningConfig(pairs=True))
    learner = full.pairs = PairLearner(group_refit_seconds=0.0, explore_bonus=0.0)
    for _ in range(5):  # lm suffers beside bert, not beside cnn, seen only in threes
        learner.add_group(A100, "lm", ["bert", "resnet"], 3.5)
        learner.add_group(A100, "lm", ["cnn", "resnet"], 1.5)
        learner.add(A100, "lm", "resnet", 1.2)
    model = learner.model()
    assert model is not None
    beside_bert = judge_gpu(model, A100, "lm", ["bert"], [1], lambda i, j: 1.5)
    beside_cnn = judge_gpu(model, A100, "lm", ["cnn"], [1], lambda i, j: 1.5)
    assert beside_bert.source.startswith("group:") and beside_cnn.loss < beside_bert.loss
    doc = summarize(decode_state({"nodes": {}, "learning": {"pairs": learner.view()}}),
                    "http://x", None)
    assert doc["interference"][0]["inferred_pairs"] == 2  # lm beside bert, and beside cnn
    assert "1 pairs (+2 from groups)" in render(doc)
    families = {f.name: f for f in LearnerCollector(full.stats).collect()}
    kinds = {s.labels["kind"]: s.value
             for s in families["tandem_learning_interference_pairs"].samples}
    assert kinds["groups"] == 2 and kinds["inferred"] == 2


def test_the_persisted_pairs_fit_their_share_of_the_learning_document() -> None:
    learner = PairLearner(max_entries=4000)
    long = "registry.example.com/team/models/" + "m" * 200  # long references, many groups
    for k in range(3000):
        learner.add_group(A100, f"{long}-{k}", [f"{long}-x", f"{long}-y"], 1.5)
    learner.add(A100, "lm", "resnet", 2.0)
    doc = learner.to_document(max_bytes=200_000)
    assert len(json.dumps(doc, separators=(",", ":"))) <= 200_000
    assert doc["pairs"] and doc["groups"]  # the oldest groups went first, the pair stayed
    assert doc["groups"][-1][1] == f"{long}-2999"
    assert len(doc["groups"]) < 3000 == len(learner.to_document()["groups"])


@pytest.mark.parametrize("seed", range(3))
def test_the_bounded_solve_is_the_exact_bounded_least_squares(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = 60
    sparse = (rng.random((150, m)) < 0.05) * rng.uniform(0.5, 2.0, (150, m))
    full = np.vstack([sparse, math.sqrt(0.5) * np.eye(m)])  # with its ridge rows
    y = np.concatenate([rng.normal(1.0, 3.0, 150), np.zeros(m)])  # many fall outside [0, 1]
    exact = lsq_linear(full, y, bounds=(0.0, 1.0), method="bvls").x
    ours = least_squares(csr_matrix(full), y, upper=1.0)
    assert (ours == 0.0).sum() > 5 and (ours == 1.0).sum() > 0  # both bounds are in play
    assert ours == pytest.approx(exact, abs=1e-6)
