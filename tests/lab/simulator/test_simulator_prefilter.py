"""The simulator's pre-filter against the extender core, on random clusters.

``lab.simulator.horus.FreeView`` reads the core's per-GPU rules once per round
and drops nodes before ``evaluate`` runs. These properties hold it to the core: it
never drops a node the core would accept (and, reading the same rules, keeps no
node the core rejects), and the core's verdict is monotone in the demand, which
the pre-filter's scalar bound and its failure points rely on.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.annotations import PodInputs
from extender.core import (
    CostPolicy,
    DecisionContext,
    GpuSpec,
    GpuTable,
    JobDemand,
    NodeSpec,
    Placement,
    Purpose,
    Workload,
    evaluate,
    resolve_demand,
)
from lab.simulator.baselines import node_of_rows
from lab.simulator.engine import JobRun
from lab.simulator.horus import FreeView
from lab.simulator.jobs import SimJob

NOW_SECONDS = 1000.0
GPU_TYPES = ("NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3")
PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw: st.DrawFn) -> GpuTable:
    """Nodes of 1-4 GPUs (equal or ragged counts, one or two types) with random load."""
    nodes = []
    for i in range(draw(st.integers(1, 5))):
        gpu_type = draw(st.sampled_from(GPU_TYPES))
        memory = draw(st.sampled_from([16384.0, 40960.0, 81920.0]))
        count = draw(st.integers(1, 4))
        nodes.append(NodeSpec(f"n{i}", tuple(GpuSpec(g, f"GPU-{i}-{g}", gpu_type, memory)
                                             for g in range(count))))
    table = GpuTable.build(nodes)
    for k in range(draw(st.integers(0, 12))):
        node = draw(st.sampled_from(nodes))
        width = draw(st.integers(1, len(node.gpus)))
        indices = tuple(sorted(draw(st.permutations(range(len(node.gpus))))[:width]))
        serving = draw(st.booleans()) and width == 1 and draw(st.booleans())
        table.place(Placement(
            pod_uid=f"p{k}", pod=f"sim/p{k}", node=node.name, gpu_indices=indices,
            util_percent=draw(st.floats(0.0, 120.0)), mem_mib=draw(st.floats(0.0, 30000.0)),
            workload=Workload.INFERENCE if serving else Workload.TRAINING,
        ), at_seconds=draw(st.floats(NOW_SECONDS - 30.0, NOW_SECONDS)))
    for row in range(len(table.gpus)):
        if draw(st.booleans()):  # an agent report, fresh or stale
            table.observe_rows(slice(row, row + 1), draw(st.floats(0.0, 150.0)),
                               draw(st.floats(0.0, 90000.0)),
                               draw(st.floats(NOW_SECONDS - 30.0, NOW_SECONDS)))
    return table


policies = st.builds(
    CostPolicy,
    max_pods_per_gpu=st.integers(1, 4),
    min_colocation_gain_percent=st.none() | st.floats(0.0, 40.0),
    max_colocated_util_percent=st.none() | st.floats(50.0, 200.0),
)
demands = st.tuples(st.floats(0.0, 100.0), st.floats(0.0, 50000.0))  # (util %, mem MiB)


def core_accepts(table: GpuTable, policy: CostPolicy, gpus_per_task: int, util: float,
                 mem: float) -> list[str]:
    """Nodes where the core would place one task, as the simulator asks it."""
    demand = resolve_demand(JobDemand(gpus_per_task, PodInputs(util_percent=util, mem_mib=mem)),
                            table.type_names, predict=None)
    ev = evaluate(table, table.node_names, demand, DecisionContext(policy, NOW_SECONDS),
                  Purpose.PLACE)
    return ev.feasible_names()


def run_of(gpus_per_task: int, tasks: int, util: float, mem: float) -> JobRun:
    return JobRun(0, SimJob("j", 0.0, 60.0, tasks=tasks, gpus_per_task=gpus_per_task,
                            util_percent=util, mem_mib=mem))


@PROPERTY
@given(clusters(), policies, st.integers(1, 3), st.integers(1, 3), demands)
def test_prefilter_never_drops_a_node_the_core_accepts(table, policy, gpus_per_task, tasks,
                                                       demand):
    util, mem = demand
    view = FreeView(table, node_of_rows(table), policy, NOW_SECONDS)
    kept = view.candidate_nodes(run_of(gpus_per_task, tasks, util, mem))
    accepted = core_accepts(table, policy, gpus_per_task, util, mem)
    assert set(accepted) <= set(kept)
    assert kept == accepted  # the same rules: nothing the core rejects is kept either


@PROPERTY
@given(clusters(), policies, st.integers(1, 3), demands, st.integers(0, 2), demands)
def test_core_verdict_is_monotone_in_the_demand(table, policy, gpus_per_task, demand,
                                                 more_gpus, extra):
    util, mem = demand
    light = core_accepts(table, policy, gpus_per_task, util, mem)
    heavy = core_accepts(table, policy, gpus_per_task + more_gpus, util + extra[0],
                         mem + extra[1])
    assert set(heavy) <= set(light)
