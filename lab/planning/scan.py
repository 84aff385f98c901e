"""MergeNodes against every open node of one GPU type: one rule, two evaluation strategies.

For a residual ``item`` and each open node, the merge rule (Nexus MergeNodes) is:

- the node must have room for the model's memory and must not host the session;
- case 1, the node's cycle ``D`` is no longer than the item's longest ``d``: the
  cycle stays, the item runs ``ceil(r*D)`` and the batches must fit in ``D``;
- case 2, the item's cycle is shorter: the node shrinks to ``d``, every share is
  re-batched to ``ceil(r_k*d)`` and the batches must fit in ``d``.

Each case yields its best node (highest resulting occupancy, lowest index on a
tie). ``scan_vector`` evaluates the rule with numpy over all nodes at once;
``scan_scalar`` walks the nodes in plain Python. Numpy's fixed cost per call
dominates when there are few nodes, so ``scan`` picks the scalar walk below
``SCALAR_MAX_NODES``. Both perform the same floating-point operations in the same
order (``bincount`` adds a node's shares in insertion order, as the scalar sum
does), so they return identical candidates; the tests check this.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lab.planning.nodes import ItemFit, TypeNodes

_EPS = 1e-9

SCALAR_MAX_NODES = 128
"""Open nodes up to which the scalar walk is faster (measured on the benchmark's profiles)."""

Candidate = tuple[float, int, float, float]
"""(resulting occupancy, node index, merged duty cycle ms, merged busy ms)."""


def batch_at(rate_rps: float, duty_ms: float) -> int:
    """``ceil(r*d)`` (at least 1), tolerant of float noise like ``batch_for``."""
    return max(1, math.ceil(rate_rps * duty_ms / 1000.0 - _EPS))


def scan(nodes: TypeNodes, rate: float, fit: ItemFit, banned: Collection[int]) -> list[Candidate]:
    """Case 1's then case 2's best node for the item (each only if one is feasible)."""
    if nodes.n <= SCALAR_MAX_NODES:
        return scan_scalar(nodes, rate, fit, banned)
    return scan_vector(nodes, rate, fit, banned)


def scan_vector(
    nodes: TypeNodes, rate: float, fit: ItemFit, banned: Collection[int]
) -> list[Candidate]:
    """The merge rule over every node at once (numpy)."""
    out: list[Candidate] = []
    n = nodes.n
    duty, busy = nodes.duty[:n], nodes.busy[:n]
    ok = nodes.memory[:n] + fit.memory_mib <= nodes.gpu.memory_mib + _EPS
    for j in banned:
        ok[j] = False
    # Case 1: the node's cycle is the shorter one and stays.
    keep = ok & (duty <= fit.duty_ms)
    if keep.any():
        where = np.flatnonzero(keep)
        d = duty[where]
        batches = np.maximum(1, np.ceil(rate * d / 1000.0 - _EPS)).astype(np.int64)
        new_busy = busy[where] + fit.latency_array[batches - 1]
        occ = np.where(new_busy <= d + _EPS, new_busy / d, -1.0)
        k = int(np.argmax(occ))
        if occ[k] > 0:
            out.append((float(occ[k]), int(where[k]), float(d[k]), float(new_busy[k])))
    # Case 2: the item's cycle is shorter; re-batch the node's sessions.
    d_item = fit.duty_ms
    own = fit.latencies[batch_at(rate, d_item) - 1]
    shrink = ok & (duty > d_item) & (nodes.floor[:n] + own <= d_item + _EPS)
    if shrink.any():
        cand = np.flatnonzero(shrink)
        total = own + nodes.busy_all(d_item)[cand]
        occ = np.where(total <= d_item + _EPS, total / d_item, -1.0)
        k = int(np.argmax(occ))
        if occ[k] > 0:
            out.append((float(occ[k]), int(cand[k]), d_item, float(total[k])))
    return out


def scan_scalar(
    nodes: TypeNodes, rate: float, fit: ItemFit, banned: Collection[int]
) -> list[Candidate]:
    """The merge rule node by node (plain Python; faster for a few nodes)."""
    n = nodes.n
    duty = nodes.duty[:n].tolist()
    busy = nodes.busy[:n].tolist()
    memory = nodes.memory[:n].tolist()
    floor = nodes.floor[:n].tolist()
    capacity = nodes.gpu.memory_mib + _EPS
    lat = fit.latencies
    d_item = fit.duty_ms
    own = lat[batch_at(rate, d_item) - 1]
    best1: Candidate | None = None
    best2: Candidate | None = None
    for j in range(n):
        if memory[j] + fit.memory_mib > capacity or j in banned:
            continue
        d = duty[j]
        if d <= d_item:
            new_busy = busy[j] + lat[batch_at(rate, d) - 1]
            if new_busy <= d + _EPS:
                occ = new_busy / d
                if best1 is None or occ > best1[0]:
                    best1 = (occ, j, d, new_busy)
        elif floor[j] + own <= d_item + _EPS:
            total = own + nodes.busy_at(j, d_item)
            if total <= d_item + _EPS:
                occ = total / d_item
                if best2 is None or occ > best2[0]:
                    best2 = (occ, j, d_item, total)
    return [c for c in (best1, best2) if c is not None]
