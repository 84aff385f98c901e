"""The simulated cluster file (``--cluster sim:FILE``, ``--gpus sim:FILE``): its one parser.

The extender's sim source, the node agent's sim GPUs, ``tandem simulate`` and the
demo all read the file through ``load_cluster_file``, so a file one of them
accepts the others accept too, and they name every GPU the same way::

    nodes:                                  # required, at least one GPU in all
      - name: gpu-node-1                    # unique, non-empty
        gpus:                               # optional (a node without GPUs)
          - {product: NVIDIA-H100-80GB-HBM3, memory_mib: 81559, count: 8}
          - {product: NVIDIA-A100-SXM4-40GB, memory_mib: 40960, index: 8, uuid: GPU-x}
    pods:                                   # optional, already bound (restart scenarios)
      - {name: p1, namespace: default, uid: u1, node: gpu-node-1, gpu_index: [0],
         util_percent: 30, mem_mib: 8000, workload: training, annotations: {k: v}}
    pending:                                # optional, waiting for a node (the extender's
      - {name: p2, namespace: default, uid: u2, gpus: 1,   # sim source binds them when a
         annotations: {tandem.io/gpu-util: "30", tandem.io/gpu-mem-mib: "8000"}}  # scheduler asks

Rules, the same for every reader:

- unknown keys are errors that list the valid keys, so typos surface;
- a node's ``cpu`` and ``memory`` (optional) are its allocatable Kubernetes quantities
  (``64``, ``500m``, ``256Gi``), read by ``contracts.resources``;
- ``memory_mib`` is a positive integer, as NVML reports it (the agent's reports carry
  whole MiB; a fractional size would never match them);
- ``count`` is an integer in 1..64 (``MAX_GPUS_PER_ENTRY``); ``index`` and ``uuid`` are
  allowed only on an entry with count 1;
- a GPU without an explicit index takes the next position on its node; without an
  explicit uuid it is ``sim_gpu_uuid(node, index)``; indices repeat nowhere on a node and
  uuids nowhere in the cluster; GPUs are listed by index;
- a pod names a node of the file and GPU indices that node has;
- a pending pod asks for ``gpus`` (1..64, default 1) of ``tandem.io/gpu``; names (and
  uids) repeat nowhere among pods and pending pods.

Validation collects every problem with its path (``nodes[1].gpus[0].memory_mib: must be
a positive integer (MiB), got 8192.5``) and raises one ``ClusterFileError`` holding them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contracts.gpus import GpuRef
from contracts.resources import QuantityError, cpu_milli, memory_mib

MAX_GPUS_PER_ENTRY = 64
WORKLOADS = ("training", "inference")

_TOP_KEYS = ("nodes", "pending", "pods")
_NODE_KEYS = ("cpu", "gpus", "memory", "name")
_GPU_KEYS = ("count", "index", "memory_mib", "product", "uuid")
_PENDING_KEYS = ("annotations", "gpus", "name", "namespace", "uid")
_POD_KEYS = ("annotations", "gpu_index", "mem_mib", "name", "namespace", "node", "uid",
             "util_percent", "workload")


class ClusterFileError(ValueError):
    """The cluster file is invalid; ``problems`` holds every problem with its path."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = tuple(problems)
        self.source = source
        head = "invalid sim cluster file" + (f" {source}" if source else "")
        if len(self.problems) == 1:
            super().__init__(f"{head}: {self.problems[0]}")
        else:
            super().__init__(f"{head}:\n  " + "\n  ".join(self.problems))


@dataclass(frozen=True)
class SimGpu(GpuRef):
    """One simulated GPU: its identity (index, uuid), product name and whole MiB."""

    product: str
    memory_mib: int


@dataclass(frozen=True)
class SimNode:
    """A node and its GPUs, by index (empty: a node without GPUs)."""

    name: str
    gpus: tuple[SimGpu, ...]
    cpu_milli: float | None = None
    """Allocatable CPU (``cpu``, a Kubernetes quantity); None: not modelled."""
    memory_mib: float | None = None
    """Allocatable host memory (``memory``, a Kubernetes quantity); None: not modelled."""


@dataclass(frozen=True)
class SimPod:
    """A pod already bound to GPUs of a node, with its predicted per-GPU load."""

    name: str
    namespace: str
    uid: str
    node: str
    gpu_index: tuple[int, ...]
    util_percent: float
    mem_mib: float
    workload: str
    annotations: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PendingPod:
    """A pod waiting for a node: what it asks for, as its annotations say."""

    name: str
    namespace: str
    uid: str
    gpus: int
    annotations: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ClusterFile:
    """A validated cluster file."""

    nodes: tuple[SimNode, ...]
    pods: tuple[SimPod, ...] = ()
    source: str | None = field(default=None, compare=False)  # the file, for messages
    pending: tuple[PendingPod, ...] = ()

    def node(self, name: str) -> SimNode:
        """The node called ``name``; ``ClusterFileError`` listing the nodes if there is none."""
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise ClusterFileError([f"nodes: no node {name!r} (nodes: {known})"], self.source)


def sim_gpu_uuid(node: str, index: int) -> str:
    """The UUID of simulated GPU ``index`` on ``node`` when the file gives none."""
    return f"GPU-sim-{node}-{index}"


def uniform_gpus(node: str, product: str, memory_mib: int, count: int) -> dict[str, Any]:
    """A file's node entry of ``count`` identical GPUs (for clusters built in code)."""
    return {"name": node, "gpus": [{"product": product, "memory_mib": memory_mib,
                                    "count": count}]}


def load_cluster_file(path: str | Path) -> ClusterFile:
    """Read and validate a cluster file; ``ClusterFileError`` also when unreadable."""
    try:
        with Path(path).open(encoding="utf-8") as stream:  # YAML errors name the file
            raw = yaml.safe_load(stream)
    except OSError as exc:
        raise ClusterFileError([f"cannot read: {exc.strerror or exc}"], str(path)) from None
    except yaml.YAMLError as exc:
        raise ClusterFileError([f"not valid YAML: {exc}"], str(path)) from None
    return parse_cluster_file(raw, str(path))


def parse_cluster_file(raw: Any, source: str | None = None) -> ClusterFile:
    """Validate a decoded cluster document; ``ClusterFileError`` with every problem."""
    problems: list[str] = []
    if not isinstance(raw, Mapping):
        raise ClusterFileError([f"file: must be a mapping (valid keys: {', '.join(_TOP_KEYS)})"],
                               source)
    problems += _unknown_keys(raw, _TOP_KEYS, "")
    nodes: list[SimNode] = []
    incomplete: set[str] = set()
    if not isinstance(raw.get("nodes"), list):
        problems.append("nodes: a list of nodes is required")
    else:
        nodes, incomplete = _nodes(raw["nodes"], problems)
    pods: list[SimPod] = []
    raw_pods = raw.get("pods")
    if raw_pods is not None and not isinstance(raw_pods, list):
        problems.append("pods: must be a list")
    elif raw_pods:
        by_name = {n.name: n for n in nodes}
        pods = [p for i, entry in enumerate(raw_pods)
                if (p := _pod(entry, f"pods[{i}]", by_name, incomplete, problems)) is not None]
    pending = _pending_pods(raw.get("pending"), problems)
    seen: dict[tuple[str, str], str] = {}
    for where, pod in [*((f"pods[{i}]", p) for i, p in enumerate(pods)),
                       *((f"pending[{i}]", p) for i, p in enumerate(pending))]:
        for key, shown in (((pod.namespace, pod.name), f"{pod.namespace}/{pod.name}"),
                           (("", pod.uid), f"uid {pod.uid}")):  # no namespace is empty
            if key in seen:
                problems.append(f"{where}: {shown} repeats {seen[key]}")
            seen.setdefault(key, where)
    if problems:
        raise ClusterFileError(problems, source)
    return ClusterFile(tuple(nodes), tuple(pods), source, tuple(pending))


def _unknown_keys(entry: Mapping[Any, Any], valid: tuple[str, ...], path: str) -> list[str]:
    prefix = f"{path}." if path else ""
    return [f"{prefix}{key}: unknown key (valid: {', '.join(valid)})"
            for key in sorted(map(str, entry)) if key not in valid]


def _nodes(raw: list[Any], problems: list[str]) -> tuple[list[SimNode], set[str]]:
    """The nodes, and the names of those whose GPU list had problems (not checked further)."""
    nodes: list[SimNode] = []
    incomplete: set[str] = set()
    first_of: dict[str, int] = {}
    uuid_at: dict[str, str] = {}
    before = len(problems)
    for i, entry in enumerate(raw):
        where = f"nodes[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: must be a mapping (valid keys: {', '.join(_NODE_KEYS)})")
            continue
        problems += _unknown_keys(entry, _NODE_KEYS, where)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name: must be a non-empty string")
            continue
        if name in first_of:
            problems.append(f"{where}.name: {name!r} repeats nodes[{first_of[name]}]")
            continue
        first_of[name] = i
        at = len(problems)
        gpus = _gpus(name, entry.get("gpus"), f"{where}.gpus", problems)
        if len(problems) > at:  # a bad entry or repeated index: its uuids would only echo it
            incomplete.add(name)
            gpus = ()
        for gpu in gpus:
            if gpu.uuid in uuid_at:
                problems.append(f"{where}.gpus: uuid {gpu.uuid!r} repeats ({uuid_at[gpu.uuid]})")
            uuid_at.setdefault(gpu.uuid, f"{name} GPU {gpu.index}")
        nodes.append(SimNode(name, gpus, *_host(entry, where, problems)))
    if len(problems) == before and not any(n.gpus for n in nodes):
        problems.append("nodes: the cluster has no GPUs")
    return nodes, incomplete


def _host(entry: Mapping[str, Any], where: str, problems: list[str],
          ) -> tuple[float | None, float | None]:
    """A node's allocatable ``cpu`` (millicores) and ``memory`` (MiB), each None when absent."""
    out: list[float | None] = []
    for key, read in (("cpu", cpu_milli), ("memory", memory_mib)):
        try:
            out.append(None if entry.get(key) is None else read(entry[key]))
        except QuantityError as exc:
            problems.append(f"{where}.{key}: {exc}")
            out.append(None)
    return out[0], out[1]


def _gpus(node: str, raw: Any, path: str, problems: list[str]) -> tuple[SimGpu, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(f"{path}: must be a list")
        return ()
    gpus: list[SimGpu] = []
    for j, entry in enumerate(raw):
        gpus += _gpu_entry(node, entry, f"{path}[{j}]", len(gpus), problems)
    seen: set[int] = set()
    for index in sorted(g.index for g in gpus):
        if index in seen:
            problems.append(f"{path}: GPU index {index} repeats")
        seen.add(index)
    return tuple(sorted(gpus, key=lambda g: g.index))


def _gpu_entry(node: str, entry: Any, where: str, position: int,
               problems: list[str]) -> list[SimGpu]:
    if not isinstance(entry, Mapping):
        problems.append(f"{where}: must be a mapping (valid keys: {', '.join(_GPU_KEYS)})")
        return []
    before = len(problems)
    problems += _unknown_keys(entry, _GPU_KEYS, where)
    product, memory = entry.get("product"), entry.get("memory_mib")
    count, index, uuid = entry.get("count", 1), entry.get("index"), entry.get("uuid")
    if not isinstance(product, str) or not product.strip():
        problems.append(f"{where}.product: must be a non-empty string")
    if not _is_int(memory) or memory <= 0:
        problems.append(f"{where}.memory_mib: must be a positive integer (MiB), got {memory!r}")
    if not _is_int(count) or not 1 <= count <= MAX_GPUS_PER_ENTRY:
        problems.append(f"{where}.count: must be an integer in 1..{MAX_GPUS_PER_ENTRY}, "
                        f"got {count!r}")
    elif count != 1:
        problems += [f"{where}.{key}: only on an entry with count 1"
                     for key in ("index", "uuid") if key in entry]
    if index is not None and (not _is_int(index) or index < 0):
        problems.append(f"{where}.index: must be a non-negative integer, got {index!r}")
    if uuid is not None and (not isinstance(uuid, str) or not uuid):
        problems.append(f"{where}.uuid: must be a non-empty string")
    if len(problems) > before:
        return []
    if count == 1:
        at = position if index is None else index
        return [SimGpu(at, uuid or sim_gpu_uuid(node, at), product, memory)]
    return [SimGpu(position + k, sim_gpu_uuid(node, position + k), product, memory)
            for k in range(count)]


def _pod(entry: Any, where: str, nodes: Mapping[str, SimNode], incomplete: set[str],
         problems: list[str]) -> SimPod | None:
    if not isinstance(entry, Mapping):
        problems.append(f"{where}: must be a mapping (valid keys: {', '.join(_POD_KEYS)})")
        return None
    before = len(problems)
    problems += _unknown_keys(entry, _POD_KEYS, where)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"{where}.name: must be a non-empty string")
    for key in ("namespace", "uid"):
        if key in entry and (not isinstance(entry[key], str) or not entry[key]):
            problems.append(f"{where}.{key}: must be a non-empty string")
    node_name = entry.get("node")
    node = nodes.get(node_name) if isinstance(node_name, str) else None
    if node is None:
        known = ", ".join(nodes)
        problems.append(f"{where}.node: must name a node of the file (nodes: {known}), "
                        f"got {node_name!r}")
    indices = entry.get("gpu_index", [0])
    if not isinstance(indices, list) or not indices or not all(_is_int(i) for i in indices):
        problems.append(f"{where}.gpu_index: must be a non-empty list of integers")
    elif node is not None and node.name not in incomplete:
        have = {g.index for g in node.gpus}
        missing = [i for i in indices if i not in have]
        if missing:
            problems.append(f"{where}.gpu_index: node {node.name!r} has no GPU "
                            f"{', '.join(map(str, missing))} (indices: "
                            f"{', '.join(str(i) for i in sorted(have)) or 'none'})")
    util, mem = entry.get("util_percent", 0.0), entry.get("mem_mib", 0.0)
    if not _is_number(util) or not 0 <= util <= 100:
        problems.append(f"{where}.util_percent: must be a number in 0..100, got {util!r}")
    if not _is_number(mem) or mem < 0:
        problems.append(f"{where}.mem_mib: must be a non-negative number, got {mem!r}")
    workload = entry.get("workload", "training")
    if workload not in WORKLOADS:
        problems.append(f"{where}.workload: must be one of {', '.join(WORKLOADS)}, "
                        f"got {workload!r}")
    annotations = _annotations(entry.get("annotations"), where, problems)
    if len(problems) > before:
        return None
    return SimPod(name, entry.get("namespace", "default"), entry.get("uid", f"uid-{name}"),
                  node.name, tuple(indices), float(util), float(mem), workload, annotations)


def _pending_pods(raw: Any, problems: list[str]) -> list[PendingPod]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.append("pending: must be a list")
        return []
    pods = []
    for i, entry in enumerate(raw):
        where = f"pending[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: must be a mapping (valid keys: {', '.join(_PENDING_KEYS)})")
            continue
        before = len(problems)
        problems += _unknown_keys(entry, _PENDING_KEYS, where)
        name, gpus = entry.get("name"), entry.get("gpus", 1)
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name: must be a non-empty string")
        for key in ("namespace", "uid"):
            if key in entry and (not isinstance(entry[key], str) or not entry[key]):
                problems.append(f"{where}.{key}: must be a non-empty string")
        if not _is_int(gpus) or not 1 <= gpus <= MAX_GPUS_PER_ENTRY:
            problems.append(f"{where}.gpus: must be an integer in 1..{MAX_GPUS_PER_ENTRY}, "
                            f"got {gpus!r}")
        annotations = _annotations(entry.get("annotations"), where, problems)
        if len(problems) == before:
            pods.append(PendingPod(name, entry.get("namespace", "default"),
                                   entry.get("uid", f"uid-{name}"), gpus, annotations))
    return pods


def _annotations(raw: Any, where: str, problems: list[str]) -> tuple[tuple[str, str], ...]:
    annotations = raw or {}
    if not isinstance(annotations, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int | float | bool)
            for k, v in annotations.items()):
        problems.append(f"{where}.annotations: must map strings to strings or numbers")
        return ()
    return tuple((k, str(v)) for k, v in annotations.items())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
