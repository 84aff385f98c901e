"""benchmarks/interference_decisions.py: decisions valued on the measured matrix, taking
turns where sharing loses, and losing pairs counted once measured."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from bench_modules import load
from extender_builders import A100, measured, node, placement

from contracts.annotations import PodInputs
from extender.core import DecisionContext, JobDemand, Purpose, evaluate, resolve_demand
from extender.core.pairs import PairModel, TypePairs
from extender.core.table import GpuTable

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


# The benchmark judges pairs by the product's rule: its decisions equal the extender's.

def _product(figures: dict[tuple[str, str], tuple[float, str]],
             cannot: frozenset[frozenset[str]] = frozenset(),
             losing: frozenset[frozenset[str]] = frozenset()) -> Any:
    tp = TypePairs(progress={k: (math.log(s), 0.0004, src) for k, (s, src) in figures.items()},
                   cannot=cannot, losing=losing)
    return PairModel({A100: tp, bench.GPU_TYPE: tp}, explore_bonus=bench.EXPLORE_BONUS)


def _extender(model: Any, residents: dict[str, str]) -> Any:
    """The extender's evaluation of a pod of model "new" on one GPU per resident."""
    table = GpuTable.build([node(n, count=1) for n in residents])
    for n, m in residents.items():
        table.place(placement(f"u-{n}", node=n, gpus=(0,), util=40.0, mem=1000.0,
                              annotations=measured(m)))
    demand = resolve_demand(JobDemand(1, PodInputs(model="new", util_percent=40.0,
                                                   mem_mib=1000.0), progress=True),
                            table.type_names, None)
    return evaluate(table, list(table.node_index), demand,
                    DecisionContext(bench.POLICY.with_pairs(model), 0.0), Purpose.SCORE)


def _both(slow: float, source: str) -> dict[tuple[str, str], tuple[float, str]]:
    return {("new", "old"): (slow, source), ("old", "new"): (slow, source)}


def test_the_benchmarks_share_decisions_are_the_extenders() -> None:
    cases = {"measured winner": (_product(_both(1.25, "progress:3")), True),
             "measured below taking turns": (_product(_both(2.5, "progress:3")), False),
             "completed below taking turns": (_product(_both(2.5, "completed")), True),
             "does not fit": (_product(_both(1.25, "progress:3"),
                                       cannot=frozenset({frozenset(("new", "old"))})), False),
             "refused as losing": (_product(_both(1.25, "progress:3"),
                                            losing=frozenset({frozenset(("new", "old"))})), False)}
    for name, (model, expected) in cases.items():
        _, share = bench.product_decisions(["new", "old"], model)
        extender = "n1" not in _extender(model, {"n1": "old"}).rejections
        assert bool(share[0, 1]) == extender == expected, name


def test_the_benchmarks_weights_rank_partners_as_the_extenders_costs() -> None:
    figures = {("new", "a"): (1.2, "progress:2"), ("a", "new"): (1.3, "progress:2"),
               ("new", "b"): (1.5, "progress:2"), ("b", "new"): (1.4, "progress:2"),
               ("new", "c"): (1.35, "completed"), ("c", "new"): (1.35, "completed")}
    model = _product(figures)
    weight, share = bench.product_decisions(["new", "a", "b", "c"], model)
    assert share[0, 1:].all()
    cost = _extender(model, {"n1": "a", "n2": "b", "n3": "c"}).node_cost
    # higher weight (combined progress) is lower cost, the exploration bonus included
    assert list(np.argsort(-weight[0, 1:])) == list(np.argsort(cost))
