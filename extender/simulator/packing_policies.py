"""Placement policies for the inflation protocol (:mod:`extender.simulator.inflation`).

Baselines written from "Beware of Fragmentation" (USENIX ATC'23), §6:

- ``random``: a uniformly random feasible node, random fitting GPUs on it;
- ``bestfit``: the node with the least free GPU and CPU left (shares of its
  capacity, summed), the tightest fitting GPUs on it;
- ``fgd``: the node and GPUs where the expected fragmentation of the arrived
  workload (:mod:`extender.core.fragmentation`) grows least; ties at random, as
  kube-scheduler picks among equal scores.

``KubeDefault`` places CPU-only pods as kube-scheduler's default scoring does
(NodeResourcesFit LeastAllocated plus NodeResourcesBalancedAllocation over CPU and
memory, ties at random); ``Split`` sends GPU pods to one policy and CPU-only pods
to another. The tandem policies (tandem's own decision core) are in
:mod:`extender.simulator.packing_tandem`.
"""

from __future__ import annotations

import numpy as np

from extender.core.fragmentation import Pod, Shape, ShapeStats, placement_deltas, tightest
from extender.simulator.inflation import PackPolicy, PackState, TracePod

Choice = tuple[int, tuple[int, ...]] | None
_TIE = 1e-9


def shape_of(pod: TracePod) -> Shape:
    """The pod's shape as the fragmentation measure counts it."""
    return Shape(pod.num_gpu, pod.milli, pod.cpu, pod.mem)


def _gpus_on(state: PackState, node: int, gpus: np.ndarray, count: int,
             rng: np.random.Generator | None = None) -> tuple[int, ...]:
    """``count`` fitting GPU slots of ``node``: random ones, else the tightest."""
    fit = gpus[node]
    if rng is not None:
        return tuple(sorted(rng.choice(np.flatnonzero(fit), size=count, replace=False).tolist()))
    taken = tightest(state.gpu_free[node:node + 1], fit[None, :], count)[0]
    return tuple(np.flatnonzero(taken).tolist())


class RandomFit:
    """A uniformly random feasible node and random fitting GPUs."""

    name = "random"

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def choose(self, state: PackState, pod: TracePod) -> Choice:
        ok, gpus = state.fits(pod.cpu, pod.mem, pod.num_gpu, pod.milli, pod.spec)
        nodes = np.flatnonzero(ok)
        if nodes.size == 0:
            return None
        node = int(self.rng.choice(nodes))
        return node, _gpus_on(state, node, gpus, pod.num_gpu, self.rng)


class BestFit:
    """The feasible node left with the least free GPU and CPU (shares), tightest GPUs."""

    name = "bestfit"

    def choose(self, state: PackState, pod: TracePod) -> Choice:
        ok, gpus = state.fits(pod.cpu, pod.mem, pod.num_gpu, pod.milli, pod.spec)
        nodes = np.flatnonzero(ok)
        if nodes.size == 0:
            return None
        gpu_cap = state.valid[nodes].sum(axis=1) * 1000.0
        left = ((state.gpu_free[nodes].sum(axis=1) - pod.num_gpu * pod.milli) / gpu_cap
                + (state.cpu_free[nodes] - pod.cpu) / state.nodes.cpu_milli[nodes])
        node = int(nodes[int(np.argmin(left))])
        return node, _gpus_on(state, node, gpus, pod.num_gpu)


class Fgd:
    """Fragmentation gradient descent: least growth of expected fragmentation, ties at random.

    The workload's shapes are the pods arrived so far (this one included), counted.
    """

    name = "fgd"

    def __init__(self, rng: np.random.Generator, stats: ShapeStats | None = None):
        self.rng = rng
        self.stats = stats or ShapeStats(max_shapes=100_000, window=10**9)

    def choose(self, state: PackState, pod: TracePod) -> Choice:
        self.stats.observe(shape_of(pod))
        ok, gpus = state.fits(pod.cpu, pod.mem, pod.num_gpu, pod.milli, pod.spec)
        if not ok.any():
            return None
        fits = gpus if pod.num_gpu else np.zeros_like(gpus)
        delta = placement_deltas(state.gpu_free, fits, state.cpu_free, state.mem_free,
                                 self.stats.shapes(), Pod(pod.num_gpu, pod.milli, pod.cpu, pod.mem))
        if pod.num_gpu == 0:
            delta = np.where(ok[:, None], delta, np.inf)
        by_node = delta.min(axis=1)
        best = by_node.min()
        if not np.isfinite(best):
            return None
        node = int(self.rng.choice(np.flatnonzero(by_node <= best + _TIE)))
        if pod.num_gpu == 0:
            return node, ()
        if pod.num_gpu == 1:
            slots = np.flatnonzero(delta[node] <= best + _TIE)
            return node, (int(self.rng.choice(slots)),)
        return node, _gpus_on(state, node, gpus, pod.num_gpu)


class KubeDefault:
    """kube-scheduler's default scores for a pod: LeastAllocated + BalancedAllocation."""

    name = "kube-default"

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def choose(self, state: PackState, pod: TracePod) -> Choice:
        ok = state.host_fits(pod.cpu, pod.mem, pod.spec)
        nodes = np.flatnonzero(ok)
        if nodes.size == 0 or pod.num_gpu:
            return None
        cpu = (state.nodes.cpu_milli[nodes] - state.cpu_free[nodes] + pod.cpu) / \
            state.nodes.cpu_milli[nodes]
        mem = (state.nodes.memory_mib[nodes] - state.mem_free[nodes] + pod.mem) / \
            state.nodes.memory_mib[nodes]
        least = ((1 - cpu) + (1 - mem)) / 2 * 100
        balanced = (1 - np.abs(cpu - mem) / 2) * 100
        score = np.floor(least) + np.floor(balanced)  # each plugin's integer score
        top = nodes[score >= score.max()]
        return int(self.rng.choice(top)), ()


class Split:
    """GPU pods to ``gpu``, CPU-only pods to ``cpu_only``."""

    def __init__(self, name: str, gpu: PackPolicy, cpu_only: PackPolicy):
        self.name, self.gpu, self.cpu_only = name, gpu, cpu_only

    def choose(self, state: PackState, pod: TracePod) -> Choice:
        observe = getattr(self.gpu, "observe", None)
        if pod.num_gpu == 0:
            if observe is not None:  # the GPU policy still learns the workload's shapes
                observe(pod)
            return self.cpu_only.choose(state, pod)
        return self.gpu.choose(state, pod)
