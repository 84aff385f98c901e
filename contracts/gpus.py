"""A GPU's identity across processes: its index on the node and its UUID, looked up UUID first.

Indices are what people, ``tandem.io/gpu-index`` and the per-GPU servers' ports use;
they are renumbered when a GPU vanishes from a node (NVML numbers the GPUs it sees).
The UUID is the GPU itself. Every lookup of recorded GPUs in an inventory (the
extender's GPU table, the device plugin, learning attribution) goes through
:func:`find_gpus`, so all of them follow a GPU by its UUID the same way.

Product names are spelt differently by GFD labels (``NVIDIA-A100-SXM4-40GB``), NVML
(``NVIDIA A100-SXM4-40GB``) and profile files; :func:`gpu_type_of` is the one
normaliser to the type name that keys curves, profiles and learned estimates.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


def gpu_type_of(product: str) -> str:
    """Canonical GPU type name of a product string (runs of whitespace become one dash)."""
    return "-".join(product.strip().split())


@dataclass(frozen=True)
class GpuRef:
    """One GPU: its index on its node, and its UUID (``""``: not known)."""

    index: int
    uuid: str

    @property
    def ref(self) -> GpuRef:
        """The identity alone (a subclass's extra fields dropped)."""
        return GpuRef(self.index, self.uuid)


@dataclass(frozen=True)
class GpuSpec(GpuRef):
    """A GPU of an inventory: identity, product name and memory."""

    product: str
    memory_mib: float

    @property
    def gpu_type(self) -> str:
        """The product as a canonical type name (see :func:`gpu_type_of`)."""
        return gpu_type_of(self.product)


def refs_of(indices: Sequence[int], uuids: Sequence[str]) -> tuple[GpuRef, ...]:
    """Recorded GPUs (``tandem.io/gpu-index`` and ``gpu-uuid`` read back): UUIDs pair with
    indices only when there is one per index; otherwise none is trusted."""
    paired = len(uuids) == len(indices)
    return tuple(GpuRef(i, uuids[k] if paired else "") for k, i in enumerate(indices))


def find_gpus(wanted: Sequence[GpuRef], have: Sequence[GpuRef],
              gone: Collection[str] = (), *, complete: bool = False) -> list[int] | None:
    """Positions in ``have`` of the GPUs ``wanted`` records, UUID first; None if not all.

    When ``have`` lists every wanted UUID, they decide, whatever the indices now are
    (a GPU vanished and NVML renumbered the rest). When a wanted UUID is in ``gone``
    (it was seen on this node and is no longer), its index names another GPU now: None.
    Otherwise the indices decide (an inventory without real UUIDs, e.g. from node
    labels). ``complete``: ``have`` is every GPU with its real UUID, so a wanted UUID
    it lacks is gone.
    """
    by_uuid = {g.uuid: k for k, g in enumerate(have) if g.uuid}
    uuids = [w.uuid for w in wanted]
    if wanted and all(uuids) and all(u in by_uuid for u in uuids):
        return [by_uuid[u] for u in uuids]
    if any(u and (u in gone or (complete and u not in by_uuid)) for u in uuids):
        return None
    by_index = {g.index: k for k, g in enumerate(have)}
    found = [by_index.get(w.index) for w in wanted]
    return None if None in found else [k for k in found if k is not None]


def holds(wanted: Sequence[GpuRef], have: Sequence[GpuRef], position: int) -> bool:
    """Whether ``have[position]`` is one of the GPUs ``wanted`` records (:func:`find_gpus`)."""
    found = find_gpus(wanted, have)
    return found is not None and position in found
