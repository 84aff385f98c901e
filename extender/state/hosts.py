"""Each node's host CPU and memory: allocatable from the node objects, requested by bound pods.

The cluster source already lists and watches every node and every bound pod; it hands
each node's ``status.allocatable`` (``NodeSpec.host``) and each bound pod's requests
(``contracts.resources.pod_requests``) here, and bind adds the pod it just bound before
the watch shows it. A finished or deleted pod gives its requests back. Decisions read
a frozen :class:`extender.core.hosts.HostView`, rebuilt on the first read after a change.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from extender.core.hosts import HostView
from extender.core.snapshot import NodeSpec


class HostLedger:
    """Allocatable per node and requests per bound pod; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._allocatable: dict[str, tuple[float, float]] = {}
        self._pods: dict[str, tuple[str, float, float]] = {}
        """Per pod UID: (node, CPU millicores, memory MiB)."""
        self._requested: dict[str, tuple[float, float]] = {}
        """Per node, the sum of its pods' requests (kept as pods come and go: a view is
        O(nodes), not O(pods))."""
        self._view: HostView | None = HostView()

    def _count(self, entry: tuple[str, float, float], sign: float) -> None:
        """Add (``sign`` 1) or take off (-1) one pod's requests on its node."""
        node, cpu, mem = entry
        have = self._requested.get(node, (0.0, 0.0))
        self._requested[node] = (max(have[0] + sign * cpu, 0.0), max(have[1] + sign * mem, 0.0))
        self._view = None

    def set_nodes(self, nodes: Iterable[NodeSpec]) -> None:
        """The source's node list (a relist): nodes without figures are not known."""
        with self._lock:
            self._allocatable = {n.name: n.host for n in nodes if n.host is not None}
            self._view = None

    def upsert_node(self, node: NodeSpec) -> None:
        """One node added or changed."""
        with self._lock:
            if self._allocatable.get(node.name) != node.host:
                if node.host is None:
                    self._allocatable.pop(node.name, None)
                else:
                    self._allocatable[node.name] = node.host
                self._view = None

    def delete_node(self, name: str) -> None:
        """A node the source no longer has."""
        with self._lock:
            if self._allocatable.pop(name, None) is not None:
                self._view = None

    def bound(self, uid: str, node: str, cpu_milli: float, mem_mib: float) -> None:
        """Pod ``uid`` is bound to ``node`` and requests this much (idempotent)."""
        entry = (node, float(cpu_milli), float(mem_mib))
        with self._lock:
            held = self._pods.get(uid)
            if uid and held != entry:
                if held is not None:
                    self._count(held, -1.0)
                self._pods[uid] = entry
                self._count(entry, 1.0)

    def node_of(self, uid: str) -> str | None:
        """The node pod ``uid`` is bound to, as far as this ledger knows."""
        with self._lock:
            entry = self._pods.get(uid)
        return None if entry is None else entry[0]

    def gone(self, uid: str) -> None:
        """Pod ``uid`` finished or was deleted: its requests are free again."""
        with self._lock:
            held = self._pods.pop(uid, None)
            if held is not None:
                self._count(held, -1.0)

    def retain(self, uids: set[str]) -> None:
        """A relist: only the pods it shows bound still request anything."""
        with self._lock:
            for uid in self._pods.keys() - uids:
                self._count(self._pods.pop(uid), -1.0)

    def view(self) -> HostView:
        """What decisions read now (the same object until something changes)."""
        with self._lock:
            if self._view is None:
                self._view = HostView(dict(self._allocatable), dict(self._requested))
            return self._view
