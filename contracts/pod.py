"""A Pod as tandem reads it: one typed, read-only view, read once.

Kubernetes hands tandem raw Pod bodies (the scheduler's ``/filter``, the API server's
watch and reads). :meth:`PodView.of` reads one once: its names and UID, annotations,
node, priority, and every container with what it names of ``tandem.io/gpu`` (the
one place a container's GPU request is read). Nothing is refused here: a part that
is not what the API says reads as absent and is listed in ``problems`` with its
path, and each reader decides whether that is an error (demand resolution refuses
such a pod, the cluster source skips it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from contracts.annotations import GPU_RESOURCE, PROGRESS, AnnotationError, parse_progress

NVIDIA_GPU = "nvidia.com/gpu"
"""The device plugin's GPU resource, which the admission webhook may rename to tandem's."""
CONTAINER_KINDS = ("initContainers", "containers")
"""In the kubelet's admission order: init containers first."""
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else _EMPTY


@dataclass(frozen=True)
class ContainerView:
    """One container (or init container) of a pod."""

    name: str
    init: bool
    index: int
    """Its position among the pod's containers of its kind (for error paths)."""
    resources: Any
    """``resources`` as the body has it (what the demand digest covers)."""
    gpu_values: tuple[Any, ...]
    """``tandem.io/gpu`` as given in ``limits`` then ``requests``, where set (unparsed:
    ``contracts.annotations.parse_integer`` reads a count)."""
    names_gpu: bool = False
    """Whether the container names ``tandem.io/gpu`` in its resources at all."""
    names_nvidia_gpu: bool = False
    """Whether it names ``nvidia.com/gpu`` (before the webhook's rename, where it renames)."""

    @property
    def path(self) -> str:
        """Where its GPU request is in the Pod (``Pod.spec.containers[0].resources...``)."""
        kind = CONTAINER_KINDS[0] if self.init else CONTAINER_KINDS[1]
        return f"Pod.spec.{kind}[{self.index}].resources.{GPU_RESOURCE}"


@dataclass(frozen=True)
class PodView:
    """What tandem reads of a Pod (module docstring)."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, Any]
    labels: Mapping[str, Any]
    containers: tuple[ContainerView, ...]
    """Init containers first, then containers, each kind in order."""
    node_name: str | None = None
    priority: int = 0
    preemption_policy: str | None = None
    deleting: bool = False
    """``metadata.deletionTimestamp`` is set."""
    problems: tuple[tuple[str, Any, str], ...] = ()
    """(path, value, what is wrong) of every part that is not what the API says."""

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def requests_gpus(self) -> bool:
        """Whether a container names ``tandem.io/gpu`` (set at creation and immutable)."""
        return any(c.names_gpu for c in self.containers)

    @property
    def reports_progress(self) -> bool:
        """Whether the pod names a readable step counter (:func:`names_progress`)."""
        return names_progress(self.annotations)

    def problem(self, *paths: str) -> tuple[str, Any, str] | None:
        """The first problem at one of ``paths``, if any."""
        return next((p for p in self.problems if p[0] in paths), None)

    @property
    def asks_any_gpu(self) -> bool:
        """Whether a container names ``tandem.io/gpu`` or ``nvidia.com/gpu``."""
        return any(c.names_gpu or c.names_nvidia_gpu for c in self.containers)

    @classmethod
    def of(cls, pod: Mapping[str, Any] | PodView) -> PodView:
        """Read ``pod`` (a decoded Pod body; a view is returned as it is)."""
        if isinstance(pod, PodView):
            return pod
        problems: list[tuple[str, Any, str]] = []
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping):
            problems.append(("Pod.metadata", meta, "must be an object"))
        meta = _mapping(meta)
        name, namespace, uid = meta.get("name"), meta.get("namespace", "default"), \
            meta.get("uid", "")
        if not isinstance(name, str) or not name:
            problems.append(("Pod.metadata.name", name, "must be a non-empty string"))
        if not isinstance(namespace, str) or not isinstance(uid, str):
            problems.append(("Pod.metadata.namespace/uid", (namespace, uid), "must be strings"))
        ann = meta.get("annotations")
        if ann is not None and not isinstance(ann, Mapping):
            problems.append(("Pod.metadata.annotations", ann, "must be an object"))
        spec = pod.get("spec")
        if not isinstance(spec, Mapping):
            problems.append(("Pod.spec", spec, "must be an object"))
        spec = _mapping(spec)
        containers: list[ContainerView] = []
        for kind in CONTAINER_KINDS:
            listed = spec.get(kind) or []
            if not isinstance(listed, list):
                problems.append((f"Pod.spec.{kind}", listed, "must be a list"))
                continue
            containers += [_container(c, kind == CONTAINER_KINDS[0], i)
                           for i, c in enumerate(listed)]
        priority = spec.get("priority")
        node = spec.get("nodeName")
        policy = spec.get("preemptionPolicy")
        return cls(namespace if isinstance(namespace, str) and namespace else "default",
                   name if isinstance(name, str) else "", uid if isinstance(uid, str) else "",
                   MappingProxyType(dict(_mapping(ann))),
                   MappingProxyType(dict(_mapping(meta.get("labels")))), tuple(containers),
                   node if isinstance(node, str) and node else None,
                   priority if isinstance(priority, int) else 0,
                   policy if isinstance(policy, str) else None,
                   bool(meta.get("deletionTimestamp")), tuple(problems))


def names_progress(annotations: Mapping[str, Any]) -> bool:
    """Whether ``tandem.io/progress`` parses: only such a pod's progress can be measured, so
    only it is placed by learned pair figures (``extender.core.pair_cost``). A value that
    does not parse reads as none (the agent skips it with a reason), never as an error."""
    if PROGRESS not in annotations:
        return False
    try:
        parse_progress(annotations[PROGRESS])
    except AnnotationError:
        return False
    return True


def _container(c: object, init: bool, index: int) -> ContainerView:
    body = _mapping(c)
    resources = body.get("resources")
    res = _mapping(resources)
    values = tuple(amounts[GPU_RESOURCE] for amounts in
                   (res.get("limits") or {}, res.get("requests") or {})
                   if isinstance(amounts, Mapping) and amounts.get(GPU_RESOURCE) is not None)
    amounts = [a for a in (res.get("limits"), res.get("requests")) if isinstance(a, Mapping)]
    name = body.get("name")
    return ContainerView(name if isinstance(name, str) else str(name), init, index, resources,
                         values, any(GPU_RESOURCE in a for a in amounts),
                         any(NVIDIA_GPU in a for a in amounts))
