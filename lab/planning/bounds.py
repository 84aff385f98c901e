"""A valid lower bound on the GPUs any Nexus plan needs: the yardstick for large workloads.

Under Nexus's rules a session share of rate ``r`` on a GPU with duty cycle ``d``
runs a batch ``b >= r*d`` with ``l(b) <= d`` and ``d + l(b) <= L`` (alone, back to
back, ``d = l(b)``: the ``2*l(b)`` rule). It occupies ``l(b)/d`` of that GPU, and

    l(b)/d >= l(b) / min(b/r, L - l(b))        (d <= b/r and d <= L - l(b))

over the batches with ``2*l(b) <= L``. Call the smallest right-hand side ``g(r)``.
``g(r) >= r/T`` (``T`` the best throughput under ``2*l(b) <= L``, the textbook
bound), and it is larger at low rates, where a short SLO caps the duty cycle and
the batch's fixed cost dominates. ``g(r)/r`` never grows with ``r``, so ``g`` is
subadditive: splitting a session over several GPUs never lowers its total share,
and ``g(R)`` bounds the session however the plan splits it.

Memory adds two integral terms. A session whose model cannot share a GPU with any
other session's model (``memory + smallest other memory > capacity``) uses whole
GPUs, at least ``ceil(R/T)``. Two sessions whose models each need more than half
a GPU never share one, so the GPUs left over host at least one share each of them.

``CostFloor`` applies the same two terms to the residual items of one packing run:
``merge_best`` stops trying orders once a pass reaches it.

The bound assumes round-robin dispatch (Nexus). Harpagon's batch-aware dispatch
lets dedicated GPUs run batches the ``2*l(b)`` rule forbids, so it does not bound
plans made with that switch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lab.planning.options import GpuType
from planner.types import SessionSpec
from predictor.batching import BatchingProfile

if TYPE_CHECKING:
    from lab.planning.nodes import Item, ItemFit

_EPS = 1e-9


@dataclass(frozen=True)
class LowerBound:
    """GPUs any feasible Nexus plan needs, and the parts the bound is made of."""

    gpus: int
    throughput_only: int
    """``ceil(sum R/T)``: the textbook bound, for comparison."""
    exclusive_gpus: int
    """GPUs that memory forces to host one session alone."""
    fractional_share: float
    """Sum of ``g(R)`` over the sessions that may share a GPU."""


def _latencies(profile: BatchingProfile) -> np.ndarray:
    return np.array([profile.latency_ms(b) for b in range(1, profile.max_batch + 1)])


def session_share(
    profile: BatchingProfile, slo_ms: float, rate_rps: float, lat: np.ndarray | None = None
) -> float:
    """``g(R)``: the least GPU share that serves ``rate_rps`` within ``slo_ms`` (inf if none)."""
    return share_from_latencies(_latencies(profile) if lat is None else lat, slo_ms, rate_rps)


def share_from_latencies(lat: np.ndarray, slo_ms: float, rate_rps: float) -> float:
    """``g(R)`` from the latencies of batches 1..max (index 0 is batch 1)."""
    batches = np.arange(1, len(lat) + 1, dtype=float)
    ok = 2.0 * lat <= slo_ms + _EPS
    if not ok.any():
        return math.inf
    lat, batches = lat[ok], batches[ok]
    per_ms = rate_rps / 1000.0
    cycle = np.minimum(batches / per_ms, slo_ms - lat)
    return float(np.min(lat / cycle))


def best_throughput_rps(
    profile: BatchingProfile, slo_ms: float, lat: np.ndarray | None = None
) -> float:
    """``T``: the best back-to-back throughput with ``2*l(b) <= slo`` (0 if none)."""
    lat = _latencies(profile) if lat is None else lat
    ok = 2.0 * lat <= slo_ms + _EPS
    if not ok.any():
        return 0.0
    return float(np.max((np.arange(1, len(lat) + 1) * 1000.0 / lat)[ok]))


def gpu_lower_bound(
    sessions: Sequence[SessionSpec],
    profiles: Mapping[tuple[str, str], BatchingProfile],
    gpu_types: Sequence[GpuType],
) -> LowerBound:
    """Fewest GPUs any plan meeting every SLO, rate and memory needs (Nexus dispatch).

    Sessions no GPU type can serve are left out (they cannot be placed at all).
    """
    arrays: dict[tuple[str, str], np.ndarray] = {}
    usable: list[tuple[SessionSpec, dict[str, BatchingProfile]]] = []
    for s in sessions:
        per_type = {}
        for g in gpu_types:
            p = profiles.get((s.model, g.name))
            if p is None or p.memory_mib > g.memory_mib:
                continue
            lat = arrays.setdefault((s.model, g.name), _latencies(p))
            if best_throughput_rps(p, s.slo_ms, lat) > 0:
                per_type[g.name] = p
        if per_type:
            usable.append((s, per_type))
    capacity = {g.name: g.memory_mib for g in gpu_types}
    # Two smallest memories per type: "the smallest among the others" in O(1).
    smallest: dict[str, list[tuple[float, int]]] = {}
    for i, (_, per_type) in enumerate(usable):
        for t, p in per_type.items():
            smallest[t] = sorted([*smallest.get(t, []), (p.memory_mib, i)])[:2]
    exclusive = big_parts = 0
    share = throughput = 0.0
    for i, (s, per_type) in enumerate(usable):
        best_t = max(
            best_throughput_rps(p, s.slo_ms, arrays[(s.model, t)]) for t, p in per_type.items()
        )
        throughput += s.rate_rps / best_t
        parts = math.ceil(s.rate_rps / best_t - _EPS)
        others = {t: next((m for m, j in smallest[t] if j != i), math.inf) for t in per_type}
        if all(p.memory_mib + others[t] > capacity[t] + _EPS for t, p in per_type.items()):
            exclusive += parts
            continue
        share += min(
            session_share(p, s.slo_ms, s.rate_rps, arrays[(s.model, t)])
            for t, p in per_type.items()
        )
        if all(2.0 * p.memory_mib > capacity[t] + _EPS for t, p in per_type.items()):
            big_parts += parts
    shared = max(big_parts, math.ceil(share - 1e-6))
    return LowerBound(exclusive + shared, math.ceil(throughput - 1e-6), exclusive, share)


class CostFloor:
    """A (price, GPU count) no packing of the items can beat: the early exit of ``merge_best``.

    Each node's batches fill at most its duty cycle, and an item's share of any
    cycle is at least ``g(r)`` (see ``bounds``); its models fit in its memory. So the
    price is at least the sum over items of the cheaper of price times ``g`` and
    price times memory fraction, and the count at least the ceiling of either sum.
    ``g`` costs a few array operations per item, so it is computed only once a
    pass comes within the cheaper floor built from each item's occupancy alone,
    which is never below ``g``.
    """

    def __init__(
        self, items: Sequence[Item], gpu_types: Sequence[GpuType], price: Callable[[GpuType], float]
    ):
        self._items = items
        self._types = {g.name: g for g in gpu_types}
        self._price = price
        self._floor: tuple[float, int] | None = None
        self._ceiling = self._bound(lambda it, t, f: f.occupancy)
        """Built from occupancies alone: at least the floor, cheap to compute."""

    def reached(self, cost: tuple[float, int]) -> bool:
        """True if ``cost`` (price, count) is at the floor: no packing is cheaper."""
        if cost[0] > self._ceiling[0] + 1e-6 or cost[1] > self._ceiling[1]:
            return False
        floor = self.value()
        return cost[0] <= floor[0] + 1e-6 and cost[1] <= floor[1]

    def value(self) -> tuple[float, int]:
        """The floor: (price, GPU count) below which no packing of the items exists."""
        if self._floor is None:
            self._floor = self._bound(
                lambda it, t, f: share_from_latencies(f.latency_array, it.slo_ms, it.rate)
            )
        return self._floor

    def _bound(self, share: Callable[[Item, str, ItemFit], float]) -> tuple[float, int]:
        price = share_price = memory_price = share_units = memory_units = 0.0
        cheapest = math.inf
        for it in self._items:
            shares = {t: share(it, t, f) for t, f in it.per_type.items()}
            memory = {t: f.memory_mib / self._types[t].memory_mib for t, f in it.per_type.items()}
            prices = {t: self._price(self._types[t]) for t in it.per_type}
            share_price += min(prices[t] * shares[t] for t in shares)
            memory_price += min(prices[t] * memory[t] for t in memory)
            share_units += min(shares.values())
            memory_units += min(memory.values())
            cheapest = min(cheapest, *prices.values())
        count = max(math.ceil(share_units - 1e-6), math.ceil(memory_units - 1e-6))
        if count:
            price = max(share_price, memory_price, cheapest * count)
        return price, count
