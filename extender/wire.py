"""kube-scheduler ``extender/v1`` wire types: decode leniently, encode canonically.

The Go structs have no JSON tags, so keys on the wire are the Go field names
(``Pod``, ``NodeNames``, ...) and Go's decoder matches them case-insensitively.
We do the same on input and always emit the canonical capitalised keys. Scores
are Python ints (Go rejects ``7.0`` for an int64). With ``nodeCacheCapable`` the
filter answer always carries ``NodeNames`` as a list, even empty.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from contracts.jsonbody import JsonBodyError, parse_json
from extender.errors import BadRequest


class HostPriority(TypedDict):
    """One entry of the prioritize answer (a bare JSON array of these)."""

    Host: str
    Score: int


class FilterResult(TypedDict, total=False):
    """``ExtenderFilterResult``."""

    Nodes: dict[str, Any]
    NodeNames: list[str]
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class BindingResult(TypedDict):
    """``ExtenderBindingResult``."""

    Error: str


@dataclass(frozen=True)
class ExtenderArgs:
    """Decoded ``ExtenderArgs``: the pod plus candidate nodes in one of two forms."""

    pod: Mapping[str, Any]
    node_names: list[str] | None
    nodes: list[Mapping[str, Any]] | None

    @property
    def node_cache_capable(self) -> bool:
        """True when the scheduler sent names only (``nodeCacheCapable: true``)."""
        return self.node_names is not None

    def candidate_names(self) -> list[str]:
        """Candidate node names in the order the scheduler sent them."""
        if self.node_names is not None:
            return self.node_names
        return [n["metadata"]["name"] for n in self.nodes or []]


@dataclass(frozen=True)
class BindingArgs:
    """Decoded ``ExtenderBindingArgs``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def loads(body: bytes) -> Any:
    """Parse a JSON body (``contracts.jsonbody`` limits); BadRequest when it is not JSON
    or nests too deep or carries an oversized number."""
    try:
        return parse_json(body)
    except JsonBodyError as exc:
        raise BadRequest("body", exc.problem) from None


def dumps(document: Any) -> bytes:
    """Compact JSON bytes (stdlib json; no NaN allowed); pre-encoded bodies pass through."""
    if isinstance(document, EncodedJson):
        return bytes(document)
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def field_ci(obj: Mapping[str, Any], name: str) -> Any:
    """Value of key ``name`` matched case-insensitively (exact match preferred), or None."""
    if name in obj:
        return obj[name]
    lowered = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


def _object(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadRequest(path, "must be a JSON object")
    return value


def decode_extender_args(document: Any) -> ExtenderArgs:
    """``ExtenderArgs`` from decoded JSON; BadRequest with the path on a wrong shape."""
    body = _object(document, "body")
    pod = _object(field_ci(body, "Pod"), "Pod")
    _object(pod.get("metadata"), "Pod.metadata")
    raw_names = field_ci(body, "NodeNames")
    raw_nodes = field_ci(body, "Nodes")
    names: list[str] | None = None
    nodes: list[Mapping[str, Any]] | None = None
    if raw_names is not None:
        if not isinstance(raw_names, list) or not set(map(type, raw_names)) <= {str}:
            raise BadRequest("NodeNames", "must be a list of strings")
        names = raw_names
    elif raw_nodes is not None:
        items = _object(raw_nodes, "Nodes").get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise BadRequest("Nodes.items", "must be a list")
        for i, item in enumerate(items):
            meta = _object(item, f"Nodes.items[{i}]").get("metadata")
            if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
                raise BadRequest(f"Nodes.items[{i}].metadata.name", "must be a string")
        nodes = items
    else:
        raise BadRequest("NodeNames", "neither NodeNames nor Nodes was given")
    return ExtenderArgs(pod, names, nodes)


def decode_binding_args(document: Any) -> BindingArgs:
    """``ExtenderBindingArgs`` from decoded JSON; all four fields are required strings."""
    body = _object(document, "body")
    values = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = field_ci(body, key)
        if not isinstance(value, str) or (key != "PodUID" and not value):
            raise BadRequest(key, "must be a non-empty string")
        values[key] = value
    return BindingArgs(values["PodName"], values["PodNamespace"], values["PodUID"],
                       values["Node"])


def decode_preemption_args(document: Any) -> tuple[Mapping[str, Any], dict[str, list[str]]]:
    """The pod and ``node -> [victim UID]`` from ``ExtenderPreemptionArgs`` (either form)."""
    body = _object(document, "body")
    pod = _object(field_ci(body, "Pod"), "Pod")
    victims: dict[str, list[str]] = {}
    meta = field_ci(body, "NodeNameToMetaVictims")
    full = field_ci(body, "NodeNameToVictims")
    source, is_meta = (meta, True) if meta is not None else (full, False)
    for node, entry in _object(source if source is not None else {}, "NodeNameToVictims").items():
        pods = field_ci(_object(entry, f"victims[{node}]"), "Pods") or []
        if not isinstance(pods, list):
            raise BadRequest(f"victims[{node}].Pods", "must be a list")
        uids = []
        for i, p in enumerate(pods):
            p = _object(p, f"victims[{node}].Pods[{i}]")
            uid = field_ci(p, "UID") if is_meta else (p.get("metadata") or {}).get("uid")
            if not isinstance(uid, str):
                raise BadRequest(f"victims[{node}].Pods[{i}].UID", "must be a string")
            uids.append(uid)
        victims[node] = uids
    return pod, victims


def filter_result(
    args: ExtenderArgs, passed: list[str], failed: Mapping[str, str],
    unresolvable: Mapping[str, str], error: str = "",
) -> FilterResult:
    """Encode a filter answer in the form the request used."""
    out: FilterResult = {}
    if args.node_cache_capable:
        out["NodeNames"] = list(passed)
    else:
        keep = set(passed)
        out["Nodes"] = {"metadata": {},
                        "items": [n for n in args.nodes or [] if n["metadata"]["name"] in keep]}
    out["FailedNodes"] = dict(failed)
    out["FailedAndUnresolvableNodes"] = dict(unresolvable)
    out["Error"] = error
    return out


def host_priorities(names: list[str], scores: list[int]) -> list[HostPriority]:
    """Encode prioritize scores (ints, clamped to 0..10)."""
    if len(names) != len(scores):
        raise ValueError("one score per host")
    return [{"Host": n, "Score": s if type(s) is int and 0 <= s <= 10 else max(0, min(10, int(s)))}
            for n, s in zip(names, scores, strict=False)]


class EncodedJson(bytes):
    """A response body already encoded as JSON (the hot path skips the generic encoder)."""


_SCORE_TAIL = {s: f',"Score":{s}}},{{"Host":' for s in range(11)}
"""What follows a host's quoted name, per valid score (ints 0..10; equal floats hash alike)."""


def encode_host_priorities(names: list[str], scores: list[int]) -> EncodedJson:
    """The prioritize answer as JSON bytes, equal to ``dumps(host_priorities(names, scores))``.

    Interleaves the quoted names with one pre-built tail per score and joins once,
    instead of 500 dicts through the generic encoder: prioritize answers every
    candidate, so this is most of its encode time.
    """
    if len(names) != len(scores):
        raise ValueError("one score per host")
    if not names:
        return EncodedJson(b"[]")
    tails = list(map(_SCORE_TAIL.get, scores))
    if None in tails:  # out of range or not integral: clamp like host_priorities
        tails = [_SCORE_TAIL[max(0, min(10, int(s)))] for s in scores]
    tails[-1] = tails[-1][: -len(',{"Host":')] + "]"
    parts: list[str] = [""] * (2 * len(names))
    parts[0::2] = map(json.encoder.encode_basestring_ascii, names)  # what json.dumps uses (C)
    parts[1::2] = tails
    return EncodedJson(('[{"Host":' + "".join(parts)).encode())


def preemption_result(victims: Mapping[str, list[str]]) -> dict[str, Any]:
    """``ExtenderPreemptionResult``: always MetaVictims (UIDs)."""
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0}
        for node, uids in victims.items()}}
