"""The ``sim:FILE`` cluster source: nodes (and optionally bound pods) from YAML.

The file is the shared contract ``contracts/clusterfile.py`` parses and validates
(the same parser the agent and ``tandem simulate`` use); this module turns its
nodes into the core's ``NodeSpec`` and its pods into pod objects carrying the
placement annotations, as the extender would have written them.

The source keeps an in-memory pod registry that plays the API server: ``bind``
writes annotations and ``spec.nodeName`` into it, and a fresh ``ClusterState``
started from the same source rebuilds itself from those annotations.

Bind reads the pod it binds from this registry, never from a /filter body, so a
scheduler outside the process (a scheduler simulator, a load test) can bind only
pods declared here: the file's ``pending:`` pods, or pods registered with
``POST /v1/sim/pods`` (:data:`SIM_PODS_PATH`, loopback clients only,
``extender.transport.routes``). A bind of any other pod answers how to declare it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.annotations import GPU_RESOURCE, GPU_UUID, WORKLOAD, BindOutputs, encode_outputs
from contracts.clusterfile import (
    ClusterFile,
    PendingPod,
    SimPod,
    load_cluster_file,
    parse_cluster_file,
)
from extender.cluster.source import observe_host, placement_from_pod
from extender.core import DemandError, GpuSpec, NodeSpec, PodRef, pod_ref
from extender.errors import BindConflict

DEFAULT_CLUSTER = Path(__file__).parents[1] / "demo_cluster.yaml"
SIM_PODS_PATH = "/v1/sim/pods"
"""Where a loopback client registers a pending pod with a ``sim:`` extender."""


class SimPodError(ValueError):
    """A pod that cannot be registered; ``conflict``: one of that name is already bound."""

    def __init__(self, message: str, conflict: bool = False):
        self.conflict = conflict
        super().__init__(message)


@dataclass(frozen=True)
class SimEvent:
    """An Event the sim source recorded instead of calling the API."""

    pod: str
    reason: str
    message: str
    warning: bool


def node_specs(cluster: ClusterFile) -> list[NodeSpec]:
    """The core's view of the file's nodes (memory as the core's float MiB)."""
    return [NodeSpec(n.name, tuple(GpuSpec(g.index, g.uuid, g.product, float(g.memory_mib))
                                   for g in n.gpus),
                     None if n.cpu_milli is None or n.memory_mib is None
                     else (n.cpu_milli, n.memory_mib))
            for n in cluster.nodes]


def pod_object(pod: SimPod, cluster: ClusterFile | None = None) -> dict[str, Any]:
    """A bound pod object whose annotations record the file's placement as bind would
    (``contracts.annotations.encode_outputs``), with its GPUs' UUIDs when ``cluster``
    names them, so the placement follows the GPU if an agent renumbers the indices."""
    gpus = {(n.name, g.index): g.uuid for n in cluster.nodes for g in n.gpus} \
        if cluster is not None else {}
    uuids = tuple(gpus.get((pod.node, i), "") for i in pod.gpu_index)
    outputs = BindOutputs(tuple(pod.gpu_index), uuids if all(uuids) else (),
                          float(pod.util_percent), float(pod.mem_mib))
    annotations = {WORKLOAD: pod.workload, **encode_outputs(outputs), **dict(pod.annotations)}
    if not outputs.gpu_uuids:
        annotations.pop(GPU_UUID, None)
    return {
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                     "annotations": annotations},
        "spec": {"nodeName": pod.node},
        "status": {"phase": "Running"},
    }


def pending_pod_object(pod: PendingPod) -> dict[str, Any]:
    """A pending pod object asking for the file's ``gpus`` of ``tandem.io/gpu``."""
    return {
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                     "annotations": dict(pod.annotations)},
        "spec": {"containers": [{"name": "main", "resources": {
            "limits": {GPU_RESOURCE: str(pod.gpus)}}}]},
        "status": {"phase": "Pending"},
    }


def parse_cluster(raw: Any) -> tuple[list[NodeSpec], list[dict[str, Any]]]:
    """Nodes and bound pod objects from a decoded sim file; raises ClusterFileError."""
    cluster = parse_cluster_file(raw)
    return node_specs(cluster), [pod_object(p, cluster) for p in cluster.pods]


class SimSource:
    """A cluster held in memory: YAML nodes plus a pod registry standing in for the API."""

    kubelet_admits = False  # binds confirm at once: nobody admits, nothing to hand over
    api = None  # no Kubernetes API: learning is not persisted, no pending pods to list
    signs_placements = False  # the file and this registry are trusted as written

    def __init__(self, nodes: list[NodeSpec], pods: list[dict[str, Any]] | None = None):
        self.nodes = list(nodes)
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.events: list[SimEvent] = []
        self.binds = 0
        for pod in pods or []:
            self.create_pod(pod)

    @classmethod
    def from_file(cls, path: str | Path) -> SimSource:
        """Load a sim cluster file; raises ClusterFileError (also for unreadable files)."""
        return cls.from_cluster(load_cluster_file(path))

    @classmethod
    def from_cluster(cls, cluster: ClusterFile) -> SimSource:
        """A source holding a parsed cluster file's nodes and bound pods."""
        return cls(node_specs(cluster), [*(pod_object(p, cluster) for p in cluster.pods),
                                         *(pending_pod_object(p) for p in cluster.pending)])

    def create_pod(self, pod: Mapping[str, Any]) -> PodRef:
        """Register a pod (deep-copied), as a user's ``kubectl apply`` would."""
        ref = pod_ref(pod)
        with self._lock:
            self._pods[(ref.namespace, ref.name)] = copy.deepcopy(dict(pod))
        return ref

    def register_pod(self, pod: Any) -> PodRef:
        """Register a pending pod sent by a client (``POST /v1/sim/pods``): a Pod object
        with ``metadata.name`` (``namespace`` default, ``uid`` made up when absent) and no
        ``spec.nodeName``. A pending pod of that name is replaced; SimPodError otherwise."""
        if not isinstance(pod, Mapping):
            raise SimPodError("the body must be a Pod object")
        try:
            ref = pod_ref(pod)
        except DemandError as exc:
            raise SimPodError(str(exc)) from None
        spec = pod.get("spec", {})
        if not isinstance(spec, Mapping) or spec.get("nodeName"):
            raise SimPodError("register pods waiting for a node (no spec.nodeName); bound "
                              "pods belong in the cluster file's pods:")
        obj = copy.deepcopy(dict(pod))
        meta = obj["metadata"] = dict(obj["metadata"])
        meta["namespace"] = ref.namespace
        meta["uid"] = ref.uid or f"uid-{ref.namespace}-{ref.name}"
        obj["status"] = {"phase": "Pending"}
        with self._lock:
            held = self._pods.get((ref.namespace, ref.name))
            if held is not None and (held.get("spec") or {}).get("nodeName"):
                raise SimPodError(f"pod {ref.key} is already bound", conflict=True)
            self._pods[(ref.namespace, ref.name)] = obj
        return PodRef(ref.namespace, ref.name, meta["uid"])

    def pods(self) -> list[dict[str, Any]]:
        """Copies of every registered pod."""
        with self._lock:
            return [copy.deepcopy(p) for p in self._pods.values()]

    def sync(self, state: Any) -> None:
        """Load nodes and bound pods into ``state`` and mark it synced."""
        state.set_nodes(self.nodes)
        for pod in self.pods():
            observe_host(state, pod)
            placement = placement_from_pod(pod)
            if placement is not None:
                state.confirm(placement)
        state.mark_synced()

    def start(self, state: Any) -> None:
        """The sim changes only through ``bind``: one sync is all there is to watch."""
        self.sync(state)

    def use_signer(self, signer: Any, on_untrusted: Any = None) -> None:
        """Never called (``signs_placements`` is False): a simulation has no pod owners."""
        raise RuntimeError("the sim: source signs no placements (a simulation has no pod owners)")

    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A copy of the registered pod, or None."""
        with self._lock:
            pod = self._pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def current_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The registered pod (the registry plays the API server); BindConflict saying how
        to declare one that is not there."""
        pod = self.read_pod(namespace, name)
        if pod is None:
            raise BindConflict(
                f"pod {namespace}/{name} is not in the simulated cluster: declare it under "
                f"pending: in the cluster file, or POST it to {SIM_PODS_PATH} from this "
                "machine before the scheduler binds it", None)
        return pod

    def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str],
             placement: Any = None) -> bool:
        """Record the binding in the registry; the sim confirms at once (the extender's
        ledger holds ``placement`` itself: nothing rebuilds it from a pod owner's edits)."""
        with self._lock:
            obj = self._pods.setdefault(
                (pod.namespace, pod.name),
                {"metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
                 "spec": {}, "status": {}})
            meta = obj.setdefault("metadata", {})
            meta.setdefault("annotations", {}).update(annotations)
            obj.setdefault("spec", {})["nodeName"] = node
            obj.setdefault("status", {})["phase"] = "Running"
            self.binds += 1
        return True

    def record_event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        """Keep the event in memory (the demo prints them)."""
        with self._lock:
            self.events.append(SimEvent(pod.key, reason, message, warning))

    def stop(self) -> None:
        """Nothing to stop."""
