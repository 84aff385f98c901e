"""What the extender believes about this node (``GET /v1/state?node=NAME``), as values.

The agent reads it each interval for three things: the predicted utilisation per
GPU (exported beside the observed one), pod names for metric labels, and the
inference pods whose sessions it keeps in sync with each GPU's server. The
simulated GPU source also turns these placements into load (``placed_jobs``).

The document is the contract in :mod:`contracts.state` (its one decoder is used
here). Only this node is asked for and decoded, so another node's entries (however
large or malformed) never blind this node's agent and device plugin; the body is
read up to a cap and an answer over it is refused without being parsed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from agent.errors import StateError
from agent.node.sim_gpus import SimJob, true_load_factor
from contracts.annotations import WORKLOAD
from contracts.jsonbody import parse_json
from contracts.state import (
    NODE_QUERY,
    STATE_PATH,
    StateDocumentError,
    StatePod,
    decode_state,
)

MAX_STATE_BYTES = 16 << 20
"""Largest ``/v1/state`` answer read (one node's entry is far smaller)."""


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
    """``node`` from a ``/v1/state`` document (a node it does not know has no GPUs);
    StateError when the document, or this node's entry, does not decode."""
    try:
        decoded = decode_state(document, node)
    except StateDocumentError as err:
        raise StateError(f"state: {err}") from None
    if decoded.unreadable:
        raise StateError(f"state: node {node}: its entry does not decode")
    if decoded.redacted:  # pods without names: syncing on it would drop every session
        raise StateError("state: the extender did not accept the agent token (redacted)")
    entry = decoded.node(node)
    gpus = [] if entry is None else [
        GpuView(g.index, g.uuid or None, g.predicted_util,
                tuple(_placement(p, g.index) for p in g.pods if p.uid))
        for g in entry.gpus]
    return NodeView(node, tuple(gpus))


def _placement(p: StatePod, gpu_index: int) -> PodPlacement:
    notes = dict(p.annotations)
    notes.setdefault(WORKLOAD, p.workload)
    return PodPlacement(uid=str(p.uid), name=p.name, namespace=p.namespace,
                        gpu_index=gpu_index, predicted_util_percent=p.util_percent,
                        memory_mib=int(p.mem_mib), annotations=tuple(sorted(notes.items())),
                        container=p.container, state=p.state)


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
            with self._client.stream("GET", STATE_PATH, params={NODE_QUERY: node},
                                     headers=headers) as response:
                if response.status_code != 200:
                    raise StateError(f"state: HTTP {response.status_code}")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_STATE_BYTES:
                        raise StateError("state: body too large")
        except httpx.HTTPError as err:
            raise StateError(f"state: {type(err).__name__}") from None
        try:
            document = parse_json(body)
        except ValueError as err:  # JsonBodyError is one
            raise StateError(f"state: body is not usable JSON ({err})") from None
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
