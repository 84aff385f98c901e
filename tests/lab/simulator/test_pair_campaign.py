"""A small pair-profiling campaign on a simulated GPU type, imported as the product imports one
(lab.simulator.pair_campaign)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from contracts.interferencefile import PairTable
from extender.config.loader import load_config
from lab.simulator.pair_campaign import (
    Campaign,
    campaign_pairs,
    campaign_prior,
    renamed,
    write_campaign,
)

MODELS = [f"M{i}-bs{8 * (i + 1)}" for i in range(9)] + ["A3C"]
TYPE = "NVIDIA-Tesla-P100"


def _truth() -> PairTable:
    slowdown = {a: {b: 1.0 + 0.1 * i + 0.03 * j for j, b in enumerate(MODELS)}
                for i, a in enumerate(MODELS)}
    return PairTable(slowdown, frozenset({frozenset(("M0-bs8", "M1-bs16"))}))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_each_model_is_measured_beside_k_partners_by_a_seeded_rule(k: int) -> None:
    pairs = campaign_pairs(MODELS, k, seed=[5, 1])
    degree = Counter(m for p in pairs for m in p)
    assert set(degree.values()) == {k} and len(pairs) == len(MODELS) * k // 2
    assert all(a != b for a, b in pairs)
    assert campaign_pairs(MODELS, k, seed=[5, 1]) == pairs  # seeded
    assert campaign_pairs(MODELS, k, seed=[6, 1]) != pairs
    with pytest.raises(ValueError, match="k must be"):
        campaign_pairs(MODELS, len(MODELS), seed=1)


def test_the_campaign_reaches_the_learner_through_the_import_and_the_config(
        tmp_path: Path) -> None:
    truth = _truth()
    pairs = campaign_pairs(MODELS, 3, seed=[1, 1])
    where = tmp_path / TYPE
    write_campaign(where, "NVIDIA Tesla P100", truth, pairs,
                   {m: (40.0, 2000.0) for m in MODELS}, seed=[1, 2])
    base = load_config(None, environ={}).learning
    cfg = campaign_prior(where, base, MODELS)
    assert cfg.pairs and not base.pairs and cfg.pair_prior is not None
    assert set(cfg.pair_prior_tables) == {TYPE}
    table = cfg.pair_prior_tables[TYPE]
    measured = {(a, b) for a, row in table.slowdown.items() for b in row}
    cannot = frozenset(("M0-bs8", "M1-bs16"))
    expected = {(a, b) for p in pairs if frozenset(p) != cannot for a, b in (p, p[::-1])}
    assert measured == expected  # the pairs measured, both ways, and no other
    assert table.cannot_share == ({cannot} if tuple(sorted(cannot)) in pairs else set())
    logs = [math.log(table.slowdown[a][b] / truth.slowdown[a][b]) for a, b in measured]
    assert 0.0 < max(abs(x) for x in logs) < 0.3  # measured once, with the progress noise
    assert "A3C" in table.models()  # profiled at batch 1, named as its pods name it
    assert cfg.pair_prior_tables == load_config(
        str(where.parent / f"{TYPE}-config.yaml"), environ={}).learning.pair_prior_tables


def test_another_types_matrix_joins_the_same_prior_file(tmp_path: Path) -> None:
    other = {"NVIDIA-Tesla-K80": PairTable({"M0-bs8": {"M2-bs24": 1.5}}, frozenset())}
    where = tmp_path / TYPE
    write_campaign(where, "NVIDIA Tesla P100", _truth(), campaign_pairs(MODELS, 2, seed=3),
                   {m: (40.0, 2000.0) for m in MODELS}, seed=4)
    cfg = campaign_prior(where, load_config(None, environ={}).learning, MODELS, other)
    assert set(cfg.pair_prior_tables) == {TYPE, "NVIDIA-Tesla-K80"}
    assert cfg.pair_prior_tables["NVIDIA-Tesla-K80"] == other["NVIDIA-Tesla-K80"]


def test_a_bad_campaign_is_a_clear_error(tmp_path: Path) -> None:
    where = tmp_path / TYPE
    where.mkdir()
    with pytest.raises(ValueError, match="import-interference --profiled failed"):
        campaign_prior(where, load_config(None, environ={}).learning, MODELS)


def test_names_and_cost() -> None:
    table = PairTable({"A3C-bs1": {"M0-bs8": 1.2}}, frozenset({frozenset(("A3C-bs1", "M1"))}))
    back = renamed(table, ["A3C", "M0-bs8"])
    assert back.slowdown == {"A3C": {"M0-bs8": 1.2}}
    assert back.cannot_share == {frozenset(("A3C", "M1"))}
    assert Campaign(tuple(campaign_pairs(MODELS, 3, seed=1)), runs=25).gpu_seconds == 75.0
