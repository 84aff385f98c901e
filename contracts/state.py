"""The ``GET /v1/state`` document: what the extender believes, per node and GPU.

One typed value (:class:`StateDocument`), one encoder (:func:`encode_state`, used
by the extender's route) and one decoder (:func:`decode_state`, used by the node
agent, the device plugin, ``tandem status``, ``tandem demo`` and the fleet-row
export). Shape::

    {"nodes": {NAME: {"gpus": [{"index", "uuid", "product", "memory_mib",
        "reserved_mib", "predicted_util", "observed_util", "observed_mib", "observed_at",
        "pods": [{"pod": "NS/NAME", "uid", "state", "container", "workload",
                  "util_percent", "mem_mib", "annotations": {"tandem.io/...": "..."},
                  "annotations_omitted"}]}]}},
     "synced": bool, "placed": int, "assumed": int, "untrusted": int, "learning": {...},
     "redacted": true}   # only in a redacted document

Bounded: a pod repeats only the annotation keys tandem reads (:data:`STATE_ANNOTATION_KEYS`)
with values of at most :data:`MAX_ANNOTATION_CHARS` characters, at most
:data:`MAX_POD_ANNOTATION_CHARS` in all; the rest are left out
and counted in ``annotations_omitted``, so a pod owner cannot grow the document by
writing large or many annotations. A redacted document (for callers without the
agent token) says ``"redacted": true`` and has no pod names, UIDs, annotations,
containers or ``learning``.

The decoder is strict per node and lenient across nodes: a node entry that does
not decode is listed in :attr:`StateDocument.unreadable` and the other nodes still
decode, so one broken entry never blinds every agent. Within a node, a field that is
absent takes its default (strings '', numbers 0, pod state ``placed``, workload
``training``, observations null); a field present with the wrong type or a non-finite
number makes the node unreadable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from contracts import annotations as keys

STATE_PATH = "/v1/state"
NODE_QUERY = "node"
"""``GET /v1/state?node=NAME``: only that node, without ``learning`` (what each agent and
device plugin reads)."""

STATE_ANNOTATION_KEYS: frozenset[str] = frozenset({
    keys.WORKLOAD, keys.MODEL, keys.BATCH_SIZE, keys.GPU_UTIL, keys.GPU_MEM_MIB, keys.SLO_MS,
    keys.RATE_RPS, keys.WEIGHT, keys.PRIORITY, keys.GPU_INDEX, keys.GPU_UUID,
    keys.PREDICTED_UTIL, keys.PREDICTED_MEM_MIB, keys.COST, keys.BATCH, keys.DUTY_CYCLE_MS,
    keys.PREDICTION_SOURCE, keys.INTERFERENCE_SOURCE, keys.PROGRESS, keys.DECIDED_BY,
})
"""The ``tandem.io/*`` keys a pod's entry repeats: the inputs its readers parse and the
outputs bind wrote. Anything else a pod owner adds stays on the pod only."""
MAX_ANNOTATION_CHARS = 2048
"""Longest annotation value repeated (a model reference or URL fits; padding does not)."""
MAX_POD_ANNOTATION_CHARS = 4096
"""Most characters of annotation values one pod entry repeats, all keys together (a pod's
real inputs and outputs take a model reference plus a few numbers)."""
POD_STATES = ("placed", "assumed", "untrusted")
"""``untrusted``: bound without a decision the extender can verify (it holds its GPUs whole)."""


class StateDocumentError(ValueError):
    """The document (or one node of it) does not have the contract's shape."""


@dataclass(frozen=True)
class StatePod:
    """One pod on one GPU (a multi-GPU pod appears under each of its GPUs)."""

    state: str
    workload: str
    util_percent: float
    mem_mib: float
    pod: str | None = None
    """``namespace/name``; None in a redacted document."""
    uid: str | None = None
    annotations: tuple[tuple[str, str], ...] = ()
    annotations_omitted: int = 0
    """How many of the pod's ``tandem.io/*`` annotations were left out (unknown or too long)."""
    container: str | None = None
    """The container bind gave this GPU to (None: not said, or redacted)."""

    @property
    def namespace(self) -> str:
        """The pod's namespace ('' when redacted)."""
        return (self.pod or "").rpartition("/")[0]

    @property
    def name(self) -> str:
        """The pod's name ('' when redacted)."""
        return (self.pod or "").rpartition("/")[2]

    def annotation(self, key: str) -> str | None:
        """The value of annotation ``key``, or None."""
        return next((v for k, v in self.annotations if k == key), None)


@dataclass(frozen=True)
class StateGpu:
    """One GPU: inventory, what the ledger reserves, what its agent last observed."""

    index: int
    uuid: str
    product: str
    memory_mib: float
    reserved_mib: float
    predicted_util: float
    observed_util: float | None = None
    """None unless an agent report younger than the staleness limit gave it."""
    observed_mib: float | None = None
    observed_at: float | None = None
    pods: tuple[StatePod, ...] = ()


@dataclass(frozen=True)
class StateNode:
    """One node's GPUs."""

    name: str
    gpus: tuple[StateGpu, ...] = ()

    def pods(self) -> tuple[StatePod, ...]:
        """Every pod entry on the node (a multi-GPU pod once per GPU)."""
        return tuple(p for g in self.gpus for p in g.pods)


@dataclass(frozen=True)
class StateDocument:
    """The whole ``/v1/state`` document (or the part a caller asked for)."""

    nodes: tuple[StateNode, ...] = ()
    synced: bool = False
    placed: int = 0
    assumed: int = 0
    learning: Mapping[str, Any] | None = None
    """The learning document (:mod:`extender.learning`), opaque here; None when redacted."""
    untrusted: int = 0
    """Bound pods the ledger holds without a verifiable decision (not counted in ``placed``)."""
    redacted: bool = False
    """True when the caller did not present the agent token (see :meth:`redacted_copy`)."""
    unreadable: tuple[str, ...] = field(default=(), compare=False)
    """Decoder only: nodes whose entries did not decode (left out of ``nodes``)."""

    def node(self, name: str) -> StateNode | None:
        """The node called ``name``, or None."""
        return next((n for n in self.nodes if n.name == name), None)

    def redacted_copy(self) -> StateDocument:
        """No pod names, UIDs, annotations or learning: what any caller may read."""
        return replace(self, learning=None, redacted=True, nodes=tuple(
            replace(n, gpus=tuple(
                replace(g, pods=tuple(replace(p, pod=None, uid=None, annotations=(),
                                              annotations_omitted=0, container=None)
                                      for p in g.pods))
                for g in n.gpus))
            for n in self.nodes))


def bounded_annotations(ann: Mapping[str, str] | tuple[tuple[str, str], ...],
                        ) -> tuple[tuple[tuple[str, str], ...], int]:
    """(the annotations a pod entry repeats, sorted; how many ``tandem.io/*`` ones it omits)."""
    items = ann.items() if isinstance(ann, Mapping) else ann
    kept, omitted, total = [], 0, 0
    # Shortest values first, so a long one never crowds out the short inputs readers need.
    for k, v in sorted(items, key=lambda kv: (len(str(kv[1])), str(kv[0]))):
        if k in STATE_ANNOTATION_KEYS and isinstance(v, str) and len(v) <= MAX_ANNOTATION_CHARS \
                and total + len(v) <= MAX_POD_ANNOTATION_CHARS:
            kept.append((k, v))
            total += len(v)
        else:
            omitted += 1
    return tuple(sorted(kept)), omitted


# ---- encoder ---------------------------------------------------------------------------
def encode_state(doc: StateDocument) -> dict[str, Any]:
    """The JSON object of ``doc`` (the route serialises it)."""
    out: dict[str, Any] = {
        "nodes": {n.name: {"gpus": [_encode_gpu(g) for g in n.gpus]} for n in doc.nodes},
        "synced": doc.synced, "placed": doc.placed, "assumed": doc.assumed,
        "untrusted": doc.untrusted,
    }
    if doc.redacted:
        out["redacted"] = True
    if doc.learning is not None:
        out["learning"] = doc.learning
    return out


def _encode_gpu(g: StateGpu) -> dict[str, Any]:
    return {"index": g.index, "uuid": g.uuid, "product": g.product,
            "memory_mib": g.memory_mib, "reserved_mib": g.reserved_mib,
            "predicted_util": g.predicted_util, "observed_util": g.observed_util,
            "observed_mib": g.observed_mib, "observed_at": g.observed_at,
            "pods": [_encode_pod(p) for p in g.pods]}


def _encode_pod(p: StatePod) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if p.pod is not None:
        out["pod"] = p.pod
    if p.uid is not None:
        out["uid"] = p.uid
    out.update({"state": p.state, "workload": p.workload, "util_percent": p.util_percent,
                "mem_mib": p.mem_mib})
    if p.container is not None:
        out["container"] = p.container
    if p.pod is not None:
        out["annotations"] = dict(p.annotations)
    if p.annotations_omitted:
        out["annotations_omitted"] = p.annotations_omitted
    return out


# ---- decoder ---------------------------------------------------------------------------
def decode_state(raw: Any, node: str | None = None) -> StateDocument:
    """The typed document; with ``node``, only that node is decoded (the others are not
    looked at). Raises StateDocumentError only when the document as a whole has no shape."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("nodes"), Mapping):
        raise StateDocumentError("expected an object with a 'nodes' object")
    entries = raw["nodes"]
    names = [node] if node is not None and node in entries else [] if node is not None \
        else list(entries)
    nodes, unreadable = [], []
    for name in names:
        try:
            nodes.append(decode_node(name, entries[name]))
        except StateDocumentError:
            unreadable.append(str(name))
    learning = raw.get("learning")
    return StateDocument(
        nodes=tuple(nodes), synced=raw.get("synced") is True,
        placed=_count(raw.get("placed")), assumed=_count(raw.get("assumed")),
        untrusted=_count(raw.get("untrusted")), redacted=raw.get("redacted") is True,
        learning=learning if isinstance(learning, Mapping) else None,
        unreadable=tuple(unreadable))


def decode_node(name: Any, raw: Any) -> StateNode:
    """One node entry; StateDocumentError names the first problem."""
    if not isinstance(name, str) or not name:
        raise StateDocumentError("node names must be non-empty strings")
    if not isinstance(raw, Mapping) or not isinstance(raw.get("gpus"), list):
        raise StateDocumentError(f"nodes.{name}: expected an object with a 'gpus' list")
    return StateNode(name, tuple(sorted(
        (_decode_gpu(g, f"nodes.{name}.gpus[{i}]") for i, g in enumerate(raw["gpus"])),
        key=lambda g: g.index)))


def _decode_gpu(raw: Any, path: str) -> StateGpu:
    if not isinstance(raw, Mapping):
        raise StateDocumentError(f"{path}: expected an object")
    index = raw.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise StateDocumentError(f"{path}.index: expected an integer >= 0")
    pods = raw.get("pods", [])
    if not isinstance(pods, list):
        raise StateDocumentError(f"{path}.pods: expected a list")
    return StateGpu(
        index=index, uuid=_text(raw.get("uuid", ""), f"{path}.uuid"),
        product=_text(raw.get("product", ""), f"{path}.product"),
        memory_mib=_number(raw.get("memory_mib", 0.0), f"{path}.memory_mib"),
        reserved_mib=_number(raw.get("reserved_mib", 0.0), f"{path}.reserved_mib"),
        predicted_util=_number(raw.get("predicted_util", 0.0), f"{path}.predicted_util"),
        observed_util=_optional(raw.get("observed_util"), f"{path}.observed_util"),
        observed_mib=_optional(raw.get("observed_mib"), f"{path}.observed_mib"),
        observed_at=_optional(raw.get("observed_at"), f"{path}.observed_at"),
        pods=tuple(_decode_pod(p, f"{path}.pods[{i}]") for i, p in enumerate(pods)))


def _decode_pod(raw: Any, path: str) -> StatePod:
    if not isinstance(raw, Mapping):
        raise StateDocumentError(f"{path}: expected an object")
    state = raw.get("state", "placed")
    if state not in POD_STATES:
        raise StateDocumentError(f"{path}.state: expected one of {', '.join(POD_STATES)}")
    workload = raw.get("workload", keys.TRAINING)
    if workload not in keys.WORKLOADS:
        raise StateDocumentError(f"{path}.workload: expected training or inference")
    pod, uid = raw.get("pod"), raw.get("uid")
    if pod is not None and not (isinstance(pod, str) and "/" in pod):
        raise StateDocumentError(f"{path}.pod: expected 'namespace/name'")
    if uid is not None and not (isinstance(uid, str) and uid):
        raise StateDocumentError(f"{path}.uid: expected a non-empty string")
    container = raw.get("container")
    if container is not None and not (isinstance(container, str) and container):
        raise StateDocumentError(f"{path}.container: expected a non-empty string")
    notes = raw.get("annotations", {})
    if not isinstance(notes, Mapping):
        raise StateDocumentError(f"{path}.annotations: expected an object")
    kept, omitted = bounded_annotations(
        tuple((k, v) for k, v in notes.items() if isinstance(k, str)))
    return StatePod(
        state=str(state), workload=str(workload),
        util_percent=_number(raw.get("util_percent", 0.0), f"{path}.util_percent"),
        mem_mib=_number(raw.get("mem_mib", 0.0), f"{path}.mem_mib"),
        pod=pod, uid=uid, annotations=kept,
        annotations_omitted=omitted + _count(raw.get("annotations_omitted")),
        container=container)


def _text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise StateDocumentError(f"{path}: expected a string")
    return value


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise StateDocumentError(f"{path}: expected a finite number")
    return float(value)


def _optional(value: Any, path: str) -> float | None:
    return None if value is None else _number(value, path)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
