"""A measured interference matrix as the pair learner's prior (``learning.pair_prior``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from extender_builders import A100, measured, node, placement

from contracts.annotations import PodInputs
from contracts.interferencefile import (
    InterferenceFileError,
    PairTable,
    load_interference_file,
    parse_interference,
)
from extender.config.loader import load_config
from extender.config.schema import ConfigError
from extender.config.sections import LearningConfig
from extender.core import CostPolicy, DecisionContext, JobDemand, Purpose, evaluate, resolve_demand
from extender.core.pairs import judge_gpu
from extender.core.table import GpuTable
from extender.learning.interference import PairLearner
from extender.learning.learner import Learner

K80 = "NVIDIA-Tesla-K80"
MATRIX = {"interference": {A100: {
    "slowdown": {"new": {"resnet": 3.0, "bert": 1.2}, "resnet": {"new": 2.0},
                 "bert": {"new": 1.1}},
    "cannot_share": [["new", "vgg"]]}}}


def _write(tmp_path: Path, doc: object, name: str = "matrix.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return path


def _tables() -> dict[str, PairTable]:
    problems: list[str] = []
    tables = parse_interference(MATRIX["interference"], "interference", problems)
    assert not problems
    return tables


def test_the_file_reads_the_interference_section_and_names_every_problem(tmp_path: Path) -> None:
    tables = load_interference_file(_write(tmp_path, {**MATRIX, "models": {"ignored": 1}}))
    assert tables[A100].listed("new", "resnet") == 3.0
    assert not tables[A100].can_share("vgg", "new")
    bad = {"interference": {A100: {"slowdown": {"a": {"b": -1, "c": "x"}}, "colour": 1}}}
    with pytest.raises(InterferenceFileError) as err:
        load_interference_file(_write(tmp_path, bad))
    text = " ".join(err.value.problems)
    assert "slowdown.a.b" in text and "slowdown.a.c" in text and "colour: unknown key" in text
    for doc in ({"models": {}}, {"interference": {}}, "interference: {a: 1}\ninterference: {}\n",
                "[1, 2"):
        with pytest.raises(InterferenceFileError):
            load_interference_file(_write(tmp_path, doc))
    with pytest.raises(InterferenceFileError, match="cannot read"):
        load_interference_file(tmp_path / "absent.yaml")


def test_config_reads_the_prior_relative_to_itself_and_refuses_a_bad_one(tmp_path: Path) -> None:
    _write(tmp_path, {"interference": {"NVIDIA Tesla K80": {"slowdown": {"a": {"b": 2.0}}}}})
    config = _write(tmp_path, {"learning": {"pairs": True, "pair_prior": "matrix.yaml"}},
                    "config.yaml")
    learning = load_config(str(config), environ={}).learning
    assert learning.pair_prior == str(tmp_path / "matrix.yaml")
    assert set(learning.pair_prior_tables) == {K80}  # GPU types read canonical
    _write(tmp_path, {"interference": {K80: {"slowdown": {"a": {"b": 0}}}}})
    with pytest.raises(ConfigError) as err:
        load_config(str(config), environ={})
    assert any(p.startswith("learning.pair_prior: ") and "slowdown.a.b" in p
               for p in err.value.problems)
    assert load_config(None, environ={}).learning.pair_prior_tables == {}


def test_the_matrix_decides_before_any_pair_is_seen_and_its_refusals_hold() -> None:
    model = PairLearner(prior=_tables()).model()
    assert model is not None
    assert model.figure(A100, "new", "resnet", 1.5) == (pytest.approx(3.0), "matrix")
    assert model.figure(A100, "new", "other", 1.5) == (1.5, "curve")
    assert not model.can_share(A100, "vgg", "new")
    # a GPU type the matrix does not list takes its pairs (the mean over the types listing
    # them), but not its memory facts: what does not fit on one GPU may fit on another
    assert model.figure(K80, "new", "resnet", 1.5) == (pytest.approx(3.0), "matrix")
    assert model.can_share(K80, "vgg", "new")


def test_other_types_pool_to_the_mean_log_slowdown() -> None:
    both = {A100: PairTable({"a": {"b": 2.0}}), K80: PairTable({"a": {"b": 8.0}})}
    model = PairLearner(prior=both).model()
    assert model is not None
    assert model.figure("NVIDIA-H100", "a", "b", 1.0)[0] == pytest.approx(4.0)
    assert model.figure(K80, "a", "b", 1.0)[0] == pytest.approx(8.0)


def test_pairs_seen_calibrate_the_matrix_and_a_seen_pair_shrinks_toward_it() -> None:
    """A matrix from elsewhere may be off by a factor: what is seen here corrects the rest."""
    tables = {K80: PairTable({f"m{i}": {"x": 1.0 + 0.05 * i} for i in range(41)})}
    learner = PairLearner(prior=tables, prior_weight=0.5)
    errors = []
    for i in range(40):  # here every pair shows twice the matrix's log slowdown
        learner.add(A100, f"m{i}", "x", (1.0 + 0.05 * i) ** 2)
        model = learner.model()
        assert model is not None
        errors.append(abs(math.log(model.figure(A100, "m40", "x", 1.0)[0]) - 2 * math.log(3.0)))
    # the unseen pair's figure closes on what this GPU shows as pairs are seen (from a
    # factor of 3 off to within 20%); ridge toward (0, 1) with the weight of two pairs
    assert errors == sorted(errors, reverse=True)
    assert errors[0] == pytest.approx(math.log(3.0)) and errors[-1] < math.log(1.2)
    alpha, beta = model.types[A100].calibration
    unseen, source = model.figure(A100, "m40", "x", 1.0)
    assert source == "matrix"
    assert math.log(unseen) == pytest.approx(alpha + beta * math.log(3.0))
    seen, source = model.figure(A100, "m39", "x", 1.0)
    prior = alpha + beta * math.log(2.95)
    assert source == "pair:1"
    assert math.log(seen) == pytest.approx((math.log(2.95 ** 2) + 0.5 * prior) / 1.5)
    assert learner.view()[0]["prior"] == {"pairs": 41, "offset": round(alpha, 4),
                                          "scale": round(beta, 4)}
    assert [t["gpu_type"] for t in learner.view()] == [A100, K80]
    assert learner.stats()["prior_pairs"] == 41


def test_an_untried_pair_from_the_matrix_gets_exactly_the_exploration_bonus() -> None:
    plain = PairLearner(prior=_tables(), explore_bonus=0.0).model()
    bonus = PairLearner(prior=_tables(), explore_bonus=0.05).model()
    assert plain is not None and bonus is not None
    a = judge_gpu(plain, A100, "new", ["bert"], [1], lambda i, j: 2.0)
    b = judge_gpu(bonus, A100, "new", ["bert"], [1], lambda i, j: 2.0)
    assert a.source == b.source == "matrix"
    assert b.loss == pytest.approx(max(0.0, a.loss - 0.05))


def test_placement_follows_the_matrix_from_the_first_pod() -> None:
    """With the prior configured, the first newcomer avoids the GPU where it would crawl."""
    cfg = LearningConfig(pairs=True, pair_prior_tables=_tables())
    learner = Learner(cfg, None, clock=lambda: 0.0, wall_clock=lambda: 0.0)  # type: ignore[arg-type]
    policy = learner.knowledge(cfg).policy(CostPolicy())
    table = GpuTable.build([node("n1", count=2)])
    for gpu, model in ((0, "resnet"), (1, "bert")):
        table.place(placement(f"u{gpu}", gpus=(gpu,), util=40.0, mem=1000.0,
                              annotations=measured(model)))
    demand = resolve_demand(JobDemand(1, PodInputs(model="new", util_percent=40.0,
                                                   mem_mib=1000.0), progress=True),
                            table.type_names, None)
    ev = evaluate(table, ["n1"], demand, DecisionContext(policy, 0.0), Purpose.PLACE)
    assert ev.chosen_rows(0) == [1]
    assert ev.interference_sources == {0: "matrix", 1: "matrix"}
    off = learner.knowledge(
        LearningConfig(pairs=False, pair_prior_tables=_tables())).policy(CostPolicy())
    assert off.pairs is None  # the prior is read only where pair learning is on


def test_the_matrix_survives_reset_and_a_reloaded_document_and_is_never_persisted() -> None:
    learner = PairLearner(prior=_tables())
    learner.add(A100, "new", "resnet", 2.0)
    doc = learner.to_document()
    assert doc["pairs"] == [[A100, "new", "resnet", 1, round(math.log(2.0), 6), 0.0]]
    learner.reset()
    model = learner.model()
    assert model is not None and model.figure(A100, "new", "resnet", 1.0)[1] == "matrix"
    learner.load_document(doc)
    model = learner.model()
    assert model is not None and model.figure(A100, "new", "resnet", 1.0)[1] == "pair:1"
    assert model.figure(A100, "new", "bert", 1.0)[1] == "matrix"
