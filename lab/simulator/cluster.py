"""Simulated clusters: the DESIGN ``sim:FILE`` YAML format and the built-in shapes.

Files go through the one cluster-file parser (``contracts/clusterfile.py``) that the
extender's sim source and the agent use, and the built-ins are written as that
file's documents and validated by it, so every cluster the simulator runs obeys
the same rules and names its GPUs the same way.

Built-ins (``--cluster`` accepts these names as well as a file):

- ``testbed``: Horus §5.1, 3 nodes x 4 RTX 2080 (8 GiB): 12 GPUs.
- ``large``: Horus §5.1 simulation, 128 nodes x 8 GPUs; mixed types as the
  issue asks, half RTX 2080 and half GTX 1080 (the two cards the paper fitted
  interference curves for), 8 GiB each.
"""

from __future__ import annotations

from pathlib import Path

from contracts.clusterfile import (
    ClusterFileError,
    load_cluster_file,
    parse_cluster_file,
    uniform_gpus,
)
from extender.cluster.sim import node_specs
from extender.core.snapshot import NodeSpec

RTX_2080 = ("NVIDIA GeForce RTX 2080", 8192)
GTX_1080 = ("NVIDIA GeForce GTX 1080", 8192)
BUILTINS = ("testbed", "large")



def uniform_cluster(nodes: int, gpus_per_node: int, product: str, memory_mib: int,
                    prefix: str = "gpu-node") -> list[NodeSpec]:
    """``nodes`` identical nodes named ``prefix-1..N``."""
    return node_specs(parse_cluster_file({"nodes": [
        uniform_gpus(f"{prefix}-{n + 1}", product, memory_mib, gpus_per_node)
        for n in range(nodes)]}, f"built-in {prefix} cluster"))


def builtin_cluster(name: str) -> list[NodeSpec]:
    """A built-in cluster by name (``testbed`` | ``large``)."""
    if name == "testbed":
        return uniform_cluster(3, 4, *RTX_2080)
    if name == "large":
        return (uniform_cluster(64, 8, *RTX_2080, prefix="rtx2080-node")
                + uniform_cluster(64, 8, *GTX_1080, prefix="gtx1080-node"))
    raise ClusterFileError([f"--cluster: unknown built-in {name!r} "
                            f"(valid: {', '.join(BUILTINS)}, or a file)"])


def load_cluster(spec: str) -> list[NodeSpec]:
    """A built-in name, ``sim:FILE`` or a plain YAML path."""
    if spec in BUILTINS:
        return builtin_cluster(spec)
    return node_specs(load_cluster_file(Path(spec.removeprefix("sim:"))))
