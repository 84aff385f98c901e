"""Cluster state: a cache of writers that hands out frozen snapshots.

``ClusterState`` composes parts with one job each and is the only writer of their
fields: :class:`extender.state.inventory.Inventory` (source nodes and agent
reports), :class:`extender.state.placements.PlacementLedger` (placed and assumed
pods), the columnar ``GpuTable`` the decisions read and the device-plugin
``HandoffGate``. Besides its writers it has :meth:`ClusterState.snapshot` and
:meth:`ClusterState.assume` (and three reads the cluster source uses).

Decisions never run under its lock (kube-scheduler's plugins get a ``Snapshot``,
never the cache): :meth:`~ClusterState.snapshot` is O(1) and takes no lock while no
writer ran since the last one (the parts are published as one tuple), the table
and the ledger it hands out are never written again (copy on write: the next
writer copies what it changes of them first), and every evaluation runs on the snapshot with the
core's entry points (``extender.core.decide``). Bind decides on a snapshot and
:meth:`~ClusterState.assume` applies the decision only if the node's generation is
still the snapshot's (any change to the node's GPUs bumps it); otherwise bind decides
again on a fresh snapshot.

The ledger follows kube-scheduler's cache interface (``backend/cache/interface.go``)::

                    assume(p)                  finish_binding(uid)
     (unknown) ─────────────────> ASSUMED ──────────────────────> ASSUMED+deadline
         │  ^                       │   │                              │     │
 confirm │  │ forget / expire       │   │ forget (bind failed)        │     │ deadline passed,
  (pod   │  └───────────────────────┘   │                              │     │ no confirm: expire
  seen   v                              │ confirm (pod seen bound)    │     v
  bound)PLACED <────────────────────────┴──────────────────────────────┘  (unknown)
         │
         │ forget (pod deleted, finished, or rebound elsewhere)
         v
     (unknown)

- ``assume`` reserves capacity the moment bind decides, *before* the API call, and
  only if nothing changed on the node since the snapshot it decided on: two
  concurrent binds can never both take the same free capacity.
- An assumed placement has no deadline while its bind is in flight; after the
  bind call returns it expires ``assume_ttl_seconds`` later unless the source
  confirms it (the pod watch shows the pod bound with our annotations).
- Nothing is reserved at filter or prioritize time: kube-scheduler never says
  which node it picked or that it gave up (no Unreserve call), so a reservation
  there would hold phantom capacity on nodes it did not pick.

Agent observations are soft state with a receipt time on the extender's clock
(agent clocks may be skewed); decisions ignore them after
``staleness_seconds`` (see ``extender.core.cost``). A report also carries the
node's GPU inventory, which takes precedence over the source's (GFD labels or
the sim file) because it is measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from contracts.annotations import MODEL
from extender.core import (
    CostPolicy,
    GpuSpec,
    GpuTable,
    NodeSpec,
    Placement,
    PlacementError,
    Snapshot,
)
from extender.core.cow_map import ShardedMap
from extender.errors import BindConflict
from extender.state.handoff import HandoffGate
from extender.state.hosts import HostLedger
from extender.state.inventory import Inventory, NodeReport
from extender.state.placements import PlacementLedger

Clock = Callable[[], float]
_OBSERVED = ("observed_util", "observed_mib", "observed_at", "observed_gen", "since_mib",
             "since_util")
"""The table's columns an agent report changes."""
_PLACED = ("reserved_mib", "reserved_util", "pod_count", "training_count", "training_width",
           "serving_count", "best_effort_weight", "since_mib", "since_util", "newer",
           "sessions", "row_models")
"""The columns and per-row maps a placement changes (not the observations: only since_*)."""
_OWNED = 2
"""``sys.getrefcount`` of a part only the state holds: its own reference and the call's."""


class BeliefsLike(Protocol):
    """Where the policy and the knowledge come from (``extender.learning.knowledge.Beliefs``)."""

    def current(self) -> tuple[CostPolicy, object]:
        """The merged policy in force and the knowledge it was merged with."""
        ...


class ClusterState:
    """Writers + :meth:`snapshot` + :meth:`assume`; thread-safe; the only writer of its parts."""

    def __init__(self, beliefs: BeliefsLike, clock: Clock, assume_ttl_seconds: float):
        self.beliefs = beliefs
        """The policy and knowledge each snapshot carries."""
        self.now = clock
        """The state's clock (what ``listed_at``, expiry deadlines and observations use)."""
        self._lock = threading.RLock()
        self._inventory = Inventory()
        self._ledger = PlacementLedger(assume_ttl_seconds)
        self._table = GpuTable.build([])
        self._generations: ShardedMap[str, int] = ShardedMap()
        """Per node, bumped by every change to its GPUs (sharded like the table's maps)."""
        self._epoch = 0
        self._source_types: dict[str, frozenset[str]] = {}
        self._synced = False
        self._published: tuple | None = None
        """The parts the last snapshot handed out; None once a writer changed any (it drops
        the tuple first, so the reference counts below count live snapshots only)."""
        self._next_expiry = float("inf")
        """The earliest deadline of an assumed placement (snapshot() drops it once passed)."""
        self.handoffs = HandoffGate(clock)
        """Pods waiting for the device plugin's hand-off (``handoff.mode: device-plugin``)."""
        self.hosts = HostLedger()
        """Each node's host CPU and memory (allocatable, requested by bound pods; its own
        lock, so the snapshot reads its view beside the published parts)."""

    # ---- snapshot and assume ---------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The cluster as it is now, frozen (assumed placements past their deadline dropped).

        Lock-free unless a writer ran since the last snapshot or a deadline passed: the parts
        are published as one tuple (a single attribute read under the GIL), so decisions,
        agent reports and ``/v1/state`` never queue behind a writer for their snapshot."""
        policy, knowledge = self.beliefs.current()
        now = self.now()
        table, ledger, generations, epoch, synced, source_types = self._parts(now)
        return Snapshot(table, policy, now, ledger, knowledge, generations, epoch, synced,
                        source_types, self.hosts.view())

    def _parts(self, now: float) -> tuple:
        """The published parts (table, ledger, generations, epoch, synced, source types),
        published again under the lock after a write or once a deadline passed."""
        parts = self._published
        if parts is not None and now < self._next_expiry:
            return parts
        with self._lock:
            if now >= self._next_expiry:
                for uid in self._ledger.expired(now):
                    self._drop(uid)
                self._next_expiry = self._ledger.next_deadline()
            parts = self._published
            if parts is None:
                parts = self._published = (self._table, self._ledger, self._generations,
                                           self._epoch, self._synced, self._source_types)
            return parts

    def assume(self, stamp: tuple[int, int], placement: Placement,
               replacing: str | None = None) -> bool:
        """Reserve ``placement`` unless its node changed since the snapshot it was decided
        on (``stamp``: ``Snapshot.stamp(node)``); False when it did (decide again on a fresh
        snapshot). ``replacing``: a reservation of the same pod (preemption's) dropped in
        the same step. BindConflict when the pod is already placed or assumed."""
        node = placement.node
        with self._lock:
            if stamp != (self._epoch, self._generations.get(node, 0)):
                return False
            if self._ledger.get(placement.pod_uid) is not None:
                raise BindConflict(f"pod {placement.pod} is already bound or being bound", None)
            self._writable()
            if replacing is not None:
                self._drop(replacing)
            now = self.now()
            self._ledger.assume(placement, now)
            self._table_apply(placement, +1, now)
            return True

    # ---- reads the cluster source uses -----------------------------------------------
    def placement_of(self, uid: str) -> Placement | None:
        """The pod's placement, placed or assumed (from the published parts: no lock while
        nothing changed; the record writer asks this for every entry it keeps)."""
        return self._parts(self.now())[1].get(uid)

    def is_known(self, uid: str) -> bool:
        """True when the pod is placed or assumed."""
        return self.placement_of(uid) is not None

    def node_gpus(self, node: str) -> list[GpuSpec]:
        """The GPUs of one node (none for an unknown node): O(its GPUs)."""
        with self._lock:
            t = self._table
        if node not in t.node_index:
            return []
        return [t.gpus[row] for row in t.node_rows(node)]

    # ---- copy on write ---------------------------------------------------------------
    def _writable(self, placements: bool = True, table: bool = True) -> None:
        """Copy what a live snapshot still holds of the parts this write changes, and only
        that: an agent report the observation columns (a few arrays), a placement the
        reservation columns and the per-row and per-pod maps (sharded: their copy shares the
        shards and a write copies the one it changes; the ledger's entry maps and the
        generations alike). A part nobody else holds any more (its snapshots are gone:
        CPython's reference count says so) is written in place, so a write between two
        decisions copies nothing."""
        self._published = None  # first: the published tuple is not a live snapshot
        fields = (_PLACED if placements else _OBSERVED) if table else ()
        if not fields:
            pass
        elif sys.getrefcount(self._table) > _OWNED:  # a snapshot holds this table object
            self._table = dataclasses.replace(
                self._table, **{f: getattr(self._table, f).copy() for f in fields})
        else:  # an older table object (in a snapshot) may still share some columns
            for f in fields:
                if sys.getrefcount(getattr(self._table, f)) > _OWNED:
                    setattr(self._table, f, getattr(self._table, f).copy())
        if placements and sys.getrefcount(self._ledger) > _OWNED:
            self._ledger = self._ledger.copy()
        if table and sys.getrefcount(self._generations) > _OWNED:
            self._generations = self._generations.copy()

    def _bump(self, node: str) -> None:
        self._generations[node] = self._generations.get(node, 0) + 1

    # ---- inventory -------------------------------------------------------------------
    def mark_synced(self) -> None:
        """The source finished its first full sync (nodes and bound pods are in)."""
        with self._lock:
            self._published = None
            self._synced = True

    def set_nodes(self, nodes: Iterable[NodeSpec]) -> None:
        """Replace the source's node list (initial sync or relist)."""
        nodes = list(nodes)
        self.hosts.set_nodes(nodes)
        with self._lock:
            self._inventory.set_nodes(nodes)
            self._rebuild()

    def upsert_node(self, node: NodeSpec) -> None:
        """Add or update one node from the source."""
        self.hosts.upsert_node(node)
        with self._lock:
            if self._inventory.upsert_node(node):
                self._rebuild()

    def delete_node(self, name: str) -> None:
        """Forget a node the source no longer has."""
        self.hosts.delete_node(name)
        with self._lock:
            if self._inventory.delete_node(name):
                self._rebuild()

    def _rebuild(self) -> None:
        nodes = self._inventory.nodes()
        table = GpuTable.build(nodes)
        table.vanished = self._inventory.vanished(nodes)
        for report in self._inventory.reports():
            if report.node in table.node_index:
                table.observe(report.node, report.observations())
        self._published = None  # a new table: nothing of the old one is written again
        for p in self._ledger.all():  # after the samples: each is stamped against them
            try:
                table.place(p, self._ledger.applied_at(p.pod_uid))
            except PlacementError:
                continue  # pod on a node or GPU we have no inventory for: kept in the ledger
        self._table = table
        self._source_types = self._inventory.source_types()
        self._epoch += 1

    # ---- ledger ----------------------------------------------------------------------
    def _table_apply(self, p: Placement, sign: int, at: float | None = None) -> None:
        self._bump(p.node)
        with contextlib.suppress(PlacementError):
            if sign > 0:
                self._table.place(p, at)
            else:
                self._table.remove(p)

    def _drop(self, uid: str) -> Placement | None:
        if self._ledger.get(uid) is None:
            return None
        self._writable()
        p = self._ledger.drop(uid)
        if p is not None:
            self._table_apply(p, -1)
        return p

    def confirm(self, p: Placement) -> None:
        """The source shows the pod bound with these annotations: it is placed."""
        with self._lock:
            if _same_on_gpus(self._ledger.get(p.pod_uid, only_assumed=True), p):
                # What bind assumed, as the watch shows it bound: the table already holds
                # it, so only the ledger's entries change (no column copied, no generation
                # bumped: binds racing for the node keep their decisions).
                self._writable(table=False)
                self._ledger.settle(p)
                return
            # An assumed pod keeps its bind time: a sample taken since then may show it.
            applied_at = self._ledger.applied_at(p.pod_uid)
            self._writable()
            self._drop(p.pod_uid)
            at = self.now() if applied_at is None else applied_at
            self._ledger.place(p, at)
            self._table_apply(p, +1, at)

    def forget(self, uid: str, only_assumed: bool = False) -> None:
        """Drop a pod from the ledger (deleted, finished, or its bind failed); with
        ``only_assumed`` (a refused bind), a confirmed pod stays: the watch already showed
        it bound."""
        with self._lock:
            if not only_assumed or self._ledger.get(uid, only_assumed=True) is not None:
                self._drop(uid)

    def retain_placed(self, uids: set[str], listed_at: float | None = None,
                      ) -> list[Placement]:
        """Forget pods a relist does not show bound (``uids``): placed ones, and assumed ones
        whose bind call had returned before the list was taken at ``listed_at`` (the list
        would show them bound, so they were deleted, finished, or never bound). Binds still
        in flight, or returned after the list was taken, stay. Returns what was forgotten."""
        with self._lock:
            gone = self._ledger.missing_from(uids, listed_at)
            return [p for p in (self._drop(uid) for uid in gone) if p is not None]

    def finish_binding(self, uid: str) -> None:
        """The bind call returned: start the assumed placement's expiry clock (only the
        writer reads deadlines: nothing a snapshot holds changes, nothing is copied)."""
        with self._lock:
            deadline = self._ledger.start_deadline(uid, self.now())
            if deadline is not None:
                self._next_expiry = min(self._next_expiry, deadline)

    def expire(self) -> list[Placement]:
        """Drop assumed placements whose deadline passed without confirmation."""
        with self._lock:
            gone = self._ledger.expired(self.now())
            dropped = [p for p in (self._drop(uid) for uid in gone) if p is not None]
            self._next_expiry = self._ledger.next_deadline()
            return dropped

    # ---- agent reports ---------------------------------------------------------------
    def report(self, node: str, gpus: Sequence[GpuSpec], util_percent: Sequence[float],
               memory_used_mib: Sequence[float]) -> None:
        """Store an agent report; rebuild only when the measured inventory changed."""
        with self._lock:
            report = NodeReport(node, tuple(gpus), tuple(util_percent), tuple(memory_used_mib),
                                self.now())
            if self._inventory.report(report):
                self._rebuild()
            elif node in self._table.node_index:
                self._writable(placements=False)
                self._bump(node)
                self._table.observe(node, report.observations())


def _same_on_gpus(assumed: Placement | None, p: Placement) -> bool:
    """Whether confirming ``p`` leaves the GPU table as ``assumed`` left it: same decision
    (GPUs with their UUIDs, demand, kind), both trusted, same model (pairwise rows)."""
    return assumed is not None and assumed == p and assumed.gpus == p.gpus \
        and assumed.trusted and p.trusted \
        and dict(assumed.annotations).get(MODEL) == dict(p.annotations).get(MODEL)
