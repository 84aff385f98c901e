"""GPU inventory: the source's nodes, overridden per node by what its agent measured.

A report carries the node's GPU inventory, which takes precedence over the
source's (GFD labels or the sim file) because it is measured. Every UUID an agent
ever reported is remembered per node: one missing now has vanished. Agent
observations are soft state with a receipt time on the extender's clock. The
caller (``ClusterState``) holds the lock. Not thread-safe on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from extender.core import GpuObservation, GpuSpec, NodeSpec


@dataclass(frozen=True)
class NodeReport:
    """A node's newest agent report as the ledger keeps it: inventory, per-GPU load and
    when it arrived (extender clock)."""

    node: str
    gpus: tuple[GpuSpec, ...]
    util_percent: tuple[float, ...]
    memory_used_mib: tuple[float, ...]
    received_at_seconds: float

    def observations(self) -> list[GpuObservation]:
        """One observation per GPU, stamped with the receipt time."""
        return [GpuObservation(g.index, u, m, self.received_at_seconds)
                for g, u, m in zip(self.gpus, self.util_percent, self.memory_used_mib,
                                   strict=True)]


class Inventory:
    """Nodes from the source and the agents' newest reports."""

    def __init__(self) -> None:
        self._source: dict[str, NodeSpec] = {}
        self._reports: dict[str, NodeReport] = {}
        self._reported_uuids: dict[str, set[str]] = {}

    def set_nodes(self, nodes: Iterable[NodeSpec]) -> None:
        """Replace the source's node list."""
        self._source = {n.name: n for n in nodes}

    def upsert_node(self, node: NodeSpec) -> bool:
        """Add or update one source node; True when it changed."""
        if self._source.get(node.name) == node:
            return False
        self._source[node.name] = node
        return True

    def delete_node(self, name: str) -> bool:
        """Forget a source node; True when it was known."""
        return self._source.pop(name, None) is not None

    def report(self, report: NodeReport) -> bool:
        """Keep a node's newest report; True when its measured inventory changed."""
        previous = self._reports.get(report.node)
        self._reports[report.node] = report
        self._reported_uuids.setdefault(report.node, set()).update(g.uuid for g in report.gpus)
        return previous is None or previous.gpus != report.gpus

    def source_types(self) -> dict[str, frozenset[str]]:
        """Per node, the GPU types the source lists (GFD labels, the sim file), not what its
        agent reports; nodes that list none are absent."""
        return {name: frozenset(g.gpu_type for g in spec.gpus)
                for name, spec in self._source.items() if spec.gpus}

    def nodes(self) -> list[NodeSpec]:
        """Each source node, with its agent's measured GPUs when it reported some."""
        nodes = []
        for name in sorted(self._source):
            report = self._reports.get(name)
            gpus = report.gpus if report is not None and report.gpus else None
            nodes.append(NodeSpec(name, gpus) if gpus else self._source[name])
        return nodes

    def vanished(self, nodes: Iterable[NodeSpec]) -> dict[str, frozenset[str]]:
        """Per reporting node, the UUIDs its agent once reported that ``nodes`` lacks."""
        return {n.name: frozenset(self._reported_uuids[n.name] - {g.uuid for g in n.gpus})
                for n in nodes if n.name in self._reported_uuids}

    def reports(self) -> Iterable[NodeReport]:
        """Every node's newest report."""
        return self._reports.values()
