"""Columnar per-GPU table: the snapshot that every decision reads.

One row per GPU, nodes' rows contiguous (``node_start[i]:node_start[i+1]``), so a
filter over 500 candidate nodes is a handful of numpy operations instead of 4,000
Python objects. The table is a plain value with explicit mutators (``place``,
``remove``, ``observe``, ``observe_rows``) and ``copy()`` for checkpoint/undo; the service's
``ClusterState`` is its only writer and holds a lock around every change, the
simulator owns its own copy. Nothing here reads a clock or does I/O. The per-row and
per-pod maps are :class:`~extender.core.cow_map.ShardedMap`: a copy shares their shards
and a write copies one shard, so a placement beside a live snapshot is O(a shard), not
O(cluster).

**Reservations newer than the observation.** Besides the reservation totals,
each row keeps ``since_mib``/``since_util``: the reservations placed *after* the
row's last agent observation, which the observation cannot show yet (the load
rule in :func:`extender.core.cost.effective_load` adds them to it). An
observation resets them to zero. Removing a placement takes it off again only if
it is still newer than the row's observation (an observation generation per row
and one small record per such placement tell); an older placement's load is part
of the observation, which keeps showing it until the next report (the
conservative side).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from contracts.annotations import MODEL
from contracts.gpus import find_gpus
from contracts.pod import names_progress
from extender.core.cow_map import ShardedMap, key_bucket, row_block
from extender.core.snapshot import (
    GpuObservation,
    GpuSpec,
    NodeSpec,
    Placement,
    SessionSpec,
    Workload,
)


class Role(enum.IntEnum):
    """What a GPU is used for; serving and training never share a GPU (DESIGN)."""

    IDLE = 0
    TRAINING = 1
    SERVING = 2


class PlacementError(ValueError):
    """A placement names a node or GPU index the table does not have."""


@dataclass
class GpuTable:
    """Per-GPU columns plus node row ranges. Build with :meth:`build`."""

    node_names: list[str]
    node_index: dict[str, int]
    node_start: np.ndarray
    gpus: list[GpuSpec]
    type_names: list[str]
    type_id: np.ndarray
    capacity_mib: np.ndarray
    reserved_mib: np.ndarray
    reserved_util: np.ndarray
    pod_count: np.ndarray
    training_count: np.ndarray
    training_width: np.ndarray
    """Sum over the row's training pods of each pod's GPU count (a gang's stake in the row)."""
    serving_count: np.ndarray
    observed_util: np.ndarray
    observed_mib: np.ndarray
    observed_at: np.ndarray
    since_mib: np.ndarray
    """Reserved memory placed after the row's observation (not in ``observed_mib`` yet)."""
    since_util: np.ndarray
    """Reserved utilisation placed after the row's observation."""
    observed_gen: np.ndarray
    """Observation generation per row: bumped by every observation of the row."""
    newer: ShardedMap[str, tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]]
    """Per pod uid: (rows, their generations) of placements counted in ``since_*``; tuples,
    replaced rather than changed, so that :meth:`copy` may share them."""
    sessions: ShardedMap[int, tuple[SessionSpec, ...]]
    """SLO sessions per row (rows without any are absent)."""
    best_effort_weight: np.ndarray
    """Sum of the share weights of the best-effort sessions per row."""
    vanished: dict[str, frozenset[str]] = field(default_factory=dict)
    """Per node, GPU UUIDs an agent once reported there that its inventory no longer has."""
    row_models: ShardedMap[int, tuple[tuple[str, float, int, bool], ...]] = field(
        default_factory=lambda: ShardedMap(row_block))
    """Per row, its training pods as (``tandem.io/model`` or "", utilisation, GPU count,
    whether it names a progress counter): what pairwise interference
    (:mod:`extender.core.pair_cost`) reads."""

    @classmethod
    def build(
        cls, nodes: Sequence[NodeSpec], placements: Iterable[Placement] = (),
    ) -> GpuTable:
        """A table for ``nodes`` with ``placements`` applied (unknown targets raise)."""
        names = [n.name for n in nodes]
        gpus = [g for n in nodes for g in sorted(n.gpus, key=lambda g: g.index)]
        starts = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.cumsum([len(n.gpus) for n in nodes], out=starts[1:])
        type_names = sorted({g.gpu_type for g in gpus})
        type_lookup = {t: i for i, t in enumerate(type_names)}
        rows = len(gpus)
        table = cls(
            node_names=names,
            node_index={name: i for i, name in enumerate(names)},
            node_start=starts,
            gpus=gpus,
            type_names=type_names,
            type_id=np.array([type_lookup[g.gpu_type] for g in gpus], dtype=np.int64),
            capacity_mib=np.array([g.memory_mib for g in gpus], dtype=np.float64),
            reserved_mib=np.zeros(rows),
            reserved_util=np.zeros(rows),
            pod_count=np.zeros(rows, dtype=np.int64),
            training_count=np.zeros(rows, dtype=np.int64),
            training_width=np.zeros(rows, dtype=np.int64),
            serving_count=np.zeros(rows, dtype=np.int64),
            observed_util=np.full(rows, np.nan),
            observed_mib=np.full(rows, np.nan),
            observed_at=np.full(rows, -np.inf),
            since_mib=np.zeros(rows),
            since_util=np.zeros(rows),
            observed_gen=np.zeros(rows, dtype=np.int64),
            newer=ShardedMap(key_bucket),
            sessions=ShardedMap(row_block),
            best_effort_weight=np.zeros(rows),
        )
        for placement in placements:
            table.place(placement)
        return table

    def copy(self) -> GpuTable:
        """An independent copy (checkpoint for tentative moves)."""
        return GpuTable(
            node_names=list(self.node_names), node_index=dict(self.node_index),
            node_start=self.node_start.copy(), gpus=list(self.gpus),
            type_names=list(self.type_names), type_id=self.type_id.copy(),
            capacity_mib=self.capacity_mib.copy(), reserved_mib=self.reserved_mib.copy(),
            reserved_util=self.reserved_util.copy(), pod_count=self.pod_count.copy(),
            training_count=self.training_count.copy(),
            training_width=self.training_width.copy(), serving_count=self.serving_count.copy(),
            observed_util=self.observed_util.copy(), observed_mib=self.observed_mib.copy(),
            observed_at=self.observed_at.copy(), since_mib=self.since_mib.copy(),
            since_util=self.since_util.copy(), observed_gen=self.observed_gen.copy(),
            newer=self.newer.copy(),
            sessions=self.sessions.copy(), best_effort_weight=self.best_effort_weight.copy(),
            vanished=dict(self.vanished), row_models=self.row_models.copy(),
        )

    @property
    def role(self) -> np.ndarray:
        """Role per row, derived from the pod counts by kind."""
        return np.where(self.serving_count > 0, Role.SERVING,
                        np.where(self.training_count > 0, Role.TRAINING, Role.IDLE))

    @cached_property
    def gpus_per_node(self) -> int | None:
        """The GPU count every node has, or None when counts differ (or no nodes).

        Cached: the node layout is fixed at :meth:`build` (mutators change only columns).
        """
        counts = np.diff(self.node_start)
        return int(counts[0]) if counts.size and bool((counts == counts[0]).all()) else None

    def node_rows(self, node: str) -> range:
        """Row indices of ``node``'s GPUs (raises KeyError for an unknown node)."""
        i = self.node_index[node]
        return range(int(self.node_start[i]), int(self.node_start[i + 1]))

    def row_of(self, node: str, gpu_index: int) -> int:
        """Row of GPU ``gpu_index`` on ``node``; raises PlacementError."""
        if node not in self.node_index:
            raise PlacementError(f"unknown node {node!r}")
        for row in self.node_rows(node):
            if self.gpus[row].index == gpu_index:
                return row
        raise PlacementError(f"node {node!r} has no GPU {gpu_index}")

    def rows_of(self, p: Placement) -> list[int]:
        """Rows of a placement's GPUs: by UUID when it records one per GPU and the node has
        them all (indices may have been renumbered since), else by index; PlacementError.

        A UUID in ``vanished`` (an agent reported it on this node once, and no longer does)
        means the GPU is gone: its index now names another physical GPU, so the placement
        has no rows rather than wrong ones. An untrusted placement has every row of its node.
        """
        if p.node not in self.node_index:
            raise PlacementError(f"unknown node {p.node!r}")
        rows = self.node_rows(p.node)
        if not p.trusted:  # bound without a recorded decision: every GPU the node has now
            return list(rows)
        vanished = self.vanished.get(p.node, frozenset())
        found = find_gpus(p.gpus, [self.gpus[r] for r in rows], vanished)
        if found is not None:
            return [rows[k] for k in found]
        gone = [g.uuid for g in p.gpus if g.uuid in vanished]
        if gone:
            raise PlacementError(f"node {p.node!r} no longer has GPU {', '.join(gone)}")
        return [self.row_of(p.node, i) for i in p.gpu_indices]

    def place(self, p: Placement, at_seconds: float | None = None) -> None:
        """Add a placement's reservations to its GPUs.

        ``at_seconds`` is when the placement was made (the observations' clock); it
        counts as newer than a row's observation unless it is earlier (a tie counts
        as newer: the conservative side). ``None``
        means "now": newer than every observation applied so far (the incremental case).
        """
        rows = self._apply(p, +1)
        fresh = [r for r in rows if at_seconds is None or at_seconds >= self.observed_at[r]]
        if fresh:
            self.since_mib[fresh] += p.mem_mib
            self.since_util[fresh] += p.util_percent
            gens = tuple(int(g) for g in self.observed_gen[fresh])
            self.newer[p.pod_uid] = (*self.newer.get(p.pod_uid, ()), (tuple(fresh), gens))

    def remove(self, p: Placement) -> None:
        """Take a placement's reservations off its GPUs again."""
        self._apply(p, -1)
        entries = self.newer.get(p.pod_uid)
        if not entries:
            return
        rows, gens = entries[-1]
        if len(entries) > 1:
            self.newer[p.pod_uid] = entries[:-1]
        else:
            del self.newer[p.pod_uid]
        still = [r for r, g in zip(rows, gens, strict=True) if self.observed_gen[r] == g]
        if still:  # still newer than the row's observation: it never showed up there
            self.since_mib[still] = np.maximum(0.0, self.since_mib[still] - p.mem_mib)
            self.since_util[still] = np.maximum(0.0, self.since_util[still] - p.util_percent)

    def _apply(self, p: Placement, sign: int) -> list[int]:
        rows = self.rows_of(p)
        for row in rows:
            self.reserved_mib[row] = max(0.0, self.reserved_mib[row] + sign * p.mem_mib)
            self.reserved_util[row] = max(0.0, self.reserved_util[row] + sign * p.util_percent)
            self.pod_count[row] += sign
            if p.workload is Workload.INFERENCE:
                self.serving_count[row] += sign
                if p.best_effort:
                    self.best_effort_weight[row] = max(
                        0.0, self.best_effort_weight[row] + sign * p.weight)
                elif p.session is not None:
                    current = self.sessions.get(row, ())
                    updated = (*current, p.session) if sign > 0 else tuple(
                        s for s in current if s != p.session)
                    if updated:
                        self.sessions[row] = updated
                    else:
                        self.sessions.pop(row, None)
            else:
                self.training_count[row] += sign
                self.training_width[row] += sign * len(rows)
                self._track_model(row, p, len(rows), sign)
        return rows

    def _track_model(self, row: int, p: Placement, width: int, sign: int) -> None:
        entry = (_model_of(p), p.util_percent, width, names_progress(dict(p.annotations)))
        current = self.row_models.get(row, ())
        if sign > 0:
            self.row_models[row] = (*current, entry)
            return
        if entry in current:
            k = current.index(entry)
            current = current[:k] + current[k + 1:]
        if current:
            self.row_models[row] = current
        else:
            self.row_models.pop(row, None)

    def observe(self, node: str, observations: Iterable[GpuObservation]) -> None:
        """Record an agent's measurements for GPUs of ``node`` (unknown indices ignored)."""
        by_index = {self.gpus[r].index: r for r in self.node_rows(node)}
        for obs in observations:
            row = by_index.get(obs.index)
            if row is not None:
                self.observed_util[row] = obs.util_percent
                self.observed_mib[row] = obs.memory_used_mib
                self.observed_at[row] = obs.observed_at_seconds
                self._reset_since(row)

    def observe_rows(self, rows: np.ndarray | slice, util_percent: np.ndarray,
                     memory_used_mib: np.ndarray, at_seconds: float) -> None:
        """Vectorised :meth:`observe` of many rows at one instant (the simulator's agents)."""
        self.observed_util[rows] = util_percent
        self.observed_mib[rows] = memory_used_mib
        self.observed_at[rows] = at_seconds
        self._reset_since(rows)

    def _reset_since(self, rows: np.ndarray | slice | int) -> None:
        # The observation now shows everything placed before it; records of older
        # generations are recognised (and ignored) at removal, so none is scanned here.
        self.since_mib[rows] = 0.0
        self.since_util[rows] = 0.0
        self.observed_gen[rows] += 1

    def rows_for(self, node_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All rows of the given node ids, and for each row its position in ``node_ids``."""
        starts = self.node_start[node_ids]
        width = self.gpus_per_node
        if width is not None:  # equal nodes: a (nodes, width) grid, no ragged arithmetic
            return ((starts[:, None] + np.arange(width)).ravel(),
                    np.repeat(np.arange(node_ids.size), width))
        counts = self.node_start[node_ids + 1] - starts
        owner = np.repeat(np.arange(node_ids.size), counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return starts[owner] + offsets, owner



def _model_of(p: Placement) -> str:
    for key, value in p.annotations:
        if key == MODEL:
            return value
    return ""
