"""The Lucid-style share score (``limits.max_share_score``): where progress is not measured,
a GPU takes another training pod only while its pods' tiers sum to at most the limit.
It never judges a pod with progress beside pods with progress, and is off by default."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from extender_builders import A100, measured, node, placement

from contracts.annotations import MODEL, PodInputs
from extender.config.schema import ConfigError, build_config
from extender.core import CostPolicy, DecisionContext, JobDemand, Purpose, evaluate, resolve_demand
from extender.core.pairs import PairModel, TypePairs
from extender.core.reasons import Reason
from extender.core.share_score import over_limit, share_refusals, share_score
from extender.core.table import GpuTable

ON = CostPolicy(min_colocation_gain_percent=0.0, max_share_score=2)
OFF = CostPolicy(min_colocation_gain_percent=0.0)


def _table(*residents: tuple[int, float, tuple[tuple[str, str], ...]]) -> GpuTable:
    table = GpuTable.build([node("n1", count=max(gpu for gpu, *_ in residents) + 1)])
    for k, (gpu, util, ann) in enumerate(residents):
        table.place(placement(f"u{k}", gpus=(gpu,), util=util, mem=1000.0, annotations=ann))
    return table


def _evaluate(table: GpuTable, policy: CostPolicy, util: float, progress: bool,
              purpose: Purpose = Purpose.FILTER) -> Any:
    inputs = PodInputs(model="new", util_percent=util, mem_mib=1000.0)
    demand = resolve_demand(JobDemand(1, inputs, progress=progress), table.type_names, None)
    return evaluate(table, ["n1"], demand, DecisionContext(policy, 0.0), purpose)


def test_tiers_are_thirds_of_the_gpu_and_an_idle_gpu_always_takes_a_job() -> None:
    assert [share_score(u) for u in (0.0, 33.0, 34.0, 66.0, 67.0, 100.0)] == [0, 0, 1, 1, 2, 2]
    assert not over_limit(0, 100.0, [])  # alone, even a jumbo job runs
    assert over_limit(2, 70.0, [50.0]) and not over_limit(2, 70.0, [20.0])
    assert not over_limit(3, 70.0, [50.0])


def test_a_pod_without_progress_is_refused_beside_a_jumbo_job_only_with_the_score_on() -> None:
    table = _table((0, 70.0, ((MODEL, "resnet"),)))
    refused = _evaluate(table, ON, 70.0, progress=False)
    assert refused.rejections["n1"].reason is Reason.COLOCATION_SLOWDOWN
    assert "n1" not in _evaluate(table, OFF, 70.0, progress=False).rejections
    # A tiny newcomer beside it sums to 2: allowed.
    assert "n1" not in _evaluate(table, ON, 20.0, progress=False).rejections


def test_the_score_picks_the_gpu_whose_residents_leave_room() -> None:
    # GPU 0: one medium pod (60%); GPU 1: two tiny ones (62% in all). The curve prefers
    # GPU 0 (less summed utilisation and memory); a jumbo newcomer sums 3 there, 2 on GPU 1.
    table = _table((0, 60.0, ((MODEL, "a"),)), (1, 30.0, ((MODEL, "b"),)),
                   (1, 32.0, ((MODEL, "c"),)))
    assert _evaluate(table, OFF, 70.0, False, Purpose.SCORE).chosen_rows(0) == [0]
    assert _evaluate(table, ON, 70.0, False, Purpose.SCORE).chosen_rows(0) == [1]


@pytest.mark.parametrize("pairs", [None, PairModel({A100: TypePairs()})])
def test_it_never_judges_a_pod_with_progress_beside_pods_with_progress(
        pairs: PairModel | None) -> None:
    on = ON if pairs is None else ON.with_pairs(pairs)
    measured_gpu = _table((0, 70.0, measured("resnet")))
    assert "n1" not in _evaluate(measured_gpu, on, 70.0, progress=True).rejections
    # The pod has progress but the resident names no counter: the score judges that GPU.
    blind_gpu = _table((0, 70.0, ((MODEL, "resnet"),)))
    assert _evaluate(blind_gpu, on, 70.0, progress=True).rejections["n1"].reason \
        is Reason.COLOCATION_SLOWDOWN
    # The pod has none: it judges even beside a measured resident, with or without pairs.
    assert _evaluate(measured_gpu, on, 70.0, progress=False).rejections["n1"].reason \
        is Reason.COLOCATION_SLOWDOWN


def test_the_key_is_off_by_default_and_checked() -> None:
    assert build_config({}).policy.max_share_score is None
    assert build_config({"limits": {"max_share_score": 2}}).policy.max_share_score == 2
    for bad in (-1, 1.5, True, "2", 101):
        with pytest.raises(ConfigError, match="limits.max_share_score"):
            build_config({"limits": {"max_share_score": bad}})


@pytest.mark.parametrize("progress", [False, True])
def test_the_fast_path_agrees_with_the_rule_row_by_row(progress: bool) -> None:
    rng = np.random.default_rng(3)
    table = GpuTable.build([node("n1", count=40)])
    for k in range(70):  # 0-4 pods per GPU, some with a counter; one placed and removed
        ann = measured("m") if rng.random() < 0.5 else ((MODEL, "m"),)
        util = float(rng.choice([20.0, 100.0 / 3.0, 50.0, 200.0 / 3.0, 90.0]))
        table.place(placement(f"u{k}", gpus=(int(rng.integers(40)),), util=util, mem=10.0,
                              annotations=ann))
    gone = placement("gone", gpus=(0,), util=10.1, mem=10.0)
    table.place(gone)
    table.remove(gone)
    rows = np.arange(40)
    got = share_refusals(table, rows, 2, np.array([40.0]), progress=progress)
    want = [not (progress and all(p for *_, p in table.row_models.get(r, ())))
            and over_limit(2, 40.0, [u for _, u, _, _ in table.row_models.get(r, ())])
            for r in range(40)]
    assert got is not None and got.tolist() == want
