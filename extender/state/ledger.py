"""Cluster state: the GPU inventory, the placement ledger and the GPU table, under one lock.

``ClusterState`` composes parts with one job each and is the only writer of their
fields: :class:`extender.state.inventory.Inventory` (source nodes and agent
reports), :class:`extender.state.placements.PlacementLedger` (placed and assumed
pods), the columnar ``GpuTable`` the decisions read, the device-plugin
``HandoffGate``, and :mod:`extender.state.view` (the ``/v1/state`` value).

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

- ``assume`` reserves capacity the moment bind decides, *before* the API call,
  under the same lock as the decision: two concurrent binds can never both see
  the same free capacity.
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
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from contracts.state import StateDocument, encode_state
from extender.core import (
    CostPolicy,
    DecisionContext,
    Evaluation,
    GpuSpec,
    GpuTable,
    InferenceContext,
    NodeSpec,
    Placement,
    PlacementError,
    Purpose,
    ResolvedDemand,
    choose,
    evaluate,
    split_gpus,
)
from extender.errors import BindConflict
from extender.state.handoff import HandoffGate
from extender.state.inventory import Inventory, NodeReport
from extender.state.placements import PlacementLedger
from extender.state.view import gpu_rows, state_document

Clock = Callable[[], float]


class ClusterState:
    """Inventory + ledger + columnar table; thread-safe; the only writer of its parts."""

    def __init__(self, policy: Callable[[], CostPolicy], clock: Clock,
                 assume_ttl_seconds: float = 30.0):
        self._policy = policy
        self._clock = clock
        self.lock = threading.RLock()
        self._inventory = Inventory()
        self._ledger = PlacementLedger(assume_ttl_seconds)
        self._table = GpuTable.build([])
        self._synced = False
        self.handoffs = HandoffGate(clock)
        """Pods waiting for the device plugin's hand-off (``handoff.mode: device-plugin``)."""

    @property
    def synced(self) -> bool:
        """True once the source's first full sync is in."""
        return self._synced

    def mark_synced(self) -> None:
        """The source finished its first full sync (nodes and bound pods are in)."""
        self._synced = True

    # ---- inventory -------------------------------------------------------------------
    def set_nodes(self, nodes: Iterable[NodeSpec]) -> None:
        """Replace the source's node list (initial sync or relist)."""
        with self.lock:
            self._inventory.set_nodes(nodes)
            self._rebuild()

    def upsert_node(self, node: NodeSpec) -> None:
        """Add or update one node from the source."""
        with self.lock:
            if self._inventory.upsert_node(node):
                self._rebuild()

    def delete_node(self, name: str) -> None:
        """Forget a node the source no longer has."""
        with self.lock:
            if self._inventory.delete_node(name):
                self._rebuild()

    def _rebuild(self) -> None:
        nodes = self._inventory.nodes()
        table = GpuTable.build(nodes)
        table.vanished = self._inventory.vanished(nodes)
        for report in self._inventory.reports():
            if report.node in table.node_index:
                table.observe(report.node, report.observations())
        for p in self._ledger.all():  # after the samples: each is stamped against them
            try:
                table.place(p, self._ledger.applied_at(p.pod_uid))
            except PlacementError:
                continue  # pod on a node or GPU we have no inventory for: kept in the ledger
        self._table = table

    # ---- ledger ----------------------------------------------------------------------
    def _table_apply(self, p: Placement, sign: int) -> None:
        with contextlib.suppress(PlacementError):
            if sign > 0:
                self._table.place(p, self._ledger.applied_at(p.pod_uid))
            else:
                self._table.remove(p)

    def _drop(self, uid: str) -> Placement | None:
        p = self._ledger.drop(uid)
        if p is not None:
            self._table_apply(p, -1)
        return p

    def confirm(self, p: Placement) -> None:
        """The source shows the pod bound with these annotations: it is placed."""
        with self.lock:
            # An assumed pod keeps its bind time: a sample taken since then may show it.
            applied_at = self._ledger.applied_at(p.pod_uid)
            self._drop(p.pod_uid)
            self._ledger.place(p, self._clock() if applied_at is None else applied_at)
            self._table_apply(p, +1)

    def forget(self, uid: str) -> None:
        """Drop a pod from the ledger (deleted, finished, or its bind failed)."""
        with self.lock:
            self._drop(uid)

    def now(self) -> float:
        """The state's clock (what ``listed_at`` and expiry deadlines are measured on)."""
        return self._clock()

    def retain_placed(self, uids: set[str], listed_at: float | None = None,
                      ) -> list[Placement]:
        """Forget pods a relist does not show bound (``uids``): placed ones, and assumed ones
        whose bind call had returned before the list was taken at ``listed_at`` (the list
        would show them bound, so they were deleted, finished, or never bound). Binds still
        in flight, or returned after the list was taken, stay. Returns what was forgotten."""
        with self.lock:
            gone = self._ledger.missing_from(uids, listed_at)
            return [p for p in (self._drop(uid) for uid in gone) if p is not None]

    def forget_assumed(self, uid: str) -> None:
        """Drop an assumed placement (its bind was refused); a confirmed one stays, since the
        watch already showed the pod bound."""
        with self.lock:
            if self._ledger.is_assumed(uid):
                self._drop(uid)

    def finish_binding(self, uid: str) -> None:
        """The bind call returned: start the assumed placement's expiry clock."""
        with self.lock:
            self._ledger.start_deadline(uid, self._clock())

    def expire(self) -> list[Placement]:
        """Drop assumed placements whose deadline passed without confirmation."""
        now = self._clock()
        with self.lock:
            gone = self._ledger.expired(now)
            return [p for p in (self._drop(uid) for uid in gone) if p is not None]

    def is_known(self, uid: str) -> bool:
        """True when the pod is placed or assumed."""
        with self.lock:
            return self._ledger.is_known(uid)

    def placement_of(self, uid: str) -> Placement | None:
        """The pod's placement, placed or assumed."""
        with self.lock:
            return self._ledger.get(uid)

    def source_gpu_types(self, node: str) -> frozenset[str] | None:
        """The GPU types the cluster source lists for ``node`` (GPU feature discovery's labels,
        the cluster file), not what its agent reports; None when it lists none."""
        with self.lock:
            return self._inventory.source_gpu_types(node)

    # ---- decisions -------------------------------------------------------------------
    def gpu_types(self) -> list[str]:
        """GPU types present in the inventory."""
        with self.lock:
            return list(self._table.type_names)

    def evaluate(self, names: Sequence[str], demand: ResolvedDemand,
                 inference: InferenceContext | None,
                 purpose: Purpose = Purpose.SCORE) -> Evaluation:
        """Run the core evaluation on the current table (read-only)."""
        self.expire()
        with self.lock:
            return evaluate(self._table, names, demand, self._context(inference), purpose)

    def _context(self, inference: InferenceContext | None) -> DecisionContext:
        return DecisionContext(self._policy(), self._clock(), inference)

    def assume_best(self, node: str, demand: ResolvedDemand, inference: InferenceContext | None,
                    pod_uid: str, pod: str, annotations: tuple[tuple[str, str], ...] = (),
                    containers: tuple[tuple[str, int, bool], ...] = (),
                    ) -> tuple[Placement, Any, float, list[str], str]:
        """Decide the GPUs on ``node`` against fresh state and assume them, atomically;
        ``containers`` (``extender.core.container_gpu_counts``) says who gets which.

        Returns the placement, its plan, cost, GPU UUIDs and where its interference figure
        came from ("" where the curve alone decided)."""
        self.expire()
        with self.lock:
            if self._ledger.is_known(pod_uid):
                raise BindConflict(f"pod {pod} is already bound or being bound", None)
            ev = evaluate(self._table, [node], demand, self._context(inference))
            placement = choose(ev, 0, pod_uid, pod)
            if placement is None:
                raise BindConflict(f"node {node} no longer fits pod {pod}",
                                   ev.rejections.get(node))
            rows = ev.chosen_rows(0)
            uuids = [self._table.gpus[r].uuid for r in rows]
            # Hold exactly what the annotations will say, so a restart rebuilds identical state.
            placement = dataclasses.replace(placement,
                                            util_percent=round(placement.util_percent, 2),
                                            mem_mib=float(round(placement.mem_mib)),
                                            annotations=annotations, gpu_uuids=tuple(uuids),
                                            containers=split_gpus(containers,
                                                                  placement.gpu_indices))
            now = self._clock()
            self._ledger.assume(placement, now)
            self._table.place(placement, now)
            return placement, ev.plans.get(rows[0]), float(ev.node_cost[0]), uuids, \
                ev.interference_sources.get(rows[0], "")

    def fits_without(self, node: str, victim_uids: Sequence[str], demand: ResolvedDemand,
                     inference: InferenceContext | None) -> bool:
        """Would the pod fit on ``node`` once ``victim_uids`` are gone? (tentative copy)"""
        with self.lock:
            table = self._table.copy()
            for uid in victim_uids:
                p = self.placement_of(uid)
                if p is not None and p.node == node:
                    with contextlib.suppress(PlacementError):
                        table.remove(p)
            ev = evaluate(table, [node], demand, self._context(inference))
            return bool(ev.feasible[0])

    # ---- agent reports ---------------------------------------------------------------
    def report(self, node: str, gpus: Sequence[GpuSpec], util_percent: Sequence[float],
               memory_used_mib: Sequence[float]) -> None:
        """Store an agent report; rebuild only when the measured inventory changed."""
        with self.lock:
            report = NodeReport(node, tuple(gpus), tuple(util_percent), tuple(memory_used_mib),
                                self._clock())
            if self._inventory.report(report):
                self._rebuild()
            elif node in self._table.node_index:
                self._table.observe(node, report.observations())

    # ---- views -----------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """The encoded ``GET /v1/state`` document without ``learning`` (tests, operators)."""
        return encode_state(self.document())

    def document(self, learning: Mapping[str, Any] | None = None,
                 node: str | None = None) -> StateDocument:
        """The ``GET /v1/state`` document (``contracts.state``); with ``node``, that node only
        (each agent asks for its own: O(its GPUs), not O(cluster))."""
        policy, now = self._policy(), self._clock()
        with self.lock:
            return state_document(self._table, self._ledger, policy.staleness_seconds, now,
                                  self._synced, learning, node)

    def node_gpus(self, node: str) -> list[GpuSpec]:
        """The GPUs of one node (none for an unknown node): O(its GPUs), for the bind path."""
        with self.lock:
            t = self._table
            if node not in t.node_index:
                return []
            return [t.gpus[row] for row in t.node_rows(node)]

    def gpu_rows(self) -> list[tuple[str, GpuSpec, float, float | None]]:
        """(node, gpu, predicted util, fresh observed util) per GPU, for metrics."""
        policy, now = self._policy(), self._clock()
        with self.lock:
            return gpu_rows(self._table, policy.staleness_seconds, now)
