"""Residual merging (Nexus Algorithm 1, lines 12-25, and MergeNodes), vectorised.

MergeNodes, exactly as in the dissertation (Figure 3.10): the merged node's duty
cycle is the smaller of the two (``d_i`` is the longest cycle each session
tolerates), every session is re-batched to ``ceil(r*d)``, and the merge is feasible
iff the batches' latencies sum to at most ``d`` and the models' memory fits.
Best fit: among the nodes a residual merges with, the one with the highest
resulting occupancy ``sum l(b)/d`` wins; if none, a new node opens.

Speed: open nodes of one GPU type live in numpy arrays plus flat per-share arrays,
so a merge that shortens a node's cycle re-batches every candidate node at once
(one ``bincount``). The scan itself (``scan``) walks the nodes in plain Python
while they are few and switches to the arrays past ``SCALAR_MAX_NODES``.

Quality beyond Nexus: ``merge_best`` runs the same best-fit merge under several
decreasing orders (Nexus's occupancy, then orders that also weigh memory, the
second resource the paper's greedy ignores when ranking) and keeps the cheapest,
then ``consolidate`` tries to empty the emptiest nodes into the others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lab.planning.bounds import CostFloor
from lab.planning.nodes import Item, TypeNodes
from lab.planning.options import GpuType
from lab.planning.scan import batch_at, scan

_EPS = 1e-9


@dataclass(frozen=True)
class Fit:
    """Where an item would go: type, node, merged cycle and busy time, occupancy."""

    gpu_type: str
    node: int
    duty_ms: float
    busy_ms: float

    @property
    def occupancy(self) -> float:
        """Resulting occupancy of the node."""
        return self.busy_ms / self.duty_ms


class Packing:
    """Nodes of every GPU type plus which nodes host which session (no session twice)."""

    def __init__(self, gpu_types: Sequence[GpuType], price: Callable[[GpuType], float]):
        self.types = {g.name: TypeNodes(g, price(g)) for g in gpu_types}
        self.hosts: dict[str, set[tuple[str, int]]] = {}

    def seed(self, gpu_type: str, items: Sequence[Item], duty_ms: float, memory_mib: float) -> int:
        """A node that already runs ``items`` at ``duty_ms`` (a kept GPU); returns its index.

        ``memory_mib`` may exceed the items' own: models leaving the GPU stay loaded
        until their new home serves them (make-before-break).
        """
        nodes = self.types[gpu_type]
        i = nodes.open()
        for item in items:
            fit = item.per_type[gpu_type]
            busy = nodes.busy[i] + fit.latencies[batch_at(item.rate, duty_ms) - 1]
            self.place(item, Fit(gpu_type, i, duty_ms, busy))
        nodes.memory[i] = max(nodes.memory[i], memory_mib)
        return i

    def best_fit(self, item: Item, skip: tuple[str, int] | None = None) -> Fit | None:
        """MergeNodes against every open node; the highest resulting occupancy wins."""
        best: Fit | None = None
        hosts = self.hosts.get(item.session.name, ())
        for t, fit in item.per_type.items():
            nodes = self.types[t]
            if nodes.n == 0:
                continue
            banned = {j for host_t, j in hosts if host_t == t}
            if skip is not None and skip[0] == t:
                banned.add(skip[1])
            for occ, j, duty, busy in scan(nodes, item.rate, fit, banned):
                if best is None or occ > best.occupancy + _EPS:
                    best = Fit(t, j, duty, busy)
        return best

    def place(self, item: Item, fit: Fit) -> None:
        """Commit a merge."""
        self.types[fit.gpu_type].add(fit.node, item, fit.duty_ms, fit.busy_ms)
        self.hosts.setdefault(item.session.name, set()).add((fit.gpu_type, fit.node))

    def open_for(self, item: Item) -> None:
        """A new node for ``item`` on the type where it costs least."""
        t = min(item.per_type, key=lambda t: (self.types[t].price * item.per_type[t].occupancy, t))
        nodes = self.types[t]
        fit = item.per_type[t]
        j = nodes.open()
        own = fit.latencies[batch_at(item.rate, fit.duty_ms) - 1]
        self.place(item, Fit(t, j, fit.duty_ms, own))

    def insert(self, item: Item) -> None:
        """Best fit, or a new node."""
        fit = self.best_fit(item)
        if fit is None:
            self.open_for(item)
        else:
            self.place(item, fit)

    def live(self) -> list[tuple[TypeNodes, int]]:
        """Every non-empty node, in opening order per type."""
        return [
            (nodes, i) for nodes in self.types.values() for i in range(nodes.n) if nodes.items[i]
        ]

    def cost(self) -> tuple[float, int]:
        """(total price, node count) of the live nodes."""
        live = self.live()
        return (sum(nodes.price for nodes, _ in live), len(live))

    def consolidate(self, max_rounds: int = 2) -> None:
        """Empty the emptiest nodes into the others when every share finds a place.

        Each attempt is transactional: merges are applied one by one and undone if
        some share of the node finds no other home.
        """
        for _ in range(max_rounds):
            emptied = False
            order = sorted(self.live(), key=lambda ni: ni[0].busy[ni[1]] / ni[0].duty[ni[1]])
            for nodes, i in order:
                if nodes.items[i] and self._try_empty(nodes, i):
                    emptied = True
            if not emptied:
                return

    def _try_empty(self, nodes: TypeNodes, i: int) -> bool:
        t = nodes.gpu.name
        moving = sorted(nodes.items[i], key=lambda it: -it.per_type[t].occupancy)
        undo: list[tuple[TypeNodes, int, float, float, float, float, Item]] = []
        for item in moving:
            fit = self.best_fit(item, skip=(t, i))
            if fit is None:
                for target, j, duty, busy, mem, floor, it in reversed(undo):
                    target.pop(j)
                    target.duty[j], target.busy[j] = duty, busy
                    target.memory[j], target.floor[j] = mem, floor
                    self.hosts[it.session.name].discard((target.gpu.name, j))
                return False
            target = self.types[fit.gpu_type]
            j = fit.node
            undo.append(
                (target, j, target.duty[j], target.busy[j], target.memory[j], target.floor[j], item)
            )
            self.place(item, fit)
        for item in moving:
            self.hosts[item.session.name].discard((t, i))
        nodes.close(i)
        return True


OrderKey = Callable[[Item], tuple]

LARGE_INSTANCE_ITEMS = 600


def merge_best(
    items: Sequence[Item],
    gpu_types: Sequence[GpuType],
    price: Callable[[GpuType], float],
    orders: Mapping[str, OrderKey] | None = None,
) -> Packing:
    """Best-fit-decreasing under each order; the cheapest result, then consolidated.

    By default large instances (over ``LARGE_INSTANCE_ITEMS`` residuals) try only the
    first two orders: each order is a full pass, and planning time matters there.
    An order that sorts the items as an earlier one did is not run again, and once
    a pass reaches ``CostFloor`` no other order nor consolidation can improve it.
    """
    if orders is None:
        orders = default_orders(gpu_types, price)
        if len(items) > LARGE_INSTANCE_ITEMS:
            orders = dict(list(orders.items())[:2])
    floor = CostFloor(items, gpu_types, price)
    best: Packing | None = None
    seen: list[list[int]] = []
    for key in orders.values():
        sequence = sorted(items, key=key)
        ids = [id(it) for it in sequence]
        if ids in seen:
            continue
        seen.append(ids)
        packing = Packing(gpu_types, price)
        for item in sequence:
            packing.insert(item)
        if best is None or packing.cost() < best.cost():
            best = packing
        if floor.reached(best.cost()):
            return best
    assert best is not None
    best.consolidate()
    return best


def default_orders(
    gpu_types: Sequence[GpuType], price: Callable[[GpuType], float]
) -> dict[str, OrderKey]:
    """Nexus's decreasing occupancy first; then orders that rank memory too."""
    by_name = {g.name: g for g in gpu_types}
    # Every order ranks by the same two measures: compute each once per item.
    measures: dict[int, tuple[float, float]] = {}

    def measure(it: Item) -> tuple[float, float]:
        m = measures.get(id(it))
        if m is None:
            m = measures[id(it)] = (
                min(price(by_name[t]) * f.occupancy for t, f in it.per_type.items()),
                min(f.memory_mib / by_name[t].memory_mib for t, f in it.per_type.items()),
            )
        return m

    def occupancy(it: Item) -> float:
        return measure(it)[0]

    def memory(it: Item) -> float:
        return measure(it)[1]

    return {
        "nexus_occupancy": lambda it: (-occupancy(it), it.session.name),
        "memory_then_occupancy": lambda it: (-memory(it), -occupancy(it), it.session.name),
        "larger_dimension": lambda it: (-max(occupancy(it), memory(it)), it.session.name),
    }
