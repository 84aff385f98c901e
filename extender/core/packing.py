"""The packing-aware score: keep GPUs and nodes usable for the pods that will arrive.

Horus's cost rises with a GPU's load, so on its own it picks the emptiest GPU that
passes the rules (worst fit): every shared pod opens a fresh GPU, and the leftovers
fit neither whole-GPU pods nor the common shares. With a workload's shapes known
(:class:`~extender.core.fragmentation.ShapeStats`, learned from the pods seen), a
training pod's cost per GPU becomes::

    cost = w_fragmentation * dF  +  w_fit * fit  +  w_order * order  +  w_interference * horus

- ``dF``: growth of the node's expected fragmentation (FGD, in GPUs) if the pod goes
  to this GPU (a pod of several GPUs: to its node's tightest fitting GPUs). A GPU
  on a node whose CPU or host memory the pod would use up is stranded, and ``dF``
  counts it: every shape that can no longer run there sees all its free GPU as lost.
- ``fit``: best fit, half the GPU's free share after the pod, half its node's, so
  among equal fragmentation the fullest GPU of the fullest node wins, which keeps
  whole GPUs and whole nodes for the pods that need them.
- ``order``: the node's place in a stable order of the nodes (:func:`node_order`, a
  hash of each name; the table's order where none is given), 0..1: among
  placements nearly equal on fragmentation and fit,
  the earlier node, so shares gather on the same nodes and the others stay whole
  (what FGD's integer scores with ties to the first node do in the paper's
  artifact). It is part of ``fit`` where :func:`decisive_term` names the term.
- ``horus``: the interference cost (:func:`extender.core.cost.horus_cost`), a small
  weight by default: it orders what packing leaves tied.

The hard rules are unchanged and come first: only GPUs where sharing pays (the
co-location rule, the learned pairs) are costed at all. :func:`decisive_term` says
which of the three separated the chosen node from the next best.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from extender.core.fragmentation import (
    WEIGHTINGS,
    Pod,
    Shapes,
    padded,
    placement_deltas,
)

TERMS = ("fit", "fragmentation", "interference")


@dataclass(frozen=True)
class PackingPolicy:
    """The packing score's weights and the bounds of its learned workload (``packing:``)."""

    enabled: bool = True
    """False: training pods are costed by Horus alone, as before."""
    w_fragmentation: float = 1.0
    """Weight of the fragmentation growth (GPUs of capacity the arrived shapes lose)."""
    w_fit: float = 0.02
    """Weight of best fit (free share left on the GPU and its node, 0..1)."""
    w_interference: float = 0.02
    """Weight of the Horus cost among packing-equal placements."""
    w_order: float = 0.2
    """Weight of the node's place in a stable order (0..1), a tie-break toward gathering."""
    weighting: str = "count"
    """``count``: shapes weigh by how often they arrive (FGD); ``volume``: times GPU demand."""
    max_shapes: int = 256
    """Distinct shapes remembered; past it the least seen is forgotten."""
    window: int = 10_000
    """Pods after which every shape's count is halved (recent pods weigh more)."""
    live: bool = False
    """True: the extender service costs training pods (and scores pods of no GPU) with the
    shapes it learned from the pods it bound (``extender.core.decide.learned_shapes``)."""

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"packing.weighting {self.weighting!r} "
                             f"(valid: {', '.join(WEIGHTINGS)})")


@dataclass(frozen=True)
class PackingInput:
    """What the packing score reads besides the GPU table, per decision."""

    shapes: Shapes
    cpu_free: np.ndarray | None = None
    """Free CPU (millicores) per table node id; None: not known (never short)."""
    mem_free: np.ndarray | None = None
    """Free host memory (MiB) per table node id; None: not known."""
    pod_cpu: float = 0.0
    pod_mem: float = 0.0
    node_order: np.ndarray | None = None
    """Each table node id's place in the stable node order, 0..1 (:func:`node_order`);
    None: the table's own order."""


def node_order(names: Sequence[str]) -> np.ndarray:
    """A stable order of nodes, 0..1 each: a hash of the name (CRC-32), the same on every
    restart and scattered over GPU types and racks, so the nodes that gather shares are
    a mix of the cluster's, not the first rack of one type (cached: the extender asks
    per decision for a node list that changes rarely)."""
    return _node_order(tuple(names))


@functools.lru_cache(maxsize=8)
def _node_order(names: tuple[str, ...]) -> np.ndarray:
    order = np.array([zlib.crc32(n.encode()) for n in names], dtype=np.float64) / 2.0**32
    order.flags.writeable = False  # shared by every caller of the cache
    return order


@dataclass(frozen=True)
class PackingTerms:
    """Each term per candidate row (the cost is their weighted sum)."""

    fragmentation: np.ndarray
    fit: np.ndarray
    interference: np.ndarray
    rows: np.ndarray | None = None
    """The table row of each entry (set by the caller that knows them)."""
    order: np.ndarray | None = None
    """Each entry's node place in the stable node order, 0..1 (None: no preference)."""


def _host(values: np.ndarray | None, ids: np.ndarray) -> np.ndarray:
    return np.full(ids.size, np.inf) if values is None else values[ids].astype(np.float64)


def packing_terms(free_mib: np.ndarray, capacity_mib: np.ndarray, owner: np.ndarray,
                  node_ids: np.ndarray, fits: np.ndarray, job_mem: float, need: int,
                  packing: PackingInput, interference: np.ndarray) -> PackingTerms:
    """The terms for candidate rows grouped by ``owner`` (positions of ``node_ids``)."""
    positions = node_ids.size
    free = np.maximum(free_mib, 0.0)
    free_matrix, slot = padded(free, owner, positions)
    fit_matrix = padded(fits.astype(np.float64), owner, positions)[0] > 0.5
    delta = placement_deltas(free_matrix, fit_matrix, _host(packing.cpu_free, node_ids),
                             _host(packing.mem_free, node_ids), packing.shapes,
                             Pod(need, job_mem, packing.pod_cpu, packing.pod_mem))
    unit = float(capacity_mib.max()) if capacity_mib.size else 1.0
    fragmentation = delta[owner, slot] / max(unit, 1.0)
    capacity = np.maximum(capacity_mib, 1.0)
    gpu_left = np.clip((free - job_mem) / capacity, 0.0, 1.0)
    node_free = np.bincount(owner, weights=free, minlength=positions)
    node_cap = np.bincount(owner, weights=capacity, minlength=positions)
    node_left = np.clip((node_free - need * job_mem) / node_cap, 0.0, 1.0)[owner]
    if packing.node_order is not None:
        order = packing.node_order[node_ids][owner]
    else:
        order = node_ids[owner] / max(float(node_ids.max()), 1.0) if node_ids.size else node_ids
    return PackingTerms(fragmentation, 0.5 * gpu_left + 0.5 * node_left, interference,
                        order=order.astype(np.float64))


def packing_cost(terms: PackingTerms, policy: PackingPolicy) -> np.ndarray:
    """The weighted sum (module doc)."""
    cost = (policy.w_fragmentation * terms.fragmentation + policy.w_fit * terms.fit
            + policy.w_interference * terms.interference)
    return cost if terms.order is None else cost + policy.w_order * terms.order


def host_only_costs(free: np.ndarray, valid: np.ndarray, cpu_free: np.ndarray,
                    mem_free: np.ndarray, cpu_total: np.ndarray, mem_total: np.ndarray,
                    shapes: Shapes, pod_cpu: float, pod_mem: float, gpu_unit: float,
                    policy: PackingPolicy, order: np.ndarray | None = None) -> np.ndarray:
    """Cost per node of a pod that takes no GPU (``inf`` where its CPU or memory is short).

    Fragmentation growth (the node's GPUs it strands for the arriving shapes) and best
    fit on the host (CPU and memory left, as shares): a CPU-only pod goes where it takes
    the least from GPU pods. ``free``/``valid`` are (nodes, GPUs); ``order`` each node's
    place in the stable node order (:func:`node_order`; their own order without it).
    """
    delta = placement_deltas(np.where(valid, free, 0.0), np.zeros_like(valid), cpu_free,
                             mem_free, shapes, Pod(0, 0.0, pod_cpu, pod_mem))[:, 0]
    left = (np.clip((cpu_free - pod_cpu) / np.maximum(cpu_total, 1.0), 0.0, 1.0)
            + np.clip((mem_free - pod_mem) / np.maximum(mem_total, 1.0), 0.0, 1.0)) / 2
    if order is None:
        order = np.arange(free.shape[0]) / max(free.shape[0] - 1, 1)
    return (policy.w_fragmentation * delta / max(gpu_unit, 1.0) + policy.w_fit * left
            + policy.w_order * order)


def decisive_term(terms: PackingTerms, policy: PackingPolicy, chosen: np.ndarray,
                  runner_up: np.ndarray) -> str:
    """The term that separated the chosen rows from the runner-up's (weighted, summed).

    Both are row indices into ``terms``; the term with the largest weighted advantage
    of the chosen rows names the decision (``fit`` when nothing separates them).
    """
    weights = (1.0, policy.w_fragmentation, policy.w_interference)
    fit = policy.w_fit * terms.fit if terms.order is None else (
        policy.w_fit * terms.fit + policy.w_order * terms.order)
    values = (fit, terms.fragmentation, terms.interference)
    gaps = [w * (float(v[runner_up].mean()) - float(v[chosen].mean()))
            for w, v in zip(weights, values, strict=True)]
    best = int(np.argmax(gaps))
    return TERMS[best] if gaps[best] > 1e-12 else "fit"
