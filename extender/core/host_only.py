"""Pods that take no GPU, on nodes with GPUs: the deployment where tandem's profile sees every pod.

A pod without ``tandem.io/gpu`` still uses CPU and host memory of the GPU node it
lands on, and a GPU whose node has no CPU or memory left is stranded. Where the
admin routes such pods to tandem's scheduler profile (docs/configuration.md,
``route_namespaces`` / ``route_node_label`` of the admission webhook), the extender
filters them on host CPU and memory and scores them with the packing score's host
form (:func:`extender.core.packing.host_only_costs`): the node where the pod strands
the least GPU capacity for the learned shapes, then the fullest host. Without learned
shapes (or with ``packing.enabled: false``) every node that fits scores 0 and
kube-scheduler's own scores decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from extender.core.cost import scores_from_costs
from extender.core.fragmentation import Shapes, padded
from extender.core.packing import host_only_costs, node_order
from extender.core.rules import GpuLoad
from extender.core.snapshot import Snapshot

_UNKNOWN = 1e18


@dataclass(frozen=True)
class HostOnlyVerdict:
    """Per candidate name: whether the pod's CPU and memory fit, and its 0..10 score."""

    names: tuple[str, ...]
    feasible: np.ndarray
    scores: tuple[int, ...]
    reasons: dict[str, str]
    """Why each infeasible node was refused."""


def host_only_verdict(snap: Snapshot, names: Sequence[str], pod_cpu: float, pod_mem: float,
                      shapes: Shapes | None) -> HostOnlyVerdict:
    """Filter and score a pod of no GPU asking for ``pod_cpu`` millicores and ``pod_mem``
    MiB (``shapes``: the learned workload, None for no packing score)."""
    cpu_free, mem_free, cpu_total, mem_total = snap.hosts.arrays(names)
    ok = (cpu_free >= pod_cpu) & (mem_free >= pod_mem)
    reasons = {n: (f"tandem: node {n} has {max(c, 0.0):.0f}m CPU and {max(m, 0.0):.0f} MiB "
                   f"memory free; the pod requests {pod_cpu:.0f}m and {pod_mem:.0f} MiB")
               for n, c, m, fits in zip(names, cpu_free.tolist(), mem_free.tolist(),
                                        ok.tolist(), strict=True) if not fits}
    scores = np.zeros(len(names), dtype=np.int64)
    if shapes is not None and ok.any():
        free, valid = _gpu_free(snap, names)
        # a host whose figures are not known is costed as an empty one (never short)
        unknown = ~(np.isfinite(cpu_total) & np.isfinite(mem_total))
        cpu_free, mem_free, cpu_total, mem_total = (np.where(unknown, _UNKNOWN, a) for a in (
            cpu_free, mem_free, cpu_total, mem_total))
        cost = host_only_costs(free, valid, cpu_free, mem_free, cpu_total, mem_total, shapes,
                               pod_cpu, pod_mem, float(snap.table.capacity_mib.max(initial=1.0)),
                               snap.policy.packing, node_order(names))
        cost = np.where(ok, cost, np.inf)
        fine = np.isfinite(cost)
        if fine.any():
            scores[fine] = scores_from_costs(cost[fine], best_alone=True)
    return HostOnlyVerdict(tuple(names), ok, tuple(scores.tolist()), reasons)


def _gpu_free(snap: Snapshot, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(names, GPUs) free GPU memory and which slots are GPUs (nodes without GPUs: none)."""
    table = snap.table
    ids = np.array([table.node_index.get(n, -1) for n in names], dtype=np.int64)
    known = np.flatnonzero(ids >= 0)
    if known.size == 0:
        return np.zeros((len(names), 1)), np.zeros((len(names), 1), dtype=bool)
    rows, owner = table.rows_for(ids[known])
    owner = known[owner]
    load = GpuLoad.read(table, rows, snap.policy, snap.now, with_util=False)
    free = padded(np.maximum(load.free_mib, 0.0), owner, len(names))[0]
    valid = padded(np.ones(rows.size), owner, len(names))[0] > 0.5
    return free, valid
