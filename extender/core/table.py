"""Columnar per-GPU table: the snapshot that every decision reads.

One row per GPU, nodes' rows contiguous (``node_start[i]:node_start[i+1]``), so a
filter over 500 candidate nodes is a handful of numpy operations instead of 4,000
Python objects. The table is a plain value with explicit mutators (``place``,
``remove``, ``observe``) and ``copy()`` for checkpoint/undo; the service's
``ClusterState`` is its only writer and holds a lock around every change, the
simulator owns its own copy. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from extender.core.model import (
    GpuObservation,
    GpuSpec,
    NodeSpec,
    Placement,
    SessionSpec,
    Workload,
    gpu_type_of,
)


class Role(enum.IntEnum):
    """What a GPU is used for; serving and training never share a GPU (DESIGN)."""

    IDLE = 0
    TRAINING = 1
    SERVING = 2


ROLE_OF = {Workload.TRAINING: Role.TRAINING, Workload.INFERENCE: Role.SERVING}


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
    serving_count: np.ndarray
    observed_util: np.ndarray
    observed_mib: np.ndarray
    observed_at: np.ndarray
    sessions: dict[int, tuple[SessionSpec, ...]]
    """SLO sessions per row (rows without any are absent)."""
    best_effort_weight: np.ndarray
    """Sum of the share weights of the best-effort sessions per row."""

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
            serving_count=np.zeros(rows, dtype=np.int64),
            observed_util=np.full(rows, np.nan),
            observed_mib=np.full(rows, np.nan),
            observed_at=np.full(rows, -np.inf),
            sessions={},
            best_effort_weight=np.zeros(rows),
        )
        for placement in placements:
            table.place(placement)
        return table

    def copy(self) -> GpuTable:
        """An independent copy (checkpoint for tentative moves)."""
        return GpuTable(
            list(self.node_names), dict(self.node_index), self.node_start.copy(), list(self.gpus),
            list(self.type_names), self.type_id.copy(), self.capacity_mib.copy(),
            self.reserved_mib.copy(), self.reserved_util.copy(), self.pod_count.copy(),
            self.training_count.copy(), self.serving_count.copy(), self.observed_util.copy(),
            self.observed_mib.copy(), self.observed_at.copy(), dict(self.sessions),
            self.best_effort_weight.copy(),
        )

    @property
    def role(self) -> np.ndarray:
        """Role per row, derived from the pod counts by kind."""
        return np.where(self.serving_count > 0, Role.SERVING,
                        np.where(self.training_count > 0, Role.TRAINING, Role.IDLE))

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

    def place(self, p: Placement) -> None:
        """Add a placement's reservations to its GPUs."""
        self._apply(p, +1)

    def remove(self, p: Placement) -> None:
        """Take a placement's reservations off its GPUs again."""
        self._apply(p, -1)

    def _apply(self, p: Placement, sign: int) -> None:
        rows = [self.row_of(p.node, i) for i in p.gpu_indices]
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

    def observe(self, node: str, observations: Iterable[GpuObservation]) -> None:
        """Record an agent's measurements for GPUs of ``node`` (unknown indices ignored)."""
        by_index = {self.gpus[r].index: r for r in self.node_rows(node)}
        for obs in observations:
            row = by_index.get(obs.index)
            if row is not None:
                self.observed_util[row] = obs.util_percent
                self.observed_mib[row] = obs.memory_used_mib
                self.observed_at[row] = obs.observed_at_seconds

    def rows_for(self, node_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All rows of the given node ids, and for each row its position in ``node_ids``."""
        starts = self.node_start[node_ids]
        counts = self.node_start[node_ids + 1] - starts
        owner = np.repeat(np.arange(node_ids.size), counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return starts[owner] + offsets, owner


def nodes_of(table: GpuTable) -> list[NodeSpec]:
    """The inventory a table was built from (for rebuilding with a changed node set)."""
    return [
        NodeSpec(name, tuple(table.gpus[r] for r in table.node_rows(name)))
        for name in table.node_names
    ]


def gpu_type_index(table: GpuTable, product: str) -> int | None:
    """Type id of ``product`` in ``table`` (None when no GPU of that type exists)."""
    name = gpu_type_of(product)
    return table.type_names.index(name) if name in table.type_names else None
