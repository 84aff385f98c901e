"""The cluster source interface, and placements to and from pod annotations.

Two sources implement :class:`ClusterSource`: ``kube`` (the Kubernetes API) and
``sim:FILE`` (a YAML cluster). Both rebuild the ledger from pod annotations, so
after a restart nothing is lost or double-booked: Kubernetes (or the sim file's
pod registry) is the source of truth and the extender's memory is a cache. The
annotation keys and their encoding are the shared contract in
:mod:`contracts.annotations`; this module maps them to the extender's types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import contracts.annotations as ann_contract
from contracts.annotations import (
    GPU_MEM_MIB_RANGE,
    BindOutputs,
    decode_outputs,
    encode_outputs,
    read_bound_inputs,
    tandem_annotations,
)
from extender.core import (
    DemandError,
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

GpusNamed = Callable[[str, tuple[int, ...], tuple[str, ...]], tuple[tuple[int, ...], float | None]]
"""(node, indices, uuids) -> (every GPU index named either way, largest memory among them)."""


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
    """Bind signs its outputs and rebuilds verify them (:meth:`use_signer` is called)."""
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
        bound pods whose placement does not verify."""

    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod object, or None when it does not exist."""

    def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str]) -> bool:
        """Write annotations, then bind with the pod UID; True when already confirmed."""

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
                     workload, session, tandem_annotations(ann), weight, out.gpu_uuids)


def trusted_placement(pod: Mapping[str, Any], verifier: Verifier | None,
                      gpus_named: GpusNamed) -> tuple[Placement | None, bool]:
    """(placement, verified): the recorded placement if its signature verifies, else the
    conservative one (see :func:`conservative_placement`). No verifier: taken as written."""
    p = placement_from_pod(pod)
    if p is None or verifier is None:
        return p, True
    ann = annotations_of(pod)
    if verifier.verify(p.pod_uid, p.node, ann):
        return p, True
    out = decode_outputs(ann)
    uuids = out.gpu_uuids if out is not None else ()
    return conservative_placement(p, uuids, gpus_named), False


def conservative_placement(p: Placement, uuids: tuple[str, ...],
                           gpus_named: GpusNamed) -> Placement:
    """What an unverifiable bound pod holds: every GPU its annotations name (by index or
    UUID, so a moved ``gpu-index`` still covers the GPU its ``gpu-uuid`` names), each at
    full utilisation and its whole memory. Never less than any decision bind could make."""
    indices, memory = gpus_named(p.node, p.gpu_indices, uuids)
    return dataclasses.replace(p, gpu_indices=indices, gpu_uuids=(),
                               util_percent=FULL_UTIL_PERCENT,
                               mem_mib=memory if memory is not None else GPU_MEM_MIB_RANGE.high)


def same_decision(a: Placement, b: Placement) -> bool:
    """True when two placements hold the same node, GPUs and reservations."""
    return (a.node, a.gpu_indices, a.util_percent, a.mem_mib) == \
        (b.node, b.gpu_indices, b.util_percent, b.mem_mib)


def output_annotations(p: Placement, uuids: list[str], cost: float, plan: Any,
                       source: str = "", interference: str = "") -> dict[str, str]:
    """The annotations bind writes (DESIGN outputs plus batch and duty cycle for sessions)."""
    batch = duty_cycle_ms = None
    if plan is not None and p.session is not None:
        alloc = plan.allocation(p.session.name)
        batch = alloc.batch if alloc else 0
        duty_cycle_ms = plan.duty_cycle_ms
    return encode_outputs(BindOutputs(tuple(p.gpu_indices), tuple(uuids), p.util_percent,
                                      p.mem_mib, cost, batch, duty_cycle_ms, source or None,
                                      interference or None))
