"""Learned pair figures place only pods whose progress is measured (``tandem.io/progress``).

A pod without a progress counter, or a GPU holding one, is judged by the memory rules and
the curve: exactly as with no learned pairs, pairs seen not to fit in memory still refused.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from extender_builders import A100, MEASURED, measured, node, placement, pod

from contracts.annotations import MODEL, PROGRESS, PodInputs
from contracts.pod import PodView
from extender.core import CostPolicy, DecisionContext, JobDemand, Purpose, evaluate, resolve_demand
from extender.core.demand import parse_demand
from extender.core.pairs import PairModel, TypePairs
from extender.core.reasons import Reason
from extender.core.table import GpuTable

GAIN_ON = CostPolicy(min_colocation_gain_percent=0.0)
# Beside resnet the newcomer barely slows, but resnet crawls; beside bert both slow 1.4x.
LEARNED = {("new", "resnet"): (math.log(1.2), 0.001, "progress:4"),
           ("resnet", "new"): (math.log(3.0), 0.001, "progress:4"),
           ("new", "bert"): (math.log(1.4), 0.001, "progress:4"),
           ("bert", "new"): (math.log(1.4), 0.001, "progress:4")}


def _model(cannot: frozenset[frozenset[str]] = frozenset(), learned: bool = True) -> PairModel:
    return PairModel({A100: TypePairs(progress=LEARNED if learned else {}, cannot=cannot)})


def _table(residents: dict[int, tuple[tuple[str, str], ...]]) -> GpuTable:
    table = GpuTable.build([node("n1", count=len(residents))])
    for gpu, ann in residents.items():
        table.place(placement(f"u{gpu}", gpus=(gpu,), util=40.0, mem=1000.0, annotations=ann))
    return table


def _evaluate(table: GpuTable, policy: CostPolicy, progress: bool) -> Any:
    inputs = PodInputs(model="new", util_percent=40.0, mem_mib=1000.0)
    demand = resolve_demand(JobDemand(1, inputs, progress=progress), table.type_names, None)
    return evaluate(table, ["n1"], demand, DecisionContext(policy, 0.0), Purpose.SCORE)


def _same(a: Any, b: Any) -> bool:
    return a.chosen_rows(0) == b.chosen_rows(0) and np.array_equal(a.node_cost, b.node_cost) \
        and a.interference_sources == b.interference_sources


def test_a_pod_without_progress_is_placed_as_if_nothing_were_learned() -> None:
    table = _table({0: measured("resnet"), 1: measured("bert")})
    with_progress = _evaluate(table, GAIN_ON.with_pairs(_model()), progress=True)
    assert with_progress.chosen_rows(0) == [1]  # the learned pair: resnet would crawl
    assert with_progress.interference_sources == {0: "progress:4", 1: "progress:4"}
    blind = _evaluate(table, GAIN_ON.with_pairs(_model()), progress=False)
    curve = _evaluate(table, GAIN_ON, progress=False)
    assert curve.chosen_rows(0) == [0]  # equal utilisation: the curve takes the first GPU
    assert _same(blind, curve)


def test_a_gpu_holding_a_pod_without_progress_is_judged_by_the_curve() -> None:
    # resnet on GPU 0 names no counter: its slowdown beside the newcomer is never measured.
    table = _table({0: ((MODEL, "resnet"),), 1: measured("bert")})
    ev = _evaluate(table, GAIN_ON.with_pairs(_model()), progress=True)
    assert ev.chosen_rows(0) == [0]
    assert ev.interference_sources == {1: "progress:4"}
    curve = _evaluate(table, GAIN_ON, progress=True)
    assert ev.node_cost[0] == curve.node_cost[0]


def test_the_memory_rule_still_refuses_a_pair_seen_not_to_fit() -> None:
    table = _table({0: measured("resnet"), 1: measured("bert")})
    cannot = frozenset({frozenset(("new", "bert"))})
    refused = _evaluate(table, GAIN_ON.with_pairs(_model(cannot)), progress=False)
    only_memory = _evaluate(table, GAIN_ON.with_pairs(_model(cannot, learned=False)),
                            progress=False)
    assert refused.chosen_rows(0) == [0]
    assert _same(refused, only_memory)
    # A losing pair is a learned figure: it refuses only pods whose progress is measured.
    losing = PairModel({A100: TypePairs(progress=LEARNED,
                                        losing=frozenset({frozenset(("new", "resnet"))}))})
    assert _evaluate(_table({0: measured("resnet")}), GAIN_ON.with_pairs(losing),
                     progress=True).rejections["n1"].reason is Reason.COLOCATION_SLOWDOWN
    assert math.isfinite(_evaluate(_table({0: measured("resnet")}), GAIN_ON.with_pairs(losing),
                                   progress=False).node_cost[0])


def test_the_flag_is_read_from_a_counter_that_parses() -> None:
    good = pod("p", 1, model="m.onnx", progress=MEASURED[1])
    bad = pod("p", 1, model="m.onnx", progress="port=x,steps=s")
    assert PodView.of(good).reports_progress and parse_demand(good).progress
    assert not PodView.of(bad).reports_progress and not parse_demand(bad).progress
    assert not parse_demand(pod("p", 1, model="m.onnx")).progress
    table = _table({0: measured("a"), 1: ((MODEL, "b"), (PROGRESS, "steps=s"))})
    assert [entry[3] for r in (0, 1) for entry in table.row_models[r]] == [True, False]


def test_a_gpu_where_nothing_is_known_of_the_pods_pairs_is_judged_by_the_curve() -> None:
    table = _table({0: measured("resnet"), 1: measured("bert")})
    known = PairModel({A100: TypePairs(progress={("bert", "gpt"): (0.2, 0.01, "progress:3"),
                                                  ("gpt", "bert"): (0.2, 0.01, "progress:3")})})
    ev = _evaluate(table, GAIN_ON.with_pairs(known), progress=True)
    assert _same(ev, _evaluate(table, GAIN_ON, progress=True))
    assert ev.interference_sources == {}
