"""benchmarks/share_score.py: the share score judged by decisions on measured pairs."""

from __future__ import annotations

import numpy as np
from bench_modules import load

from extender.core.cost import CostPolicy

load("_common")
bench = load("share_score")
POLICY = CostPolicy()  # the default curve: 2 / s(u) > 1 below 150% summed


def _pairs(utils: list[tuple[float, float]], combined: list[float]) -> object:
    names = [(f"a{i}", f"b{i}") for i in range(len(utils))]
    return bench.Pairs("gpu", names, np.array([a for a, _ in utils]),
                       np.array([b for _, b in utils]), np.array(combined), 0.01)


def test_a_losing_pair_is_refused_by_a_tuned_score_and_counted() -> None:
    # Two jumbo jobs lose (0.8) though the curve (140% summed) lets them share.
    pairs = _pairs([(70.0, 70.0), (20.0, 30.0), (40.0, 20.0)], [0.8, 1.7, 1.5])
    curve = bench.curve_shares(pairs, POLICY, 0.0)
    assert curve.tolist() == [True, True, True]
    assert bench.outcome(pairs, curve, 0.0)["losers_shared"] == 1
    rule = bench.tune(pairs, curve, 0.0)
    assert rule is not None
    got = bench.outcome(pairs, curve & ~bench.score_refuses(pairs, rule), 0.0)
    assert got == {"value": (1.0 + 1.7 + 1.5) / 3, "best": (1.0 + 1.7 + 1.5) / 3,
                   "losers_shared": 0, "winners_refused": 0, "refused": 1}


def test_with_no_loser_the_tuned_score_is_off_and_random_matches_the_refusals() -> None:
    pairs = _pairs([(70.0, 70.0), (20.0, 30.0), (40.0, 20.0)], [1.1, 1.7, 1.5])
    assert bench.tune(pairs, bench.curve_shares(pairs, POLICY, 0.0), 0.0) is None
    got = bench.methods(pairs, POLICY, 0.0, None, np.random.default_rng(0), draws=20)
    assert got["score_shipped"]["refused"] == 1 == got["random"]["refused"]
    assert got["score_shipped"]["value"] > got["random"]["value"]  # it refuses the weakest


def test_the_h100_campaign_has_no_losing_pair() -> None:
    pairs = bench.load_pairs(bench.CAMPAIGN)
    assert len(pairs.names) == 66 and (pairs.combined >= 1.0).all()
    assert pairs.mem_share < 0.1
