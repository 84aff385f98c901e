"""A cluster snapshot and its value types: nodes, GPUs, placements, observations.

:class:`Snapshot` is what every decision reads (``extender.core.decide``'s entry
points): the GPU table, the policy, the knowledge, the time. Everything here is
frozen so that decisions can be replayed and compared. Per-GPU ``util_percent``
and ``mem_mib`` of a placement are what the job is expected to use on *each* of
its GPUs (Horus places a multi-GPU job's workers one per GPU, each with the job's
predicted utilisation).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NewType, Protocol

from contracts.gpus import GpuRef, GpuSpec, gpu_type_of, refs_of
from planner.types import SessionSpec

if TYPE_CHECKING:
    from extender.core.cost import CostPolicy
    from extender.core.demand import UtilKnowledge
    from extender.core.table import GpuTable

__all__ = ["GpuObservation", "GpuRef", "GpuSpec", "GpuUuid", "NodeName", "NodeSpec", "Placement",
           "PodUid", "SessionSpec", "Snapshot", "Workload", "gpu_type_of"]

NodeName = NewType("NodeName", str)
"""A Kubernetes node's name."""
PodUid = NewType("PodUid", str)
"""A pod's ``metadata.uid`` (names are reused across pods; uids are not)."""
GpuUuid = NewType("GpuUuid", str)
"""A GPU's NVML UUID (``GPU-...``), what ``tandem.io/gpu-uuid`` and the device plugin carry."""


class Workload(enum.Enum):
    """How a job uses its GPU: self-managed training or a session in the inference server."""

    TRAINING = "training"
    INFERENCE = "inference"


@dataclass(frozen=True)
class NodeSpec:
    """A node and its GPU inventory (empty when unknown)."""

    name: NodeName
    gpus: tuple[GpuSpec, ...]


@dataclass(frozen=True)
class Placement:
    """A pod placed (or assumed) on GPUs of one node, with its per-GPU demand."""

    pod_uid: PodUid
    pod: str
    """``namespace/name``, for humans."""
    node: NodeName
    gpu_indices: tuple[int, ...]
    util_percent: float
    mem_mib: float
    workload: Workload = Workload.TRAINING
    session: SessionSpec | None = None
    annotations: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """The pod's ``tandem.io/*`` annotations, sorted (for operators and the agent's sync)."""
    weight: int = 1
    """Share weight of a best-effort session (inference without SLO); 1 for everything else."""
    gpu_uuids: tuple[str, ...] = field(default=(), compare=False)
    """The GPUs' UUIDs when known, one per index: they find the GPUs again after an agent
    report renumbers a node's indices (a GPU vanished), so a pod stays on its GPU."""
    containers: tuple[tuple[str, tuple[int, ...]], ...] = field(default=(), compare=False)
    """Which container gets which of ``gpu_indices`` (:func:`split_gpus`), as bind decided:
    the device plugin hands them out container by container."""
    trusted: bool = field(default=True, compare=False)
    """False for a bound pod with no placement record bind wrote: it holds every GPU of its
    node in full, the device plugin refuses it, ``/v1/state`` lists it as ``untrusted``."""

    @property
    def best_effort(self) -> bool:
        """An inference session without an SLO: it runs in the duty cycle's slack."""
        return self.workload is Workload.INFERENCE and self.session is None

    @property
    def gpus(self) -> tuple[GpuRef, ...]:
        """The placement's GPUs as recorded (UUIDs only when there is one per index)."""
        return refs_of(self.gpu_indices, self.gpu_uuids)


@dataclass(frozen=True)
class GpuObservation:
    """What an agent measured on one GPU, and when (seconds on the extender's clock)."""

    index: int
    util_percent: float
    memory_used_mib: float
    observed_at_seconds: float



def split_gpus(counts: tuple[tuple[str, int, bool], ...], indices: tuple[int, ...],
               ) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Which container gets which GPU. ``counts``: (name, ``tandem.io/gpu`` count, init
    container?) in the kubelet's admission order, init containers first. The containers
    take the bound GPUs in order, each its count; an init container takes the first ones
    (the kubelet reuses an init container's devices for the containers after it)."""
    out, at = [], 0
    for name, count, init in counts:
        if count <= 0:
            continue
        if init:
            out.append((name, indices[:count]))
        else:
            out.append((name, indices[at:at + count]))
            at += count
    return tuple(out)


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

