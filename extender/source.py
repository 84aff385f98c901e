"""The cluster source interface and the pod <-> placement annotation codec.

Two sources implement :class:`ClusterSource`: ``kube`` (the Kubernetes API) and
``sim:FILE`` (a YAML cluster). Both rebuild the ledger from pod annotations, so
after a restart nothing is lost or double-booked: Kubernetes (or the sim file's
pod registry) is the source of truth and the extender's memory is a cache.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from extender.core import (
    DemandError,
    Placement,
    PodRef,
    SessionSpec,
    Workload,
    annotations_of,
    pod_ref,
)

A = "tandem.io/"
OUT_GPU_INDEX = A + "gpu-index"
OUT_GPU_UUID = A + "gpu-uuid"
OUT_UTIL = A + "predicted-gpu-util"
OUT_MEM = A + "predicted-gpu-mem-mib"
OUT_COST = A + "cost"
OUT_BATCH = A + "batch"
OUT_DUTY_CYCLE = A + "duty-cycle-ms"
OUTPUT_KEYS = (OUT_GPU_INDEX, OUT_GPU_UUID, OUT_UTIL, OUT_MEM, OUT_COST, OUT_BATCH,
               OUT_DUTY_CYCLE)
DONE_PHASES = ("Succeeded", "Failed")


class ClusterSource(Protocol):
    """Where nodes and pods come from, and how a decision is written back."""

    def start(self, state: Any) -> None:
        """Sync nodes and bound pods into ``state`` (sets ``state.synced``), then keep it fresh."""

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
    raw_index = ann.get(OUT_GPU_INDEX)
    if not isinstance(raw_index, str):
        return None
    try:
        indices = tuple(int(x) for x in raw_index.split(",") if x.strip())
        util = float(ann.get(OUT_UTIL, "0"))
        mem = float(ann.get(OUT_MEM, "0"))
    except (TypeError, ValueError):
        return None
    if not indices or not (math.isfinite(util) and math.isfinite(mem)):
        return None
    workload = Workload.INFERENCE if ann.get(A + "workload") == "inference" else Workload.TRAINING
    session = None
    if workload is Workload.INFERENCE:
        try:
            session = SessionSpec(ref.key, str(ann.get(A + "model")), float(ann[A + "slo-ms"]),
                                  float(ann[A + "rate-rps"]))
        except (KeyError, TypeError, ValueError):
            session = None  # no SLO: a best-effort session
    weight = _share_weight(ann) if workload is Workload.INFERENCE and session is None else 1
    return Placement(ref.uid, ref.key, node, indices, max(util, 0.0), max(mem, 0.0),
                     workload, session, tandem_annotations(ann), weight)


def _share_weight(ann: Mapping[str, Any]) -> int:
    """A best-effort session's spread weight, as ``JobDemand.share_weight`` computes it."""
    raw = ann.get(A + "weight")
    if ann.get(A + "priority") is not None or not isinstance(raw, str):
        return 1
    text = raw.strip()
    return int(text) if text.isdigit() and 1 <= int(text) <= 1_000_000 else 1


def tandem_annotations(ann: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The ``tandem.io/*`` string annotations, sorted by key (what ``/v1/state`` shows)."""
    return tuple(sorted((k, v) for k, v in ann.items()
                        if isinstance(k, str) and k.startswith(A) and isinstance(v, str)))


def output_annotations(p: Placement, uuids: list[str], cost: float, plan: Any) -> dict[str, str]:
    """The annotations bind writes (DESIGN outputs plus batch and duty cycle for sessions)."""
    out = {
        OUT_GPU_INDEX: ",".join(str(i) for i in p.gpu_indices),
        OUT_GPU_UUID: ",".join(uuids),
        OUT_UTIL: f"{p.util_percent:.2f}",
        OUT_MEM: f"{p.mem_mib:.0f}",
        OUT_COST: f"{cost:.4f}",
    }
    if plan is not None and p.session is not None:
        alloc = plan.allocation(p.session.name)
        out[OUT_BATCH] = str(alloc.batch if alloc else 0)
        out[OUT_DUTY_CYCLE] = f"{plan.duty_cycle_ms:.3f}"
    return out
