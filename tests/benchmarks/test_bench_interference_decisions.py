"""benchmarks/interference_decisions.py: decisions valued on the measured matrix, taking
turns where sharing loses, and losing pairs counted once measured."""

from __future__ import annotations

import math

import numpy as np
from bench_modules import load

load("_common")
bench = load("interference_decisions")

# four jobs: 0 and 1 win together (combined 1.6), 2 and 3 lose (0.8), the rest break even
TRUTH = np.array([[np.inf, 1.25, 2.0, 2.0],
                  [1.25, np.inf, 2.0, 2.0],
                  [2.0, 2.0, np.inf, 2.5],
                  [2.0, 2.0, 2.5, np.inf]])


def test_the_best_decision_takes_turns_where_sharing_loses() -> None:
    c = bench.combined(TRUTH)
    assert c[2, 3] == np.float64(0.8)
    pairs = bench.match(np.maximum(c, 1.0))
    assert pairs == [(0, 1), (2, 3)]
    assert bench.value(pairs, {(0, 1)}, TRUTH) == np.float64((1.6 + 1.0) / 2)
    assert bench.value(pairs, {(0, 1), (2, 3)}, TRUTH) < bench.value(pairs, {(0, 1)}, TRUTH)


def test_a_losing_pair_placed_again_once_measured_is_counted() -> None:
    learned: list[tuple[int, int]] = []

    def always_share(learning: bool) -> tuple[np.ndarray, np.ndarray]:
        weight = np.zeros((4, 4))
        weight[0, 1] = weight[1, 0] = weight[2, 3] = weight[3, 2] = 1.0
        return weight, np.ones((4, 4), dtype=bool)

    rounds = bench.run_rounds(TRUTH, 2, always_share,
                              lambda i, j, x, y: learned.append((i, j)),
                              np.random.default_rng(0), 0.0)
    # (2, 3) is measured in the first round; after k rounds the count is the final
    # decision's (1 once measured) plus the learning rounds' after the first (k - 1)
    assert [r["losing_placed"] for r in rounds] == [0, 1, 2]
    assert learned == [(0, 1), (2, 3), (0, 1), (2, 3)]


def test_the_progress_learner_refuses_the_measured_loser() -> None:
    jobs = ["a", "b", "c", "d"]
    rounds = bench.progress(jobs, TRUTH, None, 3, np.random.default_rng(1), 0.066)
    assert rounds[-1]["losing_placed"] == 0
    assert rounds[-1]["winning_refused"] == 0  # (0, 1) at 1.6 is measured to win
    assert rounds[-1]["value"] >= 1.0  # never below exclusive GPUs
    assert math.isfinite(rounds[-1]["while_learning"])


def test_the_k0_transfer_compares_the_completed_spread_with_the_truths() -> None:
    jobs = ["a", "b", "c", "d"]
    flat = np.where(np.isfinite(TRUTH), 1.5, np.inf)  # the other GPU shows no pair apart
    same = bench.transfer(jobs, TRUTH, TRUTH)
    assert same["true_sd"] == same["other_sd"] > 0.1
    assert same["correlation"] > 0.5
    assert bench.transfer(jobs, TRUTH, flat)["other_sd"] == 0.0
