"""A kube-source extender against the loopback API server, and the audit of its ledger.

Shared by the fault-injection tests and ``benchmarks/fault_injection.py`` (no tests
here). The truth is what the API server holds: every pod bound to a node, not
finished, carrying tandem's placement annotations. :func:`audit` compares the
extender's ledger (placed and assumed pods) with it, pod by pod and GPU by GPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from extender.cluster.kube import KubeSource, PlainWatch
from extender.cluster.source import DONE_PHASES
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.state.view import encoded
from extender.wiring import create_app
from lab.fakes import kube_api as fake_kube_api

GPUS_PER_NODE = 2
GPU_MIB = 40960
KEY = "fault-injection-signing-key-0123"
ENV = {"TANDEM_SIGNING_KEY": KEY, "TANDEM_AGENT_TOKEN": "agent-token"}
DEMAND = {"tandem.io/gpu-util": "20", "tandem.io/gpu-mem-mib": "5000"}


def k8s_node(name: str, gpus: int = GPUS_PER_NODE) -> dict[str, Any]:
    """A Node whose GFD labels announce ``gpus`` A100s."""
    return {"metadata": {"name": name, "labels": {
        "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.memory": str(GPU_MIB)}}}


def k8s_pod(name: str, annotations: Mapping[str, str] | None = None,
            phase: str = "Pending") -> dict[str, Any]:
    """A pending pod asking for one tandem GPU (uid ``uid-<name>``)."""
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "annotations": dict(annotations or DEMAND)},
            "spec": {"containers": [{"name": "c",
                                     "resources": {"limits": {"tandem.io/gpu": "1"}}}]},
            "status": {"phase": phase}}


class IdleWatch:
    """A watch that yields nothing: tests feed events by hand or relist."""

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """No events."""
        return iter(())


@dataclass
class Replica:
    """One extender process: its WSGI app, source and ledger."""

    app: Any
    source: KubeSource

    @property
    def state(self) -> Any:
        """The replica's ClusterState."""
        return self.app.extensions["tandem"].state

    def post(self, path: str, body: Any, headers: Mapping[str, str] | None = None) -> Any:
        """POST JSON through the app; returns the response."""
        return self.app.test_client().post(path, json=body, headers=dict(headers or {}))

    def filter(self, fake: Any, name: str, nodes: list[str]) -> Any:
        """What kube-scheduler sends before bind: the full pod."""
        return self.post("/filter", {"Pod": fake.pod("ml", name), "NodeNames": nodes}).get_json()

    def bind(self, name: str, node: str) -> dict[str, Any]:
        """kube-scheduler's bind call for pod ``name``."""
        return self.post("/bind", {"PodName": name, "PodNamespace": "ml",
                                   "PodUID": f"uid-{name}", "Node": node}).get_json()


@dataclass
class Cluster:
    """The loopback API server, a client for it, and the replicas started on it."""

    fake: Any
    api: client.CoreV1Api
    replicas: list[Replica] = field(default_factory=list)

    def replica(self, watch: Any = IdleWatch, leading: Any = lambda: True,
                lean_timeout_seconds: float = 0.3, clock: Any = time.monotonic) -> Replica:
        """A started extender replica (watching when ``watch`` is PlainWatch)."""
        source = KubeSource(self.api, watch_factory=watch, watch_timeout_seconds=1,
                            background_events=False)
        if source._poster is not None:  # a lost answer is a timeout in a test, not in 10 s
            source._poster._timeout = lean_timeout_seconds
        # The loopback API server has no kubelet to admit pods: the env hand-off, so that
        # binds to one node are not held for a device plugin (tests of that: handoff tests).
        config = ConfigHolder(build_config({"state": {"assume_ttl_seconds": 30},
                                            "handoff": {"mode": "env"}}))
        app = create_app(config, source, clock, environ=ENV, may_bind=leading)
        replica = Replica(app, source)
        self.replicas.append(replica)
        return replica


@contextlib.contextmanager
def cluster(nodes: int = 2) -> Iterator[Cluster]:
    """A loopback API server with ``nodes`` GPU nodes; replicas stopped afterwards."""
    fake = fake_kube_api.FakeKubeApi(nodes=[k8s_node(f"gpu-{i}") for i in range(nodes)],
                                     record=False)
    fake.start()
    try:
        with client.ApiClient(client.Configuration(host=fake.url)) as api_client:
            c = Cluster(fake, client.CoreV1Api(api_client))
            try:
                yield c
            finally:
                for r in c.replicas:
                    r.source.stop()
    finally:
        fake.stop()


def truth(fake: Any) -> dict[str, tuple[str, frozenset[str]]]:
    """Per pod UID the API server has bound (and not finished): node and GPU UUIDs."""
    bound = {}
    with fake._cond:
        pods = [dict(p) for p in fake.pods.values()]
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        ann = pod["metadata"].get("annotations") or {}
        if not node or (pod.get("status") or {}).get("phase") in DONE_PHASES \
                or "tandem.io/gpu-uuid" not in ann:
            continue
        bound[pod["metadata"]["uid"]] = (node, frozenset(ann["tandem.io/gpu-uuid"].split(",")))
    return bound


def ledger(state: Any) -> dict[str, tuple[str, frozenset[str]]]:
    """Per pod UID the extender holds (placed or assumed): node and GPU UUIDs."""
    held: dict[str, tuple[str, set[str]]] = {}
    for node, info in encoded(state.snapshot())["nodes"].items():
        for gpu in info["gpus"]:
            for pod in gpu["pods"]:
                held.setdefault(pod["uid"], (node, set()))[1].add(gpu["uuid"])
    return {uid: (node, frozenset(uuids)) for uid, (node, uuids) in held.items()}


@dataclass(frozen=True)
class Audit:
    """Ledger against truth: pods bound but not held, held but not bound, held elsewhere."""

    lost: frozenset[str]
    leaked: frozenset[str]
    moved: frozenset[str]

    @property
    def clean(self) -> bool:
        """Nothing lost, leaked or moved."""
        return not (self.lost or self.leaked or self.moved)


def audit(fake: Any, state: Any) -> Audit:
    """Compare ``state``'s ledger with the API server's bound pods."""
    real, held = truth(fake), ledger(state)
    return Audit(frozenset(real.keys() - held.keys()), frozenset(held.keys() - real.keys()),
                 frozenset(u for u in real.keys() & held.keys() if real[u] != held[u]))


def relist(replica: Replica) -> None:
    """What a watch that expired (410) does: list everything again."""
    replica.source.sync(replica.state)


__all__ = ["PlainWatch", "cluster", "audit", "truth", "ledger", "k8s_pod", "relist"]
