"""What the admission webhook changes in a pod, as an AdmissionReview v1 JSONPatch.

For a pod the MutatingWebhookConfiguration selected (by namespace or pod label):
``nvidia.com/gpu`` becomes ``tandem.io/gpu`` where the admin opted in, and so do the
GPU shares other sharing schedulers' users declare (``extender.webhook.shares``); a
pod that then asks for ``tandem.io/gpu`` gets ``schedulerName`` (unless it names
another scheduler) and the default tandem annotations it does not set itself. A pod
of no GPU gets ``schedulerName`` where the admin routes it to tandem's profile
(``route_namespaces``, ``route_node_label``). A pod that names another scheduler is
left alone. Pure: no I/O.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts import annotations as ann
from contracts.pod import CONTAINER_KINDS, NVIDIA_GPU, PodView
from extender.webhook.shares import MEMORY_UNITS, ShareError, ShareSources, Translated
from extender.webhook.shares import translate as translate_shares

DEFAULT_SCHEDULERS = ("", "default-scheduler")
DEFAULTABLE = (ann.WORKLOAD, ann.MODEL, ann.BATCH_SIZE, ann.GPU_UTIL, ann.GPU_MEM_MIB,
               ann.SLO_MS, ann.RATE_RPS, ann.WEIGHT, ann.PRIORITY)
"""Input annotations a default may fill; outputs are bind's alone."""
_KEYS = ("scheduler_name", "translate_nvidia_gpu", "translate_namespaces",
         "default_annotations", "tolerations", "translate_gpushare", "gpushare_memory_unit",
         "translate_hami", "translate_gpu_milli", "gpu_milli_memory_mib", "route_namespaces",
         "route_node_label")
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
    shares: ShareSources = ShareSources()
    """Declared shares of other GPU-sharing schedulers to translate (``shares.py``)."""
    route_namespaces: tuple[str, ...] = ()
    """Pods of no GPU in these namespaces go to tandem's profile too (scored there)."""
    route_node_label: str = ""
    """Pods of no GPU whose nodeSelector or required node affinity names this label key
    (one the GPU nodes carry) go to tandem's profile too."""


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
    shares = _shares(raw, problems)
    route = raw.get("route_namespaces") or []
    if not isinstance(route, list) or not all(isinstance(n, str) and n for n in route):
        problems.append("route_namespaces: must be a list of namespace names")
    label = raw.get("route_node_label") or ""
    if not isinstance(label, str):
        problems.append("route_node_label: must be a node label key")
    if problems:
        raise WebhookConfigError(problems)
    return WebhookSettings(name, translate, tuple(namespaces), dict(defaults), tolerations,
                           shares, tuple(route), label)


def _shares(raw: Mapping[str, Any], problems: list[str]) -> ShareSources:
    flags = {}
    for key in ("translate_gpushare", "translate_hami", "translate_gpu_milli"):
        flags[key] = raw.get(key, False)
        if not isinstance(flags[key], bool):
            problems.append(f"{key}: must be true or false")
    unit = raw.get("gpushare_memory_unit", "GiB")
    if unit not in MEMORY_UNITS:
        problems.append(f"gpushare_memory_unit: must be one of {', '.join(MEMORY_UNITS)}")
    mib = raw.get("gpu_milli_memory_mib")
    if mib is not None and (not isinstance(mib, int) or isinstance(mib, bool) or mib <= 0):
        problems.append("gpu_milli_memory_mib: must be a positive integer (MiB)")
    elif mib is None and flags["translate_gpu_milli"] is True:
        problems.append("gpu_milli_memory_mib: required with translate_gpu_milli (the GPU "
                        "memory that 1000 milli stand for, MiB)")
    return ShareSources(flags["translate_gpushare"] is True, unit if unit in MEMORY_UNITS
                        else "GiB", flags["translate_hami"] is True,
                        flags["translate_gpu_milli"] is True, mib if isinstance(mib, int) else None)


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
        try:
            patch = pod_patch(pod, settings, str(namespace or ""))
        except (ShareError, ann.AnnotationError) as exc:  # the owner fixes the spec
            response.update(allowed=False, status={"code": 400, "message": f"tandem: {exc}"})
            patch = []
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
    in_scope = not settings.translate_namespaces or namespace in settings.translate_namespaces
    translate = settings.translate_nvidia_gpu and in_scope
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    view = PodView.of(pod)
    shared = translate_shares(view, settings.shares) \
        if settings.shares.any and in_scope else Translated({}, {})
    wants_tandem = False
    for container in view.containers:
        group = CONTAINER_KINDS[0] if container.init else CONTAINER_KINDS[1]
        resources = container.resources
        if (group, container.index) in shared.resources:
            resources, new = None, shared.resources[(group, container.index)]
        elif not isinstance(resources, Mapping):
            continue
        else:
            new = _translated(resources) if translate else resources
        if new is not resources:  # add: a container may have had no resources at all
            ops.append({"op": "add" if resources is None else "replace",
                        "path": f"/spec/{group}/{container.index}/resources", "value": new})
        wants_tandem |= any(isinstance(v, Mapping) and ann.GPU_RESOURCE in v
                            for v in new.values())
    if not wants_tandem:
        if scheduler in DEFAULT_SCHEDULERS and routed(spec, namespace, settings):
            ops.append({"op": "add", "path": "/spec/schedulerName",
                        "value": settings.scheduler_name})
        return ops
    if scheduler in DEFAULT_SCHEDULERS:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": settings.scheduler_name})
    ops.extend(_toleration_ops(spec.get("tolerations"), settings.tolerations))
    ops.extend(_annotation_ops(metadata, {**settings.default_annotations, **shared.annotations}))
    return ops


def routed(spec: Mapping[str, Any], namespace: str, settings: WebhookSettings) -> bool:
    """Whether a pod of no GPU goes to tandem's profile: its namespace is routed, or it is
    bound for nodes with ``route_node_label`` (nodeSelector or required node affinity)."""
    if namespace in settings.route_namespaces:
        return True
    label = settings.route_node_label
    if not label:
        return False
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and label in selector:
        return True
    terms: Any = spec
    for key in ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                "nodeSelectorTerms"):
        terms = terms.get(key) if isinstance(terms, Mapping) else None
    return isinstance(terms, list) and bool(terms) and all(
        isinstance(t, Mapping) and isinstance(t.get("matchExpressions"), list)
        and any(isinstance(e, Mapping) and e.get("key") == label
                and e.get("operator") in ("In", "Exists") for e in t["matchExpressions"])
        for t in terms)


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
