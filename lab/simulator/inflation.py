"""The inflation protocol (FGD, USENIX ATC'23): how well a placement policy packs a trace.

Pods are drawn from the pod list in a seeded order (a random permutation, then
draws with replacement once the list is used up) as long as their GPU demand stays
within a given share of the cluster's GPU capacity (the first draw that would pass
it ends the list, as the paper's artifact tunes its workload). They are placed one
by one in that order, each once: a pod that fits nowhere fails and is skipped;
nothing departs. The metric is the share of GPU capacity allocated as the arrived
demand grows (``alloc_at``: arrival share in percent -> allocated share), read as
the artifact's analysis reads it: at ``x``% the mean over the pods after which the
arrived share rounds to ``x``.

Nodes have their CPU and memory as kube-scheduler's NodeResourcesFit filter sees
them (requests against allocatable), and a pod may only use nodes of the GPU
models its ``gpu_spec`` names. GPU capacity is in thousandths of a GPU: a 1-GPU pod
takes ``gpu_milli`` of one GPU, a pod of several GPUs whole GPUs. A policy only
chooses among what :meth:`PackState.fits` allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from lab.simulator.trace_csv import WHOLE_GPU_MILLI, TraceNodes, TracePods

DEFAULT_CHECKPOINTS = tuple(range(5, 135, 5))
"""Arrival shares (percent of GPU capacity) where the allocated share is recorded."""


class PackState:
    """Free GPU, CPU and memory per node (GPUs padded to the widest node with capacity 0)."""

    def __init__(self, nodes: TraceNodes, rank: np.ndarray | None = None):
        self.nodes = nodes
        width = int(nodes.gpus.max())
        self.valid = np.arange(width)[None, :] < nodes.gpus[:, None]
        self.gpu_free = np.where(self.valid, float(WHOLE_GPU_MILLI), 0.0)
        self.cpu_free = nodes.cpu_milli.astype(np.float64)
        self.mem_free = nodes.memory_mib.astype(np.float64)
        self.model_names = sorted(set(nodes.models))
        lookup = {m: i for i, m in enumerate(self.model_names)}
        self.model_id = np.array([lookup[m] for m in nodes.models], dtype=np.int64)
        self.allocated_milli = 0.0
        self.rank = np.arange(len(nodes.names)) if rank is None else rank
        """Each node's place in the order ties are broken in (:func:`tie_order`)."""

    @property
    def capacity_milli(self) -> float:
        """The cluster's GPU capacity."""
        return float(self.nodes.gpu_capacity_milli)

    def host_fits(self, cpu: float, mem: float, spec: frozenset[str] = frozenset()) -> np.ndarray:
        """Nodes whose CPU, memory and GPU model admit the pod (NodeResourcesFit, gpu_spec)."""
        ok = (self.cpu_free >= cpu) & (self.mem_free >= mem)
        if spec:
            allowed = [i for i, m in enumerate(self.model_names) if m in spec]
            ok &= np.isin(self.model_id, allowed)
        return ok

    def gpu_fits(self, num_gpu: int, milli: float) -> np.ndarray:
        """(nodes, GPUs): GPUs with room for one of the pod's GPUs (whole GPUs need all 1000)."""
        return self.valid & (self.gpu_free >= milli) if num_gpu else np.zeros_like(self.valid)

    def fits(self, cpu: float, mem: float, num_gpu: int, milli: float,
             spec: frozenset[str] = frozenset()) -> tuple[np.ndarray, np.ndarray]:
        """Feasible nodes and, per node, the GPUs the pod may use."""
        gpus = self.gpu_fits(num_gpu, milli) & self.host_fits(cpu, mem, spec)[:, None]
        if num_gpu == 0:
            return self.host_fits(cpu, mem, spec), gpus
        return gpus.sum(axis=1) >= num_gpu, gpus

    def place(self, node: int, gpus: Sequence[int], cpu: float, mem: float,
              milli: float) -> None:
        """Take a pod's resources on ``node`` (``gpus``: slots, each giving ``milli``)."""
        self.cpu_free[node] -= cpu
        self.mem_free[node] -= mem
        for g in gpus:
            self.gpu_free[node, g] -= milli
        self.allocated_milli += milli * len(gpus)

    def free_whole_gpus(self) -> int:
        """GPUs nobody uses at all."""
        return int((self.valid & (self.gpu_free >= WHOLE_GPU_MILLI)).sum())


def tie_order(count: int, seed: int) -> np.ndarray:
    """Each node's rank on one seed: the artifact's scheduler breaks ties by node name,
    and names each node with a random prefix per run, so ties go by a random order of
    the nodes drawn once per run (the same for every policy on the seed)."""
    return np.random.default_rng([seed, 0x7E]).permutation(count)


@dataclass(frozen=True)
class TracePod:
    """One arriving pod as policies see it."""

    index: int
    cpu: float
    mem: float
    num_gpu: int
    milli: float
    spec: frozenset[str]


class PackPolicy(Protocol):
    """Chooses a node and GPU slots for a pod, or None: the pod fails."""

    name: str

    def choose(self, state: PackState, pod: TracePod) -> tuple[int, tuple[int, ...]] | None: ...


def arrival_order(pods: TracePods, capacity_milli: float, share: float,
                  rng: np.random.Generator) -> np.ndarray:
    """Pod indices arriving while their GPU demand stays within ``share`` of the capacity."""
    demand = pods.gpu_demand_milli.astype(np.float64)
    if demand.sum() <= 0:
        raise ValueError("the pod list asks for no GPU: no arrival share to reach")
    target = share * capacity_milli
    order = rng.permutation(len(pods))
    while demand[order].sum() <= target:
        extra = rng.integers(0, len(pods), size=max(len(pods) // 4, 1))
        order = np.concatenate([order, extra])
    cumulative = np.cumsum(demand[order])
    return order[: int(np.searchsorted(cumulative, target, side="right"))]


@dataclass
class PackResult:
    """What one run of the protocol measured."""

    policy: str
    alloc_at: dict[str, float]
    """Arrival share (percent) -> allocated share of the GPU capacity (percent)."""
    failed_by_gpus: dict[str, int]
    """GPUs the failed pods asked for ("0" = CPU-only) -> how many failed."""
    free_whole_gpus: int
    arrived: int
    extra: dict[str, object] = field(default_factory=dict)


def run_inflation(nodes: TraceNodes, pods: TracePods, order: np.ndarray, policy: PackPolicy,
                  checkpoints: Sequence[int] = DEFAULT_CHECKPOINTS,
                  rank: np.ndarray | None = None) -> PackResult:
    """Place ``pods[order]`` one by one under ``policy``; ``alloc_at`` each checkpoint.

    A checkpoint no pod's arrived share rounds to takes the pods within a point of it,
    as the artifact's analysis does; one a single pod jumped past, the state after that
    pod; one beyond the arrivals, the state at the end. ``rank``: the nodes' tie order
    (:func:`tie_order`; file order without it).
    """
    state = PackState(nodes, rank)
    capacity = state.capacity_milli
    marks = sorted(checkpoints)
    near: dict[int, list[float]] = {m: [] for m in marks}
    exact: dict[int, list[float]] = {m: [] for m in marks}
    passed: dict[int, float] = {}
    failed: dict[str, int] = {}
    arrived_milli = 0.0
    demand = pods.gpu_demand_milli
    for i in order.tolist():
        pod = TracePod(i, float(pods.cpu_milli[i]), float(pods.memory_mib[i]),
                      int(pods.num_gpu[i]), float(pods.gpu_milli[i]), pods.gpu_spec[i])
        choice = policy.choose(state, pod)
        if choice is None:
            key = str(pod.num_gpu)
            failed[key] = failed.get(key, 0) + 1
        else:
            node, gpus = choice
            if len(gpus) != pod.num_gpu:
                raise RuntimeError(f"{policy.name} gave {len(gpus)} GPUs for {pod.num_gpu}")
            state.place(node, gpus, pod.cpu, pod.mem, pod.milli)
        arrived_milli += float(demand[i])
        arrived = round(100.0 * arrived_milli / capacity)
        allocated = 100.0 * state.allocated_milli / capacity
        for mark in (arrived - 1, arrived, arrived + 1):
            if mark in near:
                near[mark].append(allocated)
                if mark == arrived:
                    exact[mark].append(allocated)
        for mark in marks:
            if mark not in passed and arrived_milli >= mark / 100.0 * capacity:
                passed[mark] = allocated
    end = 100.0 * state.allocated_milli / capacity
    alloc_at = {str(m): float(np.mean(exact[m] or near[m])) if near[m] else passed.get(m, end)
                for m in marks}
    by_gpus = dict(sorted(failed.items(), key=lambda kv: int(kv[0])))
    return PackResult(policy.name, alloc_at, by_gpus, state.free_whole_gpus(), int(order.size))
