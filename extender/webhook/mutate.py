"""What the admission webhook changes in a pod, as an AdmissionReview v1 JSONPatch.

For a pod the MutatingWebhookConfiguration selected (by namespace or pod label):
``nvidia.com/gpu`` becomes ``tandem.io/gpu`` where the admin opted in, a pod that
then asks for ``tandem.io/gpu`` gets ``schedulerName`` (unless it names another
scheduler) and the default tandem annotations it does not set itself. A pod that
names another scheduler is left alone. Pure: no I/O.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts import annotations as ann

NVIDIA_GPU = "nvidia.com/gpu"
DEFAULT_SCHEDULERS = ("", "default-scheduler")
DEFAULTABLE = (ann.WORKLOAD, ann.MODEL, ann.BATCH_SIZE, ann.GPU_UTIL, ann.GPU_MEM_MIB,
               ann.SLO_MS, ann.RATE_RPS, ann.WEIGHT, ann.PRIORITY)
"""Input annotations a default may fill; outputs are bind's alone."""
_KEYS = ("scheduler_name", "translate_nvidia_gpu", "translate_namespaces",
         "default_annotations", "tolerations")
_TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")


class WebhookConfigError(ValueError):
    """The webhook's settings are invalid; every problem with its path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid webhook configuration:\n  " + "\n  ".join(problems))


class ReviewError(ValueError):
    """The request is not an AdmissionReview v1 the webhook can answer (HTTP 400)."""


@dataclass(frozen=True)
class WebhookSettings:
    """What the webhook does to the pods it is sent."""

    scheduler_name: str = "tandem"
    translate_nvidia_gpu: bool = False
    """Rewrite ``nvidia.com/gpu`` requests and limits to ``tandem.io/gpu``."""
    translate_namespaces: tuple[str, ...] = ()
    """Where translation applies; empty = every namespace the webhook is sent."""
    default_annotations: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    """Added to the pods moved to tandem that lack them (e.g. for a tainted tandem pool)."""


def parse_settings(raw: Any) -> WebhookSettings:
    """Validated settings from a decoded YAML mapping; WebhookConfigError."""
    raw = raw if raw is not None else {}
    if not isinstance(raw, Mapping):
        raise WebhookConfigError(["(top): must be a mapping"])
    problems = [f"{k}: unknown key (valid: {', '.join(_KEYS)})" for k in raw if k not in _KEYS]
    name = raw.get("scheduler_name", "tandem")
    if not isinstance(name, str) or not name.strip():
        problems.append("scheduler_name: must be a non-empty string")
    translate = raw.get("translate_nvidia_gpu", False)
    if not isinstance(translate, bool):
        problems.append("translate_nvidia_gpu: must be true or false")
    namespaces = raw.get("translate_namespaces") or []
    if not isinstance(namespaces, list) or not all(isinstance(n, str) for n in namespaces):
        problems.append("translate_namespaces: must be a list of namespace names")
        namespaces = []
    defaults = raw.get("default_annotations") or {}
    if not isinstance(defaults, Mapping):
        problems.append("default_annotations: must be a mapping")
        defaults = {}
    # a number is taken as its text (helm --set and bare YAML numbers give numbers)
    defaults = {k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                for k, v in defaults.items()}
    for key, value in defaults.items():
        if key not in DEFAULTABLE:
            problems.append(f"default_annotations.{key}: not an input annotation "
                            f"(valid: {', '.join(DEFAULTABLE)})")
        elif not isinstance(value, str):
            problems.append(f"default_annotations.{key}: must be a string or a number")
    if not problems:
        try:  # each default in its range (the rest filled in so the set is complete)
            ann.parse_inputs({ann.MODEL: "m", ann.GPU_UTIL: "1", ann.GPU_MEM_MIB: "1",
                              **defaults})
        except ann.AnnotationError as exc:
            problems.append(f"default_annotations: {exc}")
    tolerations = _tolerations(raw.get("tolerations") or [], problems)
    if problems:
        raise WebhookConfigError(problems)
    return WebhookSettings(name, translate, tuple(namespaces), dict(defaults), tolerations)


def _tolerations(raw: Any, problems: list[str]) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(raw, list):
        problems.append("tolerations: must be a list of tolerations")
        return ()
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not item:
            problems.append(f"tolerations[{i}]: must be a toleration mapping")
            continue
        unknown = [k for k in item if k not in _TOLERATION_KEYS]
        if unknown:
            problems.append(f"tolerations[{i}]: unknown keys {unknown} "
                            f"(valid: {', '.join(_TOLERATION_KEYS)})")
    return tuple(dict(t) for t in raw if isinstance(t, Mapping))


def review(body: Any, settings: WebhookSettings) -> dict[str, Any]:
    """The AdmissionReview v1 answer to ``body`` (decoded JSON); ReviewError if malformed."""
    if not isinstance(body, Mapping) or body.get("kind") != "AdmissionReview":
        raise ReviewError("expected an AdmissionReview")
    if body.get("apiVersion") != "admission.k8s.io/v1":
        raise ReviewError("expected apiVersion admission.k8s.io/v1")
    request = body.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ReviewError("request.uid is missing")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    pod = request.get("object")
    kind = request.get("kind") or {}
    if (isinstance(pod, Mapping) and isinstance(kind, Mapping) and kind.get("kind") == "Pod"
            and request.get("operation", "CREATE") == "CREATE"):
        namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace")
        patch = pod_patch(pod, settings, str(namespace or ""))
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": response}


def pod_patch(pod: Mapping[str, Any], settings: WebhookSettings,
              namespace: str) -> list[dict[str, Any]]:
    """JSONPatch operations for ``pod``; empty when nothing changes."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise ReviewError("request.object.spec is missing")
    ops: list[dict[str, Any]] = []
    scheduler = spec.get("schedulerName", "")
    if not isinstance(scheduler, str) or \
            scheduler not in (*DEFAULT_SCHEDULERS, settings.scheduler_name):
        return ops  # another scheduler's pod: its GPUs are not tandem's to hand out
    translate = settings.translate_nvidia_gpu and (
        not settings.translate_namespaces or namespace in settings.translate_namespaces)
    wants_tandem = False
    for group in ("initContainers", "containers"):
        items = spec.get(group)
        for i, container in enumerate(items if isinstance(items, list) else []):
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            new = _translated(resources) if translate else resources
            if new is not resources:
                ops.append({"op": "replace", "path": f"/spec/{group}/{i}/resources",
                            "value": new})
            wants_tandem |= any(isinstance(v, Mapping) and ann.GPU_RESOURCE in v
                                for v in new.values())
    if not wants_tandem:
        return ops
    if scheduler in DEFAULT_SCHEDULERS:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": settings.scheduler_name})
    ops.extend(_toleration_ops(spec.get("tolerations"), settings.tolerations))
    metadata = pod.get("metadata")
    ops.extend(_annotation_ops(metadata if isinstance(metadata, Mapping) else {},
                               settings.default_annotations))
    return ops


def _translated(resources: Mapping[str, Any]) -> Mapping[str, Any]:
    """``resources`` with nvidia.com/gpu renamed, or the same object when it has none."""
    if not any(isinstance(v, Mapping) and NVIDIA_GPU in v for v in resources.values()):
        return resources
    out: dict[str, Any] = {}
    for part, values in resources.items():
        if isinstance(values, Mapping) and NVIDIA_GPU in values:
            values = {ann.GPU_RESOURCE if k == NVIDIA_GPU else k: v for k, v in values.items()
                      if not (k == ann.GPU_RESOURCE and NVIDIA_GPU in values)}
        out[part] = values
    return out


def _toleration_ops(present: Any, wanted: tuple[Mapping[str, Any], ...],
                    ) -> list[dict[str, Any]]:
    have = present if isinstance(present, list) else None
    missing = [dict(t) for t in wanted if have is None or t not in have]
    if not missing:
        return []
    if have is None:
        return [{"op": "add", "path": "/spec/tolerations", "value": missing}]
    return [{"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing]


def _annotation_ops(metadata: Mapping[str, Any],
                    defaults: Mapping[str, str]) -> list[dict[str, Any]]:
    present = metadata.get("annotations")
    present = present if isinstance(present, Mapping) else None
    missing = {k: v for k, v in defaults.items() if present is None or k not in present}
    if not missing:
        return []
    if present is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": missing}]
    return [{"op": "add", "path": f"/metadata/annotations/{_pointer(k)}", "value": v}
            for k, v in missing.items()]


def _pointer(key: str) -> str:
    """One JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")
