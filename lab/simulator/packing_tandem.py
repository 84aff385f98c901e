"""tandem's own decision core under the inflation protocol (:mod:`lab.simulator.inflation`).

Each GPU pod is one call of :func:`extender.core.decide.evaluate`, the function
behind ``/filter``, ``/prioritize`` and ``/bind``, on the nodes kube-scheduler's
NodeResourcesFit lets through, and the node is picked as kube-scheduler picks
from the extender's 0..10 scores (the first best). GPUs are modelled as 1000 MiB
each and a pod of ``gpu_milli`` asserts ``mem_mib = gpu_milli`` and
``util_percent = gpu_milli / 10``, so the core's memory rules are the trace's GPU
shares. The workload's shapes are learned from the pods as they arrive
(:class:`~extender.core.fragmentation.ShapeStats`, bounded as the policy says)
and, with the nodes' free CPU and memory and their stable order (a hash of each
name, :func:`~extender.core.packing.node_order`), handed to the core as its
``DecisionContext.packing``.

``tandem`` also places the CPU-only pods (the deployment where tandem's profile
scores every pod bound for GPU nodes: :func:`extender.core.packing.host_only_costs`);
``tandem-gpu-only`` leaves them to kube-scheduler's default scores.
"""

from __future__ import annotations

import numpy as np

from contracts.annotations import PodInputs
from contracts.gpus import GpuSpec
from extender.core import CostPolicy
from extender.core.choice import choose, decided_by
from extender.core.decide import DecisionContext, Purpose, evaluate
from extender.core.demand import JobDemand, ResolvedDemand, resolve_demand
from extender.core.fragmentation import ShapeStats
from extender.core.packing import PackingInput, host_only_costs, node_order
from extender.core.snapshot import NodeName, NodeSpec
from extender.core.table import GpuTable
from lab.simulator.inflation import PackState, TracePod
from lab.simulator.packing_policies import Choice, shape_of
from lab.simulator.trace_csv import WHOLE_GPU_MILLI, TraceNodes

GPU_MIB = float(WHOLE_GPU_MILLI)
"""Each GPU's memory in the core's table: one MiB per thousandth of a GPU."""


def trace_table(nodes: TraceNodes) -> GpuTable:
    """The core's GPU table for the trace's nodes (GPUs of ``GPU_MIB``, typed by model)."""
    return GpuTable.build([
        NodeSpec(NodeName(name), tuple(GpuSpec(i, "", model, GPU_MIB) for i in range(count)))
        for name, count, model in zip(nodes.names, nodes.gpus.tolist(), nodes.models,
                                      strict=True)])


class TandemCore:
    """tandem's core placing the trace's GPU pods (and, with ``cpu_only``, the others)."""

    def __init__(self, name: str, nodes: TraceNodes, policy: CostPolicy, *,
                 cpu_only: bool = True, packing: bool = True):
        self.name, self.policy, self.cpu_only = name, policy, cpu_only
        self.packing = packing and policy.packing.enabled
        self.table = trace_table(nodes)
        self.order = node_order(self.table.node_names)
        self.stats = ShapeStats(policy.packing.max_shapes, policy.packing.window)
        self._demands: dict[tuple[int, float], ResolvedDemand] = {}
        self.decided: dict[str, int] = {}
        """How many placements each packing term decided (:func:`decisive_term`)."""

    def observe(self, pod: TracePod) -> None:
        """Learn the pod's shape (it arrived, whoever places it)."""
        self.stats.observe(shape_of(pod))

    def _demand(self, pod: TracePod) -> ResolvedDemand:
        key = (pod.num_gpu, pod.milli)
        found = self._demands.get(key)
        if found is None:
            job = JobDemand(pod.num_gpu, PodInputs(util_percent=pod.milli / 10.0,
                                                   mem_mib=pod.milli))
            found = self._demands[key] = resolve_demand(job, self.table.type_names, None)
        return found

    def choose(self, state: PackState, pod: TracePod) -> Choice:
        self.observe(pod)
        ok = state.host_fits(pod.cpu, pod.mem, pod.spec)
        if not ok.any():
            return None
        if pod.num_gpu == 0:
            return self._cpu_only(state, pod, ok) if self.cpu_only else None
        names = [self.table.node_names[i] for i in np.flatnonzero(ok).tolist()]
        packing = PackingInput(self.stats.shapes(self.policy.packing.weighting),
                               state.cpu_free, state.mem_free, pod.cpu, pod.mem, self.order) \
            if self.packing else None
        ev = evaluate(self.table, names, self._demand(pod),
                      DecisionContext(self.policy, 0.0, packing=packing), Purpose.PLACE)
        if not ev.feasible.any():
            return None
        position = int(np.argmax(np.array(ev.scores())))  # kube-scheduler: the first best
        placement = choose(ev, position, f"p{pod.index}", f"trace/{pod.index}")
        if placement is None:
            return None
        term = decided_by(ev, position) or "interference"
        self.decided[term] = self.decided.get(term, 0) + 1
        self.table.place(placement)
        return self.table.node_index[placement.node], placement.gpu_indices

    def _cpu_only(self, state: PackState, pod: TracePod, ok: np.ndarray) -> Choice:
        shapes = self.stats.shapes(self.policy.packing.weighting)
        cost = host_only_costs(state.gpu_free, state.valid, state.cpu_free, state.mem_free,
                               state.nodes.cpu_milli, state.nodes.memory_mib, shapes,
                               pod.cpu, pod.mem, GPU_MIB, self.policy.packing, self.order)
        cost = np.where(ok, cost, np.inf)
        self.decided["cpu-only"] = self.decided.get("cpu-only", 0) + 1
        return int(np.argmin(cost)), ()
