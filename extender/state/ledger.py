"""Cluster state: GPU inventory, the placement ledger and agent observations.

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from extender.core import (
    CostPolicy,
    DecisionContext,
    Evaluation,
    GpuObservation,
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
)
from extender.errors import BindConflict
from extender.state.handoff import HandoffGate

Clock = Callable[[], float]


@dataclass(frozen=True)
class AgentReport:
    """A validated agent report: the node's measured inventory and per-GPU load."""

    node: str
    gpus: tuple[GpuSpec, ...]
    util_percent: tuple[float, ...]
    memory_used_mib: tuple[float, ...]
    received_at_seconds: float


class ClusterState:
    """Inventory + ledger + columnar table; thread-safe; the only writer of its table."""

    def __init__(self, policy: Callable[[], CostPolicy], clock: Clock,
                 assume_ttl_seconds: float = 30.0):
        self._policy = policy
        self._clock = clock
        self._ttl = assume_ttl_seconds
        self.lock = threading.RLock()
        self._source_nodes: dict[str, NodeSpec] = {}
        self._reports: dict[str, AgentReport] = {}
        self._reported_uuids: dict[str, set[str]] = {}
        """Every GPU UUID an agent has reported per node: one missing now has vanished."""
        self._placed: dict[str, Placement] = {}
        self._assumed: dict[str, tuple[Placement, float | None]] = {}
        self._applied_at: dict[str, float] = {}
        """When each ledger entry was first applied: a rebuild re-stamps it, so placements
        newer than an agent's sample still count on top of it (``extender.core.cost``)."""
        self._table = GpuTable.build([])
        self.synced = False
        self.handoffs = HandoffGate(clock)
        """Pods waiting for the device plugin's hand-off (``handoff.mode: device-plugin``)."""

    # ---- inventory -------------------------------------------------------------------
    def set_nodes(self, nodes: Iterable[NodeSpec]) -> None:
        """Replace the source's node list (initial sync or relist)."""
        with self.lock:
            self._source_nodes = {n.name: n for n in nodes}
            self._rebuild()

    def upsert_node(self, node: NodeSpec) -> None:
        """Add or update one node from the source."""
        with self.lock:
            if self._source_nodes.get(node.name) != node:
                self._source_nodes[node.name] = node
                self._rebuild()

    def delete_node(self, name: str) -> None:
        """Forget a node the source no longer has."""
        with self.lock:
            if self._source_nodes.pop(name, None) is not None:
                self._rebuild()

    def _effective_nodes(self) -> list[NodeSpec]:
        nodes = []
        for name in sorted(self._source_nodes):
            report = self._reports.get(name)
            gpus = report.gpus if report is not None and report.gpus else None
            nodes.append(NodeSpec(name, gpus) if gpus else self._source_nodes[name])
        return nodes

    def _rebuild(self) -> None:
        nodes = self._effective_nodes()
        table = GpuTable.build(nodes)
        table.vanished = {n.name: frozenset(self._reported_uuids[n.name]
                                            - {g.uuid for g in n.gpus})
                          for n in nodes if n.name in self._reported_uuids}
        for report in self._reports.values():
            if report.node in table.node_index:
                table.observe(report.node, _observations(report))
        for p in self._all_placements():  # after the samples: each is stamped against them
            try:
                table.place(p, self._applied_at.get(p.pod_uid))
            except PlacementError:
                continue  # pod on a node or GPU we have no inventory for: kept in the ledger
        self._table = table

    def _all_placements(self) -> list[Placement]:
        return [*self._placed.values(), *(p for p, _ in self._assumed.values())]

    # ---- ledger ----------------------------------------------------------------------
    def _table_apply(self, p: Placement, sign: int) -> None:
        with contextlib.suppress(PlacementError):
            if sign > 0:
                self._table.place(p, self._applied_at.get(p.pod_uid))
            else:
                self._table.remove(p)

    def _drop(self, uid: str) -> Placement | None:
        p = self._placed.pop(uid, None)
        if p is None:
            entry = self._assumed.pop(uid, None)
            p = entry[0] if entry else None
        if p is not None:
            self._table_apply(p, -1)
        self._applied_at.pop(uid, None)
        return p

    def confirm(self, p: Placement) -> None:
        """The source shows the pod bound with these annotations: it is placed."""
        with self.lock:
            # An assumed pod keeps its bind time: a sample taken since then may show it.
            applied_at = self._applied_at.get(p.pod_uid, self._clock())
            self._drop(p.pod_uid)
            self._placed[p.pod_uid] = p
            self._applied_at[p.pod_uid] = applied_at
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
            gone = [uid for uid in self._placed if uid not in uids]
            if listed_at is not None:
                gone += [uid for uid, (_, deadline) in self._assumed.items()
                         if uid not in uids and deadline is not None
                         and deadline - self._ttl < listed_at]
            return [p for p in (self._drop(uid) for uid in gone) if p is not None]

    def forget_assumed(self, uid: str) -> None:
        """Drop an assumed placement (its bind was refused); a confirmed one stays, since the
        watch already showed the pod bound."""
        with self.lock:
            if uid in self._assumed:
                self._drop(uid)

    def finish_binding(self, uid: str) -> None:
        """The bind call returned: start the assumed placement's expiry clock."""
        with self.lock:
            entry = self._assumed.get(uid)
            if entry is not None:
                self._assumed[uid] = (entry[0], self._clock() + self._ttl)

    def expire(self) -> list[Placement]:
        """Drop assumed placements whose deadline passed without confirmation."""
        now = self._clock()
        with self.lock:
            gone = [uid for uid, (_, deadline) in self._assumed.items()
                    if deadline is not None and deadline <= now]
            return [p for p in (self._drop(uid) for uid in gone) if p is not None]

    def is_known(self, uid: str) -> bool:
        """True when the pod is placed or assumed."""
        with self.lock:
            return uid in self._placed or uid in self._assumed

    def placement_of(self, uid: str) -> Placement | None:
        """The pod's placement, placed or assumed."""
        with self.lock:
            entry = self._assumed.get(uid)
            return self._placed.get(uid) or (entry[0] if entry else None)

    def named_gpus(self, node: str, indices: tuple[int, ...], uuids: tuple[str, ...],
                   ) -> tuple[tuple[int, ...], float | None]:
        """Indices of ``node``'s GPUs named by index or UUID (all of them when it names none
        it has), and the largest one's memory; None when the node has no known GPU."""
        with self.lock:
            t = self._table
            if node not in t.node_index:
                return indices, None
            rows = [r for r in t.node_rows(node)
                    if t.gpus[r].index in indices or t.gpus[r].uuid in uuids] \
                or list(t.node_rows(node))  # names no GPU it has: it may be on any of them
            if not rows:
                return indices, None
            return (tuple(sorted(t.gpus[r].index for r in rows)),
                    max(t.gpus[r].memory_mib for r in rows))

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
                    ) -> tuple[Placement, Any, float, list[str], str]:
        """Decide the GPUs on ``node`` against fresh state and assume them, atomically.

        Returns the placement, its plan, cost, GPU UUIDs and where its interference figure
        came from ("" where the curve alone decided)."""
        self.expire()
        with self.lock:
            if pod_uid in self._placed or pod_uid in self._assumed:
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
                                            annotations=annotations, gpu_uuids=tuple(uuids))
            self._assumed[pod_uid] = (placement, None)
            self._applied_at[pod_uid] = self._clock()
            self._table.place(placement, self._applied_at[pod_uid])
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
            previous = self._reports.get(node)
            report = AgentReport(node, tuple(gpus), tuple(util_percent), tuple(memory_used_mib),
                                 self._clock())
            self._reports[node] = report
            self._reported_uuids.setdefault(node, set()).update(g.uuid for g in gpus)
            if previous is None or previous.gpus != report.gpus:
                self._rebuild()
            elif node in self._table.node_index:
                self._table.observe(node, _observations(report))

    # ---- views -----------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """The ``GET /v1/state`` document (DESIGN shape)."""
        policy = self._policy()
        now = self._clock()
        with self.lock:
            t = self._table
            pods_by_row: dict[int, list[dict[str, Any]]] = {}
            for state, placements in (("placed", self._placed.values()),
                                      ("assumed", [p for p, _ in self._assumed.values()])):
                for p in placements:
                    try:
                        rows = t.rows_of(p)
                    except PlacementError:
                        continue
                    for row in rows:
                        pods_by_row.setdefault(row, []).append(
                            {"pod": p.pod, "uid": p.pod_uid, "state": state,
                             "workload": p.workload.value, "util_percent": p.util_percent,
                             "mem_mib": p.mem_mib, "annotations": dict(p.annotations)})
            nodes: dict[str, Any] = {}
            for name in t.node_names:
                gpus = []
                for row in t.node_rows(name):
                    g = t.gpus[row]
                    fresh = now - float(t.observed_at[row]) <= policy.staleness_seconds
                    gpus.append({
                        "index": g.index, "uuid": g.uuid, "product": g.product,
                        "memory_mib": g.memory_mib,
                        "reserved_mib": float(t.reserved_mib[row]),
                        "predicted_util": float(t.reserved_util[row]),
                        "observed_util": float(t.observed_util[row]) if fresh else None,
                        "observed_mib": float(t.observed_mib[row]) if fresh else None,
                        "observed_at": float(t.observed_at[row]) if fresh else None,
                        "pods": sorted(pods_by_row.get(row, []), key=lambda d: d["pod"]),
                    })
                nodes[name] = {"gpus": gpus}
            return {"nodes": nodes, "synced": self.synced,
                    "placed": len(self._placed), "assumed": len(self._assumed)}

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
            t = self._table
            out = []
            for name in t.node_names:
                for row in t.node_rows(name):
                    fresh = now - float(t.observed_at[row]) <= policy.staleness_seconds
                    out.append((name, t.gpus[row], float(t.reserved_util[row]),
                                float(t.observed_util[row]) if fresh else None))
            return out


def _observations(report: AgentReport) -> list[GpuObservation]:
    return [GpuObservation(g.index, u, m, report.received_at_seconds)
            for g, u, m in zip(report.gpus, report.util_percent, report.memory_used_mib,
                               strict=True)]
