"""Placement policies for the inflation protocol (:mod:`lab.simulator.inflation`).

Baselines as the paper's artifact scores them ("Beware of Fragmentation", USENIX
ATC'23, and its public simulator): each node gets an integer kube-scheduler score
0..100, and among the nodes with the top score the artifact's scheduler takes the
first by name (its kube-scheduler is patched so, "for reproducibility"; names get a
random prefix per run, :func:`~lab.simulator.inflation.tie_order`), so
near-equal placements tie and go to the first node, not ordered by a float.

- ``random``: a uniformly random feasible node, random fitting GPUs on it;
- ``bestfit``: ``100 * (1 - (cpu_left / 128 cores + gpu_left / 8 GPUs) / 2)``
  truncated, the free CPU and GPU after the pod measured against the largest
  node's, not each node's own; the tightest fitting GPU on it;
- ``fgd``: ``100 * sigmoid(-dF / 1000)`` truncated, ``dF`` the growth of the
  node's expected fragmentation (:mod:`extender.core.fragmentation`) in thousandths
  of a GPU; a 1-GPU share goes to the first GPU with its node's top score. The
  workload's shapes are the paper's *typical pods*: the whole pod list's shapes
  (GPUs, share, CPU; memory is not part of a shape), most frequent first, until 95%
  of the pods are covered, weighted by count.

``KubeDefault`` places CPU-only pods as kube-scheduler's default scoring does
(NodeResourcesFit LeastAllocated plus NodeResourcesBalancedAllocation over CPU and
memory, ties at random); ``Split`` sends GPU pods to one policy and CPU-only pods
to another. The tandem policies (tandem's own decision core) are in
:mod:`lab.simulator.packing_tandem`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from extender.core.fragmentation import Pod, Shape, Shapes, placement_deltas, tightest
from lab.simulator.inflation import PackPolicy, PackState, TracePod
from lab.simulator.trace_csv import TracePods

Choice = tuple[int, tuple[int, ...]] | None
MAX_SPEC_CPU = 128_000.0
MAX_SPEC_GPU = 8_000.0
"""Best fit's yardsticks (the artifact's MaxSpecCpu, MaxSpecGpu): the largest node's."""
TYPICAL_POPULARITY = 0.95
"""Typical pods cover this share of the pod list (the artifact's podPopularityThreshold)."""


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


def top_node(state: PackState, nodes: np.ndarray, scores: np.ndarray) -> int:
    """The artifact scheduler's pick among integer scores: the top one first in tie order."""
    top = nodes[scores >= scores.max()]
    return int(top[np.argmin(state.rank[top])])


class BestFit:
    """The artifact's best fit: least free CPU and GPU left, against the largest node's."""

    name = "bestfit"

    def choose(self, state: PackState, pod: TracePod) -> Choice:
        ok, gpus = state.fits(pod.cpu, pod.mem, pod.num_gpu, pod.milli, pod.spec)
        nodes = np.flatnonzero(ok)
        if nodes.size == 0:
            return None
        left = ((state.cpu_free[nodes] - pod.cpu) / MAX_SPEC_CPU * 0.5
                + (state.gpu_free[nodes].sum(axis=1) - pod.num_gpu * pod.milli)
                / MAX_SPEC_GPU * 0.5)
        node = top_node(state, nodes, np.trunc((1.0 - left) * 100.0))
        return node, _gpus_on(state, node, gpus, pod.num_gpu)


def typical_shapes(pods: TracePods, popularity: float = TYPICAL_POPULARITY) -> Shapes:
    """The paper's typical pods: the list's most frequent shapes covering ``popularity``."""
    counts = Counter(Shape(int(g), float(u), float(c), 0.0) for g, u, c in
                     zip(pods.num_gpu.tolist(), pods.gpu_milli.tolist(),
                         pods.cpu_milli.tolist(), strict=True))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].gpus, kv[0].per_gpu,
                                                     kv[0].cpu))
    kept: dict[Shape, float] = {}
    for shape, count in ranked:
        if sum(kept.values()) >= popularity * len(pods):
            break
        kept[shape] = float(count)
    return Shapes.of(kept, "count")


def fgd_scores(delta: np.ndarray) -> np.ndarray:
    """The artifact's integer FGD score of a fragmentation growth (thousandths of a GPU);
    -1 where the pod cannot go."""
    with np.errstate(over="ignore"):
        score = np.trunc(100.0 / (1.0 + np.exp(delta / 1000.0)))
    return np.where(np.isfinite(delta), score, -1.0)


class Fgd:
    """Fragmentation gradient descent as the artifact scores it, over the typical pods."""

    name = "fgd"

    def __init__(self, shapes: Shapes):
        self.shapes = shapes

    def choose(self, state: PackState, pod: TracePod) -> Choice:
        ok, gpus = state.fits(pod.cpu, pod.mem, pod.num_gpu, pod.milli, pod.spec)
        if not ok.any():
            return None
        fits = gpus if pod.num_gpu else np.zeros_like(gpus)
        delta = placement_deltas(state.gpu_free, fits, state.cpu_free, state.mem_free,
                                 self.shapes, Pod(pod.num_gpu, pod.milli, pod.cpu, pod.mem))
        score = fgd_scores(np.where(ok[:, None], delta, np.inf))
        by_node = score.max(axis=1)
        nodes = np.flatnonzero(by_node >= 0)
        if nodes.size == 0:
            return None
        node = top_node(state, nodes, by_node[nodes])
        if pod.num_gpu == 0:
            return node, ()
        if pod.num_gpu == 1:
            return node, (int(np.argmax(score[node])),)
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
