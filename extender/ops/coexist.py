"""Nodes where tandem's device plugin and the NVIDIA device plugin both advertise GPUs.

Both plugins hand out the same physical GPUs, each unaware of the other's grants, so
a pod asking for ``nvidia.com/gpu`` can be given a GPU tandem has placed pods on.
docs/adoption.md describes the node-pool layout that keeps them apart.
"""

from __future__ import annotations

from typing import Any

from contracts.annotations import GPU_RESOURCE

NVIDIA_GPU = "nvidia.com/gpu"


def _count(value: Any) -> int:
    """A quantity of devices (``"8"``); anything else counts as none."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def doubly_advertised(api: Any) -> list[dict[str, Any]]:
    """Nodes whose allocatable has both ``nvidia.com/gpu`` and ``tandem.io/gpu`` (> 0)."""
    out = []
    for node in api.list_node().items:
        allocatable = (node.status.allocatable if node.status else None) or {}
        nvidia, tandem = _count(allocatable.get(NVIDIA_GPU, 0)), \
            _count(allocatable.get(GPU_RESOURCE, 0))
        if nvidia > 0 and tandem > 0:
            out.append({"node": node.metadata.name, NVIDIA_GPU: nvidia, GPU_RESOURCE: tandem})
    return sorted(out, key=lambda d: d["node"])
