"""The curve is the prior of learned pair figures (extender.core.pair_cost, pairs.can_share).

A GPU judged by pair figures and a GPU judged by the curve compare on one scale: figures
equal to the curve's cost exactly what the curve does, so knowing a resident's pairs moves
a GPU's cost only by what the figures say beyond the curve. Figures completed from other
pairs (never measured) refuse nothing the curve would share; measured ones do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from extender_builders import A100, measured, node, placement

from contracts.annotations import PodInputs
from extender.core import CostPolicy, DecisionContext, JobDemand, Purpose, evaluate, resolve_demand
from extender.core.cost import curve_coefficients, curve_costs
from extender.core.pairs import PairModel, TypePairs, unseen_figure
from extender.core.reasons import Reason
from extender.core.table import GpuTable

GAIN_ON = CostPolicy(min_colocation_gain_percent=0.0)
UTIL = 40.0


def _table(residents: dict[str, str]) -> GpuTable:
    """One GPU per node, each holding one measured pod of the given model."""
    table = GpuTable.build([node(n, count=1) for n in residents])
    for n, model in residents.items():
        table.place(placement(f"u-{n}", node=n, gpus=(0,), util=UTIL, mem=1000.0,
                              annotations=measured(model)))
    return table


def _evaluate(table: GpuTable, policy: CostPolicy) -> Any:
    inputs = PodInputs(model="new", util_percent=UTIL, mem_mib=1000.0)
    demand = resolve_demand(JobDemand(1, inputs, progress=True), table.type_names, None)
    return evaluate(table, list(table.node_index), demand, DecisionContext(policy, 0.0),
                    Purpose.SCORE)


def _curve_slowdown(table: GpuTable, policy: CostPolicy) -> float:
    """The curve's slowdown of two jobs of ``UTIL`` sharing a GPU."""
    coeffs = curve_coefficients(policy, table.type_names)[0]
    return 1.0 + float(curve_costs(np.array([2 * UTIL]), coeffs[None, :])[0])


def _pairs(slowdown: float, source: str, var: float = 0.0001) -> PairModel:
    figure = (math.log(slowdown), var, source)
    return PairModel({A100: TypePairs(progress={("new", "resnet"): figure,
                                                ("resnet", "new"): figure})})


def test_figures_equal_to_the_curves_cost_what_the_curve_does() -> None:
    table = _table({"n1": "resnet", "n2": "other"})  # other: nothing known, the curve judges
    curve = _evaluate(table, GAIN_ON)
    assert curve.node_cost[0] == curve.node_cost[1]
    same = _evaluate(table, GAIN_ON.with_pairs(_pairs(_curve_slowdown(table, GAIN_ON),
                                                      "progress:5")))
    assert same.interference_sources == {0: "progress:5"}
    assert np.allclose(same.node_cost, curve.node_cost)


def test_figures_move_a_gpu_by_what_they_say_beyond_the_curve() -> None:
    table = _table({"n1": "resnet", "n2": "other"})
    s = _curve_slowdown(table, GAIN_ON)
    better = _evaluate(table, GAIN_ON.with_pairs(_pairs(1.0 + (s - 1.0) / 2, "progress:5")))
    worse = _evaluate(table, GAIN_ON.with_pairs(_pairs(1.0 + (s - 1.0) * 1.5, "progress:5")))
    assert better.node_cost[0] < better.node_cost[1]
    assert worse.node_cost[0] > worse.node_cost[1]
    assert better.node_cost[1] == worse.node_cost[1] == _evaluate(table, GAIN_ON).node_cost[1]


def test_completed_figures_refuse_nothing_the_curve_shares() -> None:
    table = _table({"n1": "resnet"})
    losing = 3.0  # 1/3 + 1/3 of the progress: far worse than taking turns
    completed = _evaluate(table, GAIN_ON.with_pairs(_pairs(losing, "completed", var=0.01)))
    assert "n1" not in completed.rejections
    assert completed.node_cost[0] > _evaluate(table, GAIN_ON).node_cost[0]  # but costs more
    assert _pairs(losing, "completed", var=0.01).can_share(A100, "new", "resnet")
    measured_ = _evaluate(table, GAIN_ON.with_pairs(_pairs(losing, "progress:6", var=0.01)))
    assert measured_.rejections["n1"].reason is Reason.COLOCATION_SLOWDOWN
    assert not _pairs(losing, "progress:6", var=0.01).can_share(A100, "new", "resnet")


def test_a_model_never_measured_reads_the_types_measured_pairs_not_the_curve() -> None:
    """Where a GPU type's measured pairs run far slower than the curve says, a GPU whose
    resident was never measured costs what those pairs say, not the curve's mild figure."""
    table = GpuTable.build([node(n, count=1) for n in ("n1", "n2")])  # n2 idle
    table.place(placement("u-n1", node="n1", gpus=(0,), util=UTIL, mem=1000.0,
                          annotations=measured("other")))
    harsh = (math.log(2.0), 0.0001, "progress:4")
    model = PairModel({A100: TypePairs(progress={("a", "b"): harsh, ("b", "a"): harsh,
                                                 ("a", "c"): harsh})})
    assert PairModel({A100: TypePairs(progress={("a", "b"): harsh})}).figure(
        A100, "new", "other", 1.1) == (1.1, "curve")  # too few measured: the curve
    filled = PairModel({A100: TypePairs(progress=model.types[A100].progress,
                                        unseen=unseen_figure(model.types[A100].progress))})
    slowdown, source = filled.figure(A100, "new", "other", 1.1)
    assert source == "features" and math.isclose(slowdown, 2.0)
    curve = _evaluate(table, GAIN_ON)
    learned = _evaluate(table, GAIN_ON.with_pairs(filled))
    # the shared GPU costs more than the curve says, the idle one the same
    assert learned.node_cost[0] > curve.node_cost[0]
    assert learned.node_cost[1] == curve.node_cost[1]
