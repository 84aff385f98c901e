"""A cluster snapshot (its value types, re-exported here, are in ``extender.core.values``).

:class:`Snapshot` is what every decision reads (``extender.core.decide``'s entry
points): the GPU table, the policy, the knowledge, the time. Everything here is
frozen so that decisions can be replayed and compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from extender.core.values import (
    GpuObservation,
    GpuRef,
    GpuSpec,
    GpuUuid,
    NodeName,
    NodeSpec,
    Placement,
    PodUid,
    SessionSpec,
    Workload,
    gpu_type_of,
    split_gpus,
)

if TYPE_CHECKING:
    from extender.core.cost import CostPolicy
    from extender.core.demand import UtilKnowledge
    from extender.core.table import GpuTable

__all__ = ["GpuObservation", "GpuRef", "GpuSpec", "GpuUuid", "NodeName", "NodeSpec", "Placement",
           "PodUid", "SessionSpec", "Snapshot", "Workload", "gpu_type_of", "split_gpus"]


class PlacementLookup(Protocol):
    """The placements a snapshot holds, by pod UID (placed or assumed)."""

    def get(self, uid: str) -> Placement | None:
        """The pod's placement, or None."""
        ...


class KnowledgeLike(Protocol):
    """What the cluster taught, as resolution reads it (``extender.learning.knowledge``)."""

    def util(self, gpus: int = 1, namespace: str | None = None) -> UtilKnowledge:
        """What resolution knows of a pod of ``gpus`` GPUs in ``namespace``."""
        ...


class _NoPlacements:
    def get(self, uid: str) -> Placement | None:
        return None


@dataclass(frozen=True)
class Snapshot:
    """One consistent view of the cluster for one decision; nothing in it changes.

    ``table`` and ``placements`` are references the state's writers never change again
    (they copy before their next write), so a snapshot is O(1) to take and decisions
    over it need no lock."""

    table: GpuTable
    policy: CostPolicy
    """The policy in force: the configured one with what was learned merged in, once."""
    now: float
    """The clock the table's observations are stamped with (freshness of agent reports)."""
    placements: PlacementLookup = field(default_factory=_NoPlacements)
    knowledge: KnowledgeLike | Any = None
    generations: Mapping[str, int] = field(default_factory=dict)
    """Per node, a counter every change to the node's GPUs bumps (``assume`` checks it)."""
    epoch: int = 0
    """Bumped when the table is rebuilt (nodes added, removed or re-measured)."""
    synced: bool = True
    """False until the cluster source's first full sync is in."""
    source_types: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Per node, the GPU types the cluster source lists (not what its agent reports)."""

    def placement_of(self, uid: str) -> Placement | None:
        """The pod's placement (placed or assumed) in this snapshot."""
        return self.placements.get(uid)

    def stamp(self, node: str) -> tuple[int, int]:
        """What ``node`` was in this snapshot, as ``ClusterState.assume`` checks it (epoch,
        generation): a decision carries it instead of the snapshot, which it may let go."""
        return self.epoch, self.generations.get(node, 0)

