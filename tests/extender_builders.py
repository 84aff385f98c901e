"""Builders for extender tests: pods, clusters, apps (shared by tests/test_extender_*.py)."""

from __future__ import annotations

import itertools
from typing import Any

from extender.config import ConfigHolder, build_config
from extender.core import GpuSpec, NodeSpec
from extender.metrics import Metrics
from extender.profiles import parse_profiles
from extender.routes import create_app
from extender.sim_cluster import SimSource
from extender.wiring import default_planner

TOKEN = "s3cret-token"
_uids = itertools.count()

A100 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"

PROFILES = parse_profiles({"profiles": [
    {"model": "resnet50", "gpu_type": A100, "linear": {"alpha_ms": 0.6, "beta_ms": 3.0},
     "memory_mib": 2500},
    {"model": "resnet50", "gpu_type": H100, "linear": {"alpha_ms": 0.35, "beta_ms": 2.0},
     "memory_mib": 2500},
]}, "test")


def pod(name: str = "p", gpus: int | str = 1, uid: str | None = None, namespace: str = "default",
        **annotations: str) -> dict[str, Any]:
    """A Pod object; annotation kwargs use underscores for dashes (gpu_util -> gpu-util)."""
    ann = {f"tandem.io/{k.replace('_', '-')}": v for k, v in annotations.items()}
    return {"metadata": {"name": name, "namespace": namespace,
                         "uid": uid if uid is not None else f"uid-{name}-{next(_uids)}",
                         "annotations": ann},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"tandem.io/gpu": str(gpus)}}}]}}


def training(name: str = "t", util: float = 40, mem: float = 10000, gpus: int = 1,
             uid: str | None = None) -> dict[str, Any]:
    """A training pod with asserted demand."""
    return pod(name, gpus, uid, gpu_util=str(util), gpu_mem_mib=str(mem))


def inference(name: str = "s", model: str = "resnet50", slo: float = 100, rate: float = 200,
              uid: str | None = None) -> dict[str, Any]:
    """An inference session pod."""
    return pod(name, 1, uid, workload="inference", model=model, slo_ms=str(slo),
               rate_rps=str(rate))


def node(name: str, count: int = 4, product: str = A100, memory_mib: float = 40960) -> NodeSpec:
    """A node with ``count`` identical GPUs."""
    return NodeSpec(name, tuple(GpuSpec(i, f"GPU-{name}-{i}", product, memory_mib)
                                for i in range(count)))


class FakeClock:
    """A settable clock."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_app(nodes: list[NodeSpec] | None = None, raw_config: dict[str, Any] | None = None,
             source: SimSource | None = None, clock: FakeClock | None = None, **kwargs: Any):
    """(flask app, extender, sim source, clock) over a sim cluster."""
    source = source or SimSource(nodes if nodes is not None else [node("n1"), node("n2")])
    clock = clock or FakeClock()
    holder = ConfigHolder(build_config(raw_config or {}))
    kwargs.setdefault("profiles", PROFILES)
    kwargs.setdefault("planner", default_planner())
    kwargs.setdefault("environ", {"TANDEM_AGENT_TOKEN": TOKEN})
    kwargs.setdefault("metrics", Metrics())
    app = create_app(holder, source, clock, **kwargs)
    return app, app.extensions["tandem"], source, clock


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs with NodeNames (nodeCacheCapable: true)."""
    return {"Pod": p, "NodeNames": names}


def args_nodes(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs with a full NodeList (nodeCacheCapable: false)."""
    return {"Pod": p, "Nodes": {"metadata": {}, "items": [
        {"metadata": {"name": n}, "spec": {}, "status": {}} for n in names]}}


def binding(p: dict[str, Any], node_name: str) -> dict[str, Any]:
    """ExtenderBindingArgs for ``p``."""
    m = p["metadata"]
    return {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"],
            "Node": node_name}
