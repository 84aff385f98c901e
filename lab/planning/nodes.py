"""What the residual merge works on: the items to place (a session's share with its
latency table) and the open nodes of one GPU type as arrays. Apart from
``lab.planning.merge`` so that the scan and the bounds that merge imports can name them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lab.planning.options import GpuType
from planner.duty_cycle import batch_for
from planner.types import SessionSpec

_EPS = 1e-9


@dataclass(frozen=True, eq=False)
class ItemFit:
    """A residual sized alone on one GPU type (Nexus Eq. 3.1)."""

    duty_ms: float
    """Longest duty cycle the share tolerates alone."""
    latencies: Sequence[float]
    """``l(b)`` for batch 1..max (index 0 is batch 1), for scalar lookups."""
    latency_array: np.ndarray
    """The same latencies as an array, for the vectorised scan."""
    memory_mib: float
    occupancy: float
    """``l(b)/d`` alone at ``duty_ms``."""


@dataclass
class Item:
    """One residual share of a session, sized per GPU type it can run on."""

    session: SessionSpec
    rate: float
    slo_ms: float
    per_type: dict[str, ItemFit]
    origin: str | None = None
    """GPU id that served this share in the previous plan (incremental re-planning)."""


class TypeNodes:
    """The open nodes of one GPU type as parallel arrays (grown by doubling).

    Besides per-node totals, every placed share is a row of flat arrays (node,
    rate, latency-table row), so the nodes' busy times at any shorter cycle are
    one ``bincount``. Latency-table row 0 is all zeros: an emptied node's shares
    point there and weigh nothing.
    """

    def __init__(self, gpu: GpuType, price: float):
        self.gpu, self.price = gpu, price
        self.n = 0
        self.duty, self.busy = np.zeros(16), np.zeros(16)
        self.memory, self.floor = np.zeros(16), np.zeros(16)
        """``floor``: sum of ``l(1)``; no cycle shorter than this hosts the node's shares."""
        self.items: list[list[Item]] = []
        self.m = 0
        self.share_node = np.zeros(16, dtype=np.int64)
        self.share_rate = np.zeros(16)
        self.share_row = np.zeros(16, dtype=np.int64)
        self._rows: dict[int, int] = {}
        self._tables: list[np.ndarray] = [np.zeros(1)]
        self.table = np.zeros((1, 1))

    def open(self) -> int:
        """A new empty node; returns its index."""
        if self.n == len(self.duty):
            self.duty, self.busy, self.memory, self.floor = (
                np.concatenate([a, np.zeros(len(a))])
                for a in (self.duty, self.busy, self.memory, self.floor)
            )
        i = self.n
        self.duty[i], self.busy[i], self.memory[i], self.floor[i] = math.inf, 0.0, 0.0, 0.0
        self.items.append([])
        self.n += 1
        return i

    def busy_all(self, duty_ms: float) -> np.ndarray:
        """Every node's batches' total latency if its cycle were ``duty_ms``."""
        m = self.m
        batches = np.maximum(1, np.ceil(self.share_rate[:m] * duty_ms / 1000.0 - _EPS))
        batches = np.minimum(batches.astype(np.int64), self.table.shape[1]) - 1
        lat = self.table[self.share_row[:m], batches]
        return np.bincount(self.share_node[:m], weights=lat, minlength=self.n)

    def busy_at(self, i: int, duty_ms: float) -> float:
        """Node ``i``'s batches' total latency at ``duty_ms``, summed as ``busy_all`` does."""
        total = 0.0
        for item in self.items[i]:
            lat = item.per_type[self.gpu.name].latencies
            b = batch_for(item.rate, duty_ms)
            total += lat[b - 1] if b <= len(lat) else math.inf
        return total

    def add(self, i: int, item: Item, duty_ms: float, busy_ms: float) -> None:
        """Put ``item`` on node ``i`` with the merged cycle and busy time."""
        fit = item.per_type[self.gpu.name]
        self.items[i].append(item)
        self.duty[i], self.busy[i] = duty_ms, busy_ms
        self.memory[i] += fit.memory_mib
        self.floor[i] += fit.latencies[0]
        if self.m == len(self.share_node):
            self.share_node, self.share_rate, self.share_row = (
                np.concatenate([a, np.zeros_like(a)])
                for a in (self.share_node, self.share_rate, self.share_row)
            )
        self.share_node[self.m], self.share_rate[self.m] = i, item.rate
        self.share_row[self.m] = self._row(fit.latency_array)
        self.m += 1

    def pop(self, i: int) -> None:
        """Undo the last ``add`` (on node ``i``); totals are restored by the caller."""
        self.items[i].pop()
        self.m -= 1

    def close(self, i: int) -> None:
        """Mark node ``i`` unusable (emptied by consolidation)."""
        self.items[i] = []
        self.memory[i] = math.inf
        self.share_row[: self.m][self.share_node[: self.m] == i] = 0

    def _row(self, latencies: np.ndarray) -> int:
        """Row of ``latencies`` in the padded table (inf past a model's largest batch)."""
        row = self._rows.get(id(latencies))
        if row is None:
            row = self._rows[id(latencies)] = len(self._tables)
            self._tables.append(latencies)
            # One inf column past the widest model: a batch beyond a model's
            # largest never fits, for the widest model too.
            width = max(len(t) for t in self._tables) + 1
            table = np.full((len(self._tables), width), np.inf)
            table[0] = 0.0
            for r, t in enumerate(self._tables[1:], start=1):
                table[r, : len(t)] = t
            self.table = table
        return row
