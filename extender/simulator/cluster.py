"""Simulated clusters: the DESIGN ``sim:FILE`` YAML format and the built-in shapes.

Built-ins (``--cluster`` accepts these names as well as a file):

- ``testbed``: Horus §5.1, 3 nodes x 4 RTX 2080 (8 GiB): 12 GPUs.
- ``large``: Horus §5.1 simulation, 128 nodes x 8 GPUs; mixed types as the
  issue asks, half RTX 2080 and half GTX 1080 (the two cards the paper fitted
  interference curves for), 8 GiB each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from extender.core.snapshot import GpuSpec, NodeSpec

RTX_2080 = ("NVIDIA GeForce RTX 2080", 8192.0)
GTX_1080 = ("NVIDIA GeForce GTX 1080", 8192.0)


class ClusterError(ValueError):
    """A cluster description is malformed; ``path`` points at the culprit."""

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def uniform_cluster(nodes: int, gpus_per_node: int, product: str, memory_mib: float,
                    prefix: str = "gpu-node") -> list[NodeSpec]:
    """``nodes`` identical nodes named ``prefix-1..N``."""
    return [_node(f"{prefix}-{n + 1}", [(product, memory_mib)] * gpus_per_node)
            for n in range(nodes)]


def _node(name: str, gpus: Sequence[tuple[str, float]]) -> NodeSpec:
    return NodeSpec(name, tuple(GpuSpec(i, f"GPU-{name}-{i}", p, m)
                                for i, (p, m) in enumerate(gpus)))


def builtin_cluster(name: str) -> list[NodeSpec]:
    """A built-in cluster by name (``testbed`` | ``large``)."""
    if name == "testbed":
        return uniform_cluster(3, 4, *RTX_2080)
    if name == "large":
        return (uniform_cluster(64, 8, *RTX_2080, prefix="rtx2080-node")
                + uniform_cluster(64, 8, *GTX_1080, prefix="gtx1080-node"))
    raise ClusterError("--cluster", f"unknown built-in {name!r} (valid: testbed, large, or a file)")


def cluster_from_mapping(data: Any, path: str = "cluster") -> list[NodeSpec]:
    """Validate the DESIGN cluster document ``{nodes: [{name, gpus: [...]}]}``."""
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
        raise ClusterError(path, "expected a mapping with a 'nodes' list")
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(data["nodes"]):
        where = f"{path}.nodes[{i}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            raise ClusterError(where, "expected {name: str, gpus: [...]}")
        if raw["name"] in seen:
            raise ClusterError(f"{where}.name", f"duplicate node {raw['name']!r}")
        seen.add(raw["name"])
        gpus: list[tuple[str, float]] = []
        for j, g in enumerate(raw.get("gpus") or []):
            gwhere = f"{where}.gpus[{j}]"
            if not isinstance(g, Mapping) or not isinstance(g.get("product"), str):
                raise ClusterError(gwhere, "expected {product: str, memory_mib: number}")
            memory, count = g.get("memory_mib"), g.get("count", 1)
            if not isinstance(memory, int | float) or not math.isfinite(memory) or memory <= 0:
                raise ClusterError(f"{gwhere}.memory_mib", "must be a positive number")
            if not isinstance(count, int) or count < 1:
                raise ClusterError(f"{gwhere}.count", "must be an integer >= 1")
            gpus.extend([(g["product"], float(memory))] * count)
        nodes.append(_node(raw["name"], gpus))
    if not any(n.gpus for n in nodes):
        raise ClusterError(path, "the cluster has no GPUs")
    return nodes


def load_cluster(spec: str) -> list[NodeSpec]:
    """A built-in name, ``sim:FILE`` or a plain YAML path."""
    if spec in ("testbed", "large"):
        return builtin_cluster(spec)
    file = Path(spec.removeprefix("sim:"))
    try:
        import yaml

        data = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise ClusterError(str(file), f"cannot read: {exc.strerror}") from None
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError
        raise ClusterError(str(file), f"not valid YAML: {exc}") from None
    return cluster_from_mapping(data, str(file))
