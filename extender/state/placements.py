"""The placement ledger: placed and assumed pods, and when each was first applied.

The state machine follows kube-scheduler's cache interface
(``backend/cache/interface.go``); the diagram is in :mod:`extender.state.ledger`.
This part only keeps the entries; the caller (``ClusterState``) holds the lock and
applies each change to the GPU table. Not thread-safe on its own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from extender.core import Placement
from extender.core.cow_map import OrderedShardedMap, ShardedMap


class PlacementLedger:
    """Placed + assumed pods, their bind deadlines and first-applied times."""

    def __init__(self, assume_ttl_seconds: float):
        self.ttl = assume_ttl_seconds
        self._placed: OrderedShardedMap[str, Placement] = OrderedShardedMap()
        """Sharded (a write beside a snapshot copies one shard), in the order placed: a
        rebuild applies them in it."""
        self._assumed: dict[str, Placement] = {}
        self._deadlines: dict[str, float] = {}
        """Per assumed pod whose bind call returned, when it expires unless confirmed: only
        the writer reads them, so copies share them and starting one copies nothing."""
        self._applied_at: dict[str, float] = {}
        """When each entry was first applied: a rebuild re-stamps it, so placements newer
        than an agent's sample still count on top of it (``extender.core.cost``)."""
        self._by_node: ShardedMap[str, tuple[str, ...]] = ShardedMap()
        """Per node, the UIDs of its entries (tuples, replaced rather than changed, so that
        :meth:`copy` may share them): ``/v1/state?node=`` reads one node's, not all."""
        self.untrusted = 0
        """Placed entries without a recorded decision (``Placement.trusted`` False)."""

    def copy(self) -> PlacementLedger:
        """A copy for the writer when a snapshot holds this ledger. The first-applied times
        and the deadlines stay shared: only the writer reads them (a snapshot reads the
        entries alone)."""
        other = PlacementLedger(self.ttl)
        # The entry maps stay shared until the copy writes one (:meth:`_own`): a bind's
        # assume copies the few assumed entries, not every placed one.
        other._placed, other._assumed, other._by_node = self._placed, self._assumed, \
            self._by_node
        other._applied_at, other._deadlines = self._applied_at, self._deadlines
        other.untrusted = self.untrusted
        return other

    def _own(self, *names: str) -> None:
        """Copy the maps among ``names`` that another ledger (or a reader) still holds before
        this one writes them (CPython's reference count: this attribute and the call's)."""
        for name in names:
            if sys.getrefcount(getattr(self, name)) > 2:
                setattr(self, name, getattr(self, name).copy())

    # ---- reads ---------------------------------------------------------------------
    def placed(self) -> Iterable[Placement]:
        """Confirmed placements."""
        return self._placed.values()

    def assumed(self) -> list[Placement]:
        """Placements whose bind is in flight or awaiting confirmation."""
        return list(self._assumed.values())

    def all(self) -> list[Placement]:
        """Placed, then assumed."""
        return [*self._placed.values(), *self.assumed()]

    def on_node(self, node: str) -> list[tuple[str, Placement]]:
        """("placed" or "assumed", placement) of the entries on ``node``: O(its entries)."""
        out = []
        for uid in self._by_node.get(node, ()):
            p = self._placed.get(uid)
            if p is not None:
                out.append(("placed", p))
            elif uid in self._assumed:
                out.append(("assumed", self._assumed[uid]))
        return out

    def applied_at(self, uid: str) -> float | None:
        """When the pod's entry was first applied (None: unknown pod)."""
        return self._applied_at.get(uid)

    def get(self, uid: str, only_assumed: bool = False) -> Placement | None:
        """The pod's placement, placed or assumed (``only_assumed``: assumed only)."""
        if only_assumed:
            return self._assumed.get(uid)
        return self._placed.get(uid) or self._assumed.get(uid)

    def expired(self, now: float) -> list[str]:
        """Assumed pods whose deadline passed without confirmation."""
        return [uid for uid, deadline in self._deadlines.items() if deadline <= now]

    def missing_from(self, uids: set[str], listed_at: float | None) -> list[str]:
        """Pods a relist showing ``uids`` bound at ``listed_at`` proves gone: placed ones,
        and assumed ones whose bind call had returned before the list was taken."""
        gone = [uid for uid in self._placed if uid not in uids]
        if listed_at is not None:
            gone += [uid for uid, deadline in self._deadlines.items()
                     if uid not in uids and deadline - self.ttl < listed_at]
        return gone

    # ---- writes --------------------------------------------------------------------
    def drop(self, uid: str) -> Placement | None:
        """Forget the pod; returns what it held."""
        if self.get(uid) is None:
            self._applied_at.pop(uid, None)
            self._deadlines.pop(uid, None)
            return None
        self._own("_placed" if uid in self._placed else "_assumed", "_by_node")
        p = self._placed.pop(uid, None)
        if p is not None:
            self.untrusted -= not p.trusted
        else:
            p = self._assumed.pop(uid, None)
        self._applied_at.pop(uid, None)
        self._deadlines.pop(uid, None)
        if p is not None:
            rest = tuple(u for u in self._by_node.get(p.node, ()) if u != uid)
            if rest:
                self._by_node[p.node] = rest
            else:
                self._by_node.pop(p.node, None)
        return p

    def _index(self, p: Placement) -> None:
        self._own("_by_node")
        self._by_node[p.node] = (*self._by_node.get(p.node, ()), p.pod_uid)

    def place(self, p: Placement, applied_at: float) -> None:
        """Record a confirmed placement (the caller dropped any earlier entry)."""
        self._own("_placed")
        self._placed[p.pod_uid] = p
        self._applied_at[p.pod_uid] = applied_at
        self.untrusted += not p.trusted
        self._index(p)

    def settle(self, p: Placement) -> None:
        """The assumed entry of ``p``'s pod is confirmed as ``p`` (same GPUs and demand):
        placed, keeping when it was first applied."""
        self._own("_assumed", "_placed")
        del self._assumed[p.pod_uid]
        self._deadlines.pop(p.pod_uid, None)
        self._placed[p.pod_uid] = p
        self.untrusted += not p.trusted

    def assume(self, p: Placement, applied_at: float) -> None:
        """Record a placement whose bind is in flight (no deadline yet)."""
        self._own("_assumed")
        self._assumed[p.pod_uid] = p
        self._applied_at[p.pod_uid] = applied_at
        self._index(p)

    def start_deadline(self, uid: str, now: float) -> float | None:
        """The bind call returned: the assumed entry expires ``ttl`` after ``now`` (returned;
        None for a pod not assumed)."""
        if uid not in self._assumed:
            return None
        self._deadlines[uid] = now + self.ttl
        return now + self.ttl

    def next_deadline(self) -> float:
        """The earliest deadline of an assumed entry (infinity when none has one)."""
        return min(self._deadlines.values(), default=float("inf"))
