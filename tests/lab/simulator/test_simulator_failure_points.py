"""The simulator's failure points under learned pairs.

A job that failed this round turns away, without asking the core, every job needing at
least as much (:class:`lab.simulator.horus.FreeView`). Learned pairs refuse per model (a
pair seen not to fit in memory), so under them a failure proves nothing about a job of
another model: it must still be placed where it fits.
"""

from __future__ import annotations

from extender_builders import A100, node, placement

from contracts.annotations import MODEL, PodInputs
from extender.core import CostPolicy, JobDemand, resolve_demand
from extender.core.pairs import PairModel, TypePairs
from extender.core.table import GpuTable
from extender.queue.fair import QueueConfig
from lab.simulator.baselines import node_of_rows
from lab.simulator.engine import JobRun
from lab.simulator.horus import FreeView, HorusSettings, place_with_core
from lab.simulator.jobs import SimJob

CANNOT = PairModel({A100: TypePairs(cannot=frozenset({frozenset(("new", "bert"))}))})
POLICY = CostPolicy(min_colocation_gain_percent=0.0)


def _table() -> GpuTable:
    """Two GPUs, each running a bert pod (memory to spare for any newcomer here)."""
    table = GpuTable.build([node("n1", count=2)])
    for gpu in (0, 1):
        table.place(placement(f"u{gpu}", gpus=(gpu,), util=20.0, mem=1000.0,
                              annotations=((MODEL, "bert"),)))
    return table


def _run(idx: int, model: str, mem: float) -> JobRun:
    return JobRun(idx, SimJob(f"j{idx}", 0.0, 60.0, util_percent=20.0, mem_mib=mem,
                              model=model))


def _place(view: FreeView, run: JobRun, policy: CostPolicy) -> list | None:
    demand = resolve_demand(JobDemand(1, PodInputs(model=run.job.model, util_percent=20.0,
                                                   mem_mib=run.job.mem_mib)),
                            view.table.type_names, None)
    return place_with_core(view, run, HorusSettings(policy, QueueConfig()), demand)


def test_a_model_refused_by_its_pairs_does_not_turn_away_other_models() -> None:
    table = _table()
    policy = POLICY.with_pairs(CANNOT)
    view = FreeView(table, node_of_rows(table), policy, 0.0)
    refused = _run(0, "new", 2000.0)
    assert _place(view, refused, policy) is None  # both GPUs hold bert: refused by the pair
    view.record_failure(refused)
    heavier = _run(1, "resnet", 4000.0)
    assert not view.fails(heavier)  # it was turned away before: memory alone was compared
    assert _place(view, heavier, policy) is not None
    assert view.fails(_run(2, "new", 3000.0))  # the same model, heavier: still turned away


def test_without_learned_pairs_a_failure_turns_away_every_heavier_job() -> None:
    table = _table()
    view = FreeView(table, node_of_rows(table), POLICY, 0.0)
    view.record_failure(_run(0, "new", 2000.0))
    assert view.fails(_run(1, "resnet", 4000.0))
    assert not view.fails(_run(2, "resnet", 1000.0))
