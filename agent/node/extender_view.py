"""What the extender believes about this node (``GET /v1/state``), as values.

The agent reads it each interval for three things: the predicted utilisation per
GPU (exported beside the observed one), pod names for metric labels, and the
inference pods whose sessions it keeps in sync with each GPU's server. The
simulated GPU source also turns these placements into load (``placed_jobs``).

Shape read (as ``extender/state/ledger.py`` writes it)::

    {"nodes": {NAME: {"gpus": [{"index", "uuid", "predicted_util", ...,
        "pods": [{"pod": "NS/NAME", "uid", "state", "container", "workload",
                  "util_percent", "mem_mib", "annotations": {"tandem.io/...": "..."}}]}]}}}

``predicted_util`` and ``util_percent`` are percent. ``annotations`` (the pod's
``tandem.io/*`` annotations) is optional; session sync needs it for the model and
SLO. Malformed entries are skipped, never fatal.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from agent.errors import StateError
from agent.node.sim_gpus import SimJob, true_load_factor
from contracts.annotations import PREDICTED_MEM_MIB, PREDICTED_UTIL, WORKLOAD

_MAX_STATE_BYTES = 16 << 20


@dataclass(frozen=True)
class PodPlacement:
    """One pod placed on one of this node's GPUs."""

    uid: str
    name: str
    namespace: str
    gpu_index: int
    predicted_util_percent: float | None
    memory_mib: int | None
    annotations: tuple[tuple[str, str], ...] = ()
    container: str | None = None
    """The container the extender bound this GPU for (None: not said)."""
    state: str = "placed"
    """``placed``, ``assumed`` or ``untrusted`` (bound without the extender's decision)."""

    @property
    def trusted(self) -> bool:
        """False for a pod bound without the extender's decision: it gets no session."""
        return self.state != "untrusted"

    def annotation(self, key: str) -> str | None:
        """The value of annotation ``key``, or None."""
        return next((v for k, v in self.annotations if k == key), None)


@dataclass(frozen=True)
class GpuView:
    """The extender's view of one GPU."""

    index: int
    uuid: str | None
    predicted_util_percent: float | None
    pods: tuple[PodPlacement, ...]


@dataclass(frozen=True)
class NodeView:
    """The extender's view of this node."""

    name: str
    gpus: tuple[GpuView, ...]

    def pods(self) -> tuple[PodPlacement, ...]:
        """Every placement on the node (a multi-GPU pod appears once per GPU)."""
        return tuple(p for g in self.gpus for p in g.pods)

    def pod_names(self) -> dict[str, tuple[str, str]]:
        """Pod UID -> (namespace, name)."""
        return {p.uid: (p.namespace, p.name) for p in self.pods()}


def parse_node_view(document: Any, node: str) -> NodeView:
    """Extract ``node`` from a ``/v1/state`` document (a node it does not know has no GPUs)."""
    if not isinstance(document, Mapping) or not isinstance(document.get("nodes"), Mapping):
        raise StateError("state: expected an object with a 'nodes' object")
    entry = document["nodes"].get(node)
    raw_gpus = entry.get("gpus") if isinstance(entry, Mapping) else None
    gpus = []
    for raw in raw_gpus if isinstance(raw_gpus, list) else []:
        index = raw.get("index") if isinstance(raw, Mapping) else None
        if isinstance(index, bool) or not isinstance(index, int):
            continue
        raw_pods = raw.get("pods")
        pods = tuple(p for p in (_parse_pod(r, index) for r in raw_pods) if p is not None) \
            if isinstance(raw_pods, list) else ()
        uuid = raw.get("uuid")
        gpus.append(GpuView(index, uuid if isinstance(uuid, str) else None,
                            _number(raw.get("predicted_util")), pods))
    return NodeView(node, tuple(sorted(gpus, key=lambda g: g.index)))


def _parse_pod(raw: Any, gpu_index: int) -> PodPlacement | None:
    if not isinstance(raw, Mapping):
        return None
    uid = raw.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    annotations = raw.get("annotations")
    notes = {str(k): str(v) for k, v in annotations.items()} \
        if isinstance(annotations, Mapping) else {}
    workload = raw.get("workload")
    if isinstance(workload, str) and WORKLOAD not in notes:
        notes[WORKLOAD] = workload
    util = _number(raw.get("util_percent", notes.get(PREDICTED_UTIL)))
    memory = _number(raw.get("mem_mib", notes.get(PREDICTED_MEM_MIB)))
    namespace, _, name = str(raw.get("pod", "")).rpartition("/")
    container, state = raw.get("container"), raw.get("state")
    return PodPlacement(
        uid=uid,
        name=name,
        namespace=namespace,
        gpu_index=gpu_index,
        predicted_util_percent=util,
        memory_mib=None if memory is None else int(memory),
        annotations=tuple(sorted(notes.items())),
        container=container if isinstance(container, str) and container else None,
        state=state if isinstance(state, str) else "placed",
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


class StateClient:
    """Fetches ``GET /v1/state`` from the extender through an injectable transport."""

    def __init__(self, extender_url: str, *, transport: httpx.BaseTransport | None = None,
                 timeout_seconds: float = 2.0) -> None:
        self._client = httpx.Client(base_url=extender_url, transport=transport,
                                    timeout=timeout_seconds)

    def fetch(self, node: str, token: str | None = None) -> NodeView:
        """This node's view; raises ``StateError`` on transport, status or shape errors."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            response = self._client.get("/v1/state", headers=headers)
        except httpx.HTTPError as err:
            raise StateError(f"state: {type(err).__name__}") from None
        if response.status_code != 200:
            raise StateError(f"state: HTTP {response.status_code}")
        if len(response.content) > _MAX_STATE_BYTES:
            raise StateError("state: body too large")
        try:
            document = response.json()
        except ValueError:
            raise StateError("state: body is not JSON") from None
        return parse_node_view(document, node)

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()


class ViewHolder:
    """The newest ``NodeView``, shared between the loop and readers in other threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._view: NodeView | None = None

    def set(self, view: NodeView) -> None:
        """Replace the held view."""
        with self._lock:
            self._view = view

    def get(self) -> NodeView | None:
        """The newest view, or None before the first fetch."""
        with self._lock:
            return self._view


class PlacedJobs:
    """Sim job provider: each placed pod loads its GPU at predicted x its true-load factor."""

    def __init__(self, views: ViewHolder, *, low: float = 0.6, high: float = 1.5) -> None:
        self._views, self._low, self._high = views, low, high

    def __call__(self) -> Sequence[SimJob]:
        """The jobs on this node's simulated GPUs, from the newest extender view."""
        view = self._views.get()
        if view is None:
            return ()
        return tuple(
            SimJob(
                gpu_index=p.gpu_index,
                pod_uid=p.uid,
                utilization_percent=(p.predicted_util_percent or 0.0)
                * true_load_factor(p.uid, self._low, self._high),
                memory_mib=p.memory_mib or 0,
            )
            for p in view.pods()
        )
