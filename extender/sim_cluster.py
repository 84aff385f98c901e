"""The ``sim:FILE`` cluster source: nodes (and optionally bound pods) from YAML.

File format (DESIGN; extra keys are errors so typos surface)::

    nodes:
      - name: gpu-node-1
        gpus:                         # one entry per GPU, or use count
          - {product: NVIDIA-H100-80GB-HBM3, memory_mib: 81559, count: 8}
      - name: cpu-node                # no gpus: inventory unknown
    pods:                             # optional, already bound (restart scenarios, benchmarks)
      - {name: p1, namespace: default, uid: u1, node: gpu-node-1, gpu_index: [0],
         util_percent: 30, mem_mib: 8000, workload: training}

The source keeps an in-memory pod registry that plays the API server: ``bind``
writes annotations and ``spec.nodeName`` into it, and a fresh ``ClusterState``
started from the same source rebuilds itself from those annotations.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from extender.core import GpuSpec, NodeSpec, PodRef, pod_ref
from extender.source import OUT_GPU_INDEX, OUT_MEM, OUT_UTIL, placement_from_pod

DEFAULT_CLUSTER = Path(__file__).with_name("demo_cluster.yaml")


class SimFileError(ValueError):
    """The sim cluster file is invalid; ``problems`` holds every problem with its path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid sim cluster:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class SimEvent:
    """An Event the sim source recorded instead of calling the API."""

    pod: str
    reason: str
    message: str
    warning: bool


def _gpus(node: str, raw: Any, path: str, problems: list[str]) -> tuple[GpuSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(f"{path}: must be a list")
        return ()
    gpus: list[GpuSpec] = []
    for i, entry in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: must be a mapping")
            continue
        unknown = set(entry) - {"product", "memory_mib", "count", "index", "uuid"}
        if unknown:
            problems.append(f"{where}: unknown keys {sorted(unknown)}")
        product, mem = entry.get("product"), entry.get("memory_mib")
        count = entry.get("count", 1)
        if not isinstance(product, str) or not product:
            problems.append(f"{where}.product: must be a non-empty string")
            continue
        if isinstance(mem, bool) or not isinstance(mem, (int, float)) or mem <= 0:
            problems.append(f"{where}.memory_mib: must be a positive number")
            continue
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
            problems.append(f"{where}.count: must be an integer in 1..64")
            continue
        for _ in range(count):
            index = entry.get("index", len(gpus)) if count == 1 else len(gpus)
            uuid = entry.get("uuid") if count == 1 and "uuid" in entry else \
                f"GPU-sim-{node}-{index}"
            gpus.append(GpuSpec(int(index), str(uuid), product, float(mem)))
    if len({g.index for g in gpus}) != len(gpus):
        problems.append(f"{path}: GPU indices repeat")
    return tuple(gpus)


def parse_cluster(raw: Any) -> tuple[list[NodeSpec], list[dict[str, Any]]]:
    """Nodes and bound pod objects from a decoded sim file; raises SimFileError."""
    problems: list[str] = []
    if not isinstance(raw, Mapping) or not isinstance(raw.get("nodes"), list):
        raise SimFileError(["nodes: a list of nodes is required"])
    for key in set(raw) - {"nodes", "pods"}:
        problems.append(f"{key}: unknown key (valid: nodes, pods)")
    nodes: list[NodeSpec] = []
    for i, entry in enumerate(raw["nodes"]):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            problems.append(f"nodes[{i}].name: must be a string")
            continue
        nodes.append(NodeSpec(entry["name"], _gpus(entry["name"], entry.get("gpus"),
                                                   f"nodes[{i}].gpus", problems)))
    if len({n.name for n in nodes}) != len(nodes):
        problems.append("nodes: names repeat")
    pods = [_pod(entry, f"pods[{i}]", problems) for i, entry in enumerate(raw.get("pods") or [])]
    if problems:
        raise SimFileError(problems)
    return nodes, pods


def _pod(entry: Any, path: str, problems: list[str]) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        problems.append(f"{path}: must be a mapping")
        return {}
    try:
        indices = [int(i) for i in entry.get("gpu_index", [0])]
        annotations = {
            "tandem.io/workload": str(entry.get("workload", "training")),
            OUT_GPU_INDEX: ",".join(str(i) for i in indices),
            OUT_UTIL: str(float(entry.get("util_percent", 0.0))),
            OUT_MEM: str(float(entry.get("mem_mib", 0.0))),
            **{str(k): str(v) for k, v in (entry.get("annotations") or {}).items()},
        }
        name = str(entry["name"])
    except (KeyError, TypeError, ValueError) as exc:
        problems.append(f"{path}: {exc!r}")
        return {}
    return {
        "metadata": {"name": name, "namespace": str(entry.get("namespace", "default")),
                     "uid": str(entry.get("uid", f"uid-{name}")), "annotations": annotations},
        "spec": {"nodeName": str(entry.get("node", ""))},
        "status": {"phase": "Running"},
    }


class SimSource:
    """A cluster held in memory: YAML nodes plus a pod registry standing in for the API."""

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
        """Load a sim cluster file; raises SimFileError (also for unreadable files)."""
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise SimFileError([f"{path}: {exc}"]) from None
        nodes, pods = parse_cluster(raw)
        return cls(nodes, pods)

    def create_pod(self, pod: Mapping[str, Any]) -> PodRef:
        """Register a pod (deep-copied), as a user's ``kubectl apply`` would."""
        ref = pod_ref(pod)
        with self._lock:
            self._pods[(ref.namespace, ref.name)] = copy.deepcopy(dict(pod))
        return ref

    def delete_pod(self, namespace: str, name: str) -> None:
        """Remove a pod from the registry (the ledger learns of it through ``forget``)."""
        with self._lock:
            self._pods.pop((namespace, name), None)

    def pods(self) -> list[dict[str, Any]]:
        """Copies of every registered pod."""
        with self._lock:
            return [copy.deepcopy(p) for p in self._pods.values()]

    def start(self, state: Any) -> None:
        """Load nodes and bound pods into ``state`` and mark it synced."""
        state.set_nodes(self.nodes)
        for pod in self.pods():
            placement = placement_from_pod(pod)
            if placement is not None:
                state.confirm(placement)
        state.synced = True

    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A copy of the registered pod, or None."""
        with self._lock:
            pod = self._pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str]) -> bool:
        """Record the binding in the registry; the sim confirms at once."""
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
