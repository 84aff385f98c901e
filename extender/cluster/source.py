"""The cluster source interface, and placements to and from pod annotations.

Two sources implement :class:`ClusterSource`: ``kube`` (the Kubernetes API) and
``sim:FILE`` (a YAML cluster). After a restart nothing is lost or double-booked:
``kube`` rebuilds the ledger from the placement records bind wrote
(:mod:`extender.cluster.records`) for the pods the API server has bound, ``sim``
from its pod registry (the operator's file). The annotation keys and their
encoding are the shared contract in :mod:`contracts.annotations`; this module
maps them to the extender's types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import contracts.annotations as ann_contract
from contracts.annotations import (
    GPU_MEM_MIB_RANGE,
    BindOutputs,
    decode_container_gpus,
    decode_outputs,
    encode_outputs,
    read_bound_inputs,
    tandem_annotations,
)
from contracts.bounded import BoundedMap
from contracts.pod import PodView
from contracts.resources import QuantityError, cpu_milli, memory_mib, pod_requests
from extender.core import (
    DemandError,
    GpuSpec,
    Placement,
    PodRef,
    SessionSpec,
    Workload,
    annotations_of,
    pod_ref,
)

if TYPE_CHECKING:
    from extender.state.ledger import ClusterState

DONE_PHASES = ("Succeeded", "Failed")
FULL_UTIL_PERCENT = 100.0


class Verifier(Protocol):
    """Checks a placement's signature (``extender.state.signing.PlacementSigner``)."""

    def verify(self, uid: str, node: str, ann: Mapping[str, object]) -> bool:
        """True when the annotations carry a valid signature for this pod and node."""
        ...


class Signer(Verifier, Protocol):
    """Signs and verifies placements (``extender.state.signing.PlacementSigner``)."""

    def sign(self, uid: str, node: str, ann: Mapping[str, str]) -> dict[str, str]:
        """``ann`` plus its signature annotation (what bind writes)."""
        ...


class ClusterSource(Protocol):
    """Where nodes and pods come from, and how a decision is written back: everything the
    extender's assembly, status and learning call on a source (``kube`` and ``sim:FILE``)."""

    kubelet_admits: bool
    """A kubelet admits the pods bound here (so the device-plugin hand-off applies)."""
    signs_placements: bool
    """Bind signs its outputs (:meth:`use_signer` is called): a record for people, and what
    a rebuild trusts for pods bound before placement records."""
    api: Any
    """The Kubernetes ``CoreV1Api`` (learning persists in a ConfigMap, ``tandem status``
    lists pending pods); None for a simulated cluster."""

    def sync(self, state: ClusterState) -> Any:
        """One full sync of nodes and bound pods into ``state``, then ``state.mark_synced()``."""

    def start(self, state: ClusterState) -> None:
        """Sync into ``state``, then keep it fresh (watches) until :meth:`stop`."""

    def use_signer(self, signer: Signer | None,
                   on_untrusted: Callable[[str], None] | None = None) -> None:
        """The key bind signs with and rebuilds verify with; ``on_untrusted(problem)`` counts
        bound pods whose placement cannot be trusted."""

    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod object, or None when it does not exist."""

    def current_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as the cluster has it for bind (``kube``: the watch's copy of a pending
        pod when it has one, else read), never a body a client sent; None if absent."""

    def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str],
             placement: Placement | None = None) -> bool:
        """Record ``placement`` where pod owners cannot write (``kube``: the node's placement
        record), then bind with the pod UID and the annotations; True when already confirmed."""

    def record_event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        """Emit a Kubernetes Event (or its stand-in) on the pod."""

    def stop(self) -> None:
        """Stop watching."""


def placement_from_pod(pod: Mapping[str, Any]) -> Placement | None:
    """The placement a bound pod's annotations record, or None (unbound, finished, ours not)."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node or status.get("phase") in DONE_PHASES:
        return None
    try:
        ann = annotations_of(pod)
        ref = pod_ref(pod)
    except DemandError:
        return None
    out = decode_outputs(ann)
    if out is None:
        return None
    inputs = read_bound_inputs(ann)
    workload = Workload(inputs.workload)
    session = None
    if workload is Workload.INFERENCE and inputs.slo_ms is not None \
            and inputs.rate_rps is not None:
        try:
            session = SessionSpec(ref.key, str(ann.get(ann_contract.MODEL)), inputs.slo_ms,
                                  inputs.rate_rps)
        except ValueError:
            session = None  # no usable SLO: a best-effort session
    weight = inputs.share_weight if workload is Workload.INFERENCE and session is None else 1
    return Placement(ref.uid, ref.key, node, out.gpu_indices, out.util_percent, out.mem_mib,
                     workload, session, tandem_annotations(ann), weight, out.gpu_uuids,
                     decode_container_gpus(ann))


def requests_gpus(pod: Mapping[str, Any]) -> bool:
    """True when a container of the pod names ``tandem.io/gpu`` in its resources (set at
    creation and immutable: a pod owner cannot add or remove it from a bound pod)."""
    return PodView.of(pod).requests_gpus


def host_of(node: Mapping[str, Any]) -> tuple[float, float] | None:
    """A Node object's allocatable (CPU millicores, memory MiB); None when it gives none
    that parse (the node's host is then not known, never short)."""
    status = node.get("status")
    alloc = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(alloc, Mapping):
        return None
    try:
        return cpu_milli(alloc["cpu"]), memory_mib(alloc["memory"])
    except (KeyError, QuantityError):
        return None


def observe_host(state: Any, pod: Mapping[str, Any]) -> None:
    """A bound, unfinished pod's CPU and memory requests count on its node
    (``ClusterState.hosts``); a finished one's no longer do."""
    meta = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return
    uid, node = str(meta.get("uid") or ""), spec.get("nodeName")
    if (pod.get("status") or {}).get("phase") in DONE_PHASES:
        state.hosts.gone(uid)
    elif isinstance(node, str) and node:
        state.hosts.bound(uid, node, *pod_requests(spec))


def untrusted_placement(uid: str, pod: str, node: str, gpus: list[GpuSpec],
                        annotations: tuple[tuple[str, str], ...]) -> Placement:
    """What a bound pod with no placement record holds: every GPU of its node, whatever
    its annotations name (the GPU table gives it all the node's rows, also GPUs that
    appear later), each at full utilisation and the largest GPU's whole memory: never
    less than any decision bind could have made."""
    memory = max((g.memory_mib for g in gpus), default=GPU_MEM_MIB_RANGE.high)
    return Placement(uid, pod, node, tuple(g.index for g in gpus), FULL_UTIL_PERCENT,
                     memory, Workload.TRAINING, None, annotations, 1,
                     tuple(g.uuid for g in gpus), trusted=False)


PENDING_LIMIT = 5_000
"""Most pending pods :class:`PendingPods` keeps (the oldest go; bind then reads the pod)."""
PENDING_TEXT_LIMIT = 16_384
"""A pending pod whose ``tandem.io/*`` annotations are longer is not kept (bind reads it)."""


def _slim(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """What bind reads of a pod (name, UID, ``tandem.io/*`` annotations, containers' names
    and resources), or None when that is too large to keep: the cache stays bounded."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    ann = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    ours = dict(tandem_annotations(ann))
    if sum(len(k) + len(v) for k, v in ours.items()) > PENDING_TEXT_LIMIT:
        return None
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    containers = {key: [{"name": c.get("name"), "resources": c.get("resources")}
                        for c in spec.get(key) if isinstance(c, Mapping)]
                  for key in ("containers", "initContainers") if isinstance(spec.get(key), list)}
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion")
                         if k in meta} | {"annotations": ours},
            "spec": containers}


class PendingPods:
    """Pods asking for ``tandem.io/gpu`` with no node yet, as the pod watch delivered them:
    the API server's copy, so bind needs no round trip to read it."""

    def __init__(self, limit: int = PENDING_LIMIT):
        self._pods: BoundedMap[tuple[str, str], Mapping[str, Any]] = BoundedMap(limit)

    def observe(self, pod: Mapping[str, Any], deleted: bool) -> None:
        """Keep a pending pod's latest version; drop it once bound, finished or deleted."""
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        waiting = not deleted and not (pod.get("spec") or {}).get("nodeName") \
            and (pod.get("status") or {}).get("phase") not in DONE_PHASES \
            and requests_gpus(pod)
        slim = _slim(pod) if waiting else None
        if slim is None:
            self._pods.pop(key)
        else:
            self._pods.put(key, slim)

    def reset(self, pods: list[Mapping[str, Any]]) -> None:
        """Start again from a list (a relist: pods deleted or bound meanwhile go)."""
        self._pods.clear()
        for pod in pods:
            self.observe(pod, False)

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pending pod, or None when the watch has not delivered it (or it is bound)."""
        return self._pods.get((namespace, name))


def same_decision(a: Placement, b: Placement) -> bool:
    """True when two placements hold the same node, GPUs and reservations."""
    return (a.node, a.gpu_indices, a.util_percent, a.mem_mib) == \
        (b.node, b.gpu_indices, b.util_percent, b.mem_mib)


def output_annotations(p: Placement, uuids: list[str], cost: float, plan: Any,
                       source: str = "", interference: str = "",
                       decided: str = "") -> dict[str, str]:
    """The annotations bind writes (DESIGN outputs plus batch and duty cycle for sessions;
    ``decided``: the term that chose the node, ``tandem.io/decided-by``)."""
    batch = duty_cycle_ms = None
    if plan is not None and p.session is not None:
        alloc = plan.allocation(p.session.name)
        batch = alloc.batch if alloc else 0
        duty_cycle_ms = plan.duty_cycle_ms
    out = encode_outputs(BindOutputs(tuple(p.gpu_indices), tuple(uuids), p.util_percent,
                                     p.mem_mib, cost, batch, duty_cycle_ms, source or None,
                                     p.containers, interference_source=interference or None))
    return {**out, ann_contract.DECIDED_BY: decided} if decided else out
