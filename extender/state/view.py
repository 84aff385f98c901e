"""A snapshot rendered as the ``/v1/state`` contract value and metric rows.

Pure functions over a :class:`extender.core.Snapshot` (no lock: nothing in it changes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contracts.state import (
    StateDocument,
    StateGpu,
    StateNode,
    StatePod,
    bounded_annotations,
    encode_state,
)
from extender.core import GpuSpec, GpuTable, PlacementError, Snapshot
from extender.state.placements import PlacementLedger


def document(snap: Snapshot, learning: Mapping[str, Any] | None = None,
             node: str | None = None) -> StateDocument:
    """The ``GET /v1/state`` document of ``snap`` (a ``ClusterState`` snapshot); with
    ``node``, that node only (each agent asks for its own: O(its GPUs), not O(cluster))."""
    ledger = snap.placements
    assert isinstance(ledger, PlacementLedger), "a ClusterState snapshot"
    return state_document(snap.table, ledger, snap.policy.staleness_seconds, snap.now,
                          snap.synced, learning, node)


def encoded(snap: Snapshot) -> dict[str, Any]:
    """The encoded ``/v1/state`` document without ``learning`` (tests, operators)."""
    return encode_state(document(snap))


def metric_rows(snap: Snapshot) -> list[tuple[str, GpuSpec, float, float | None]]:
    """(node, gpu, predicted util, fresh observed util) per GPU of ``snap``, for metrics."""
    return gpu_rows(snap.table, snap.policy.staleness_seconds, snap.now)


def state_document(table: GpuTable, ledger: PlacementLedger, staleness_seconds: float,
                   now: float, synced: bool, learning: Mapping[str, Any] | None = None,
                   node: str | None = None) -> StateDocument:
    """The ``GET /v1/state`` document; with ``node``, that node only (O(its GPUs))."""
    t = table
    pods_by_row: dict[int, list[StatePod]] = {}
    entries = ledger.on_node(node) if node is not None else \
        [*(("placed", p) for p in ledger.placed()), *(("assumed", p) for p in ledger.assumed())]
    for state, p in entries:
        try:
            rows = t.rows_of(p)
        except PlacementError:
            continue
        notes, omitted = bounded_annotations(p.annotations)
        owner = {i: c for c, indices in p.containers for i in indices}
        for row, index in zip(rows, p.gpu_indices, strict=False):
            pods_by_row.setdefault(row, []).append(StatePod(
                state if p.trusted else "untrusted", p.workload.value, p.util_percent,
                p.mem_mib, p.pod, p.pod_uid, notes, omitted,
                container=owner.get(index) if p.trusted else None))
    nodes = []
    names = t.node_names if node is None else [n for n in (node,) if n in t.node_index]
    for name in names:
        gpus = []
        for row in t.node_rows(name):
            g = t.gpus[row]
            fresh = now - float(t.observed_at[row]) <= staleness_seconds
            gpus.append(StateGpu(
                g.index, g.uuid, g.product, g.memory_mib,
                reserved_mib=float(t.reserved_mib[row]),
                predicted_util=float(t.reserved_util[row]),
                observed_util=float(t.observed_util[row]) if fresh else None,
                observed_mib=float(t.observed_mib[row]) if fresh else None,
                observed_at=float(t.observed_at[row]) if fresh else None,
                pods=tuple(sorted(pods_by_row.get(row, []), key=lambda d: d.pod or "")),
            ))
        nodes.append(StateNode(name, tuple(gpus)))
    placed, assumed = sum(1 for _ in ledger.placed()), len(ledger.assumed())
    untrusted = ledger.untrusted
    return StateDocument(tuple(nodes), synced, placed - untrusted, assumed, learning,
                         untrusted=untrusted)


def gpu_rows(table: GpuTable, staleness_seconds: float, now: float,
             ) -> list[tuple[str, GpuSpec, float, float | None]]:
    """(node, gpu, predicted util, fresh observed util) per GPU, for metrics."""
    t = table
    out = []
    for name in t.node_names:
        for row in t.node_rows(name):
            fresh = now - float(t.observed_at[row]) <= staleness_seconds
            out.append((name, t.gpus[row], float(t.reserved_util[row]),
                        float(t.observed_util[row]) if fresh else None))
    return out
