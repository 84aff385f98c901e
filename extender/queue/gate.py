"""Scheduling-gate controller: Horus's weighted-fair queue in front of kube-scheduler.

**How pods get the gate.** GPU pods carry ``spec.schedulingGates: [{name:
tandem.io/queue}]`` in their pod template (Kubernetes >= 1.30, where
``PodSchedulingReadiness`` is GA). We chose the template over a mutating
webhook: a webhook needs its own TLS serving and, with ``failurePolicy: Fail``,
blocks every pod creation when it is down, or with ``Ignore`` silently lets pods
bypass the queue; a template entry is explicit, reviewable and has no failure
mode beyond "this pod is not queued". A pod without the gate is scheduled
directly, exactly as before. (A cluster that wants it enforced can add the gate
with a MutatingAdmissionPolicy or Kyverno rule; the controller does not care who
added it.) Gates can only be removed after creation, never added, so this is
the only way in.

**A round** (every ``interval_seconds``): list pending pods; the gated GPU pods
(requesting ``tandem.io/gpu``) are the queue. Released pods that are still
unbound count as *in flight*; the round releases up to ``beta - in_flight``
pods chosen by :class:`extender.queue.fair.FairQueue` (k-means classes,
``w_x = max(len, median_wait * len)``, starving pods first). Features per pod:
tasks = gated pods with the same controller owner, GPUs per task =
``tandem.io/gpu``, utilisation and memory from the ``tandem.io/gpu-util`` and
``tandem.io/gpu-mem-mib`` annotations (or an injected ``demand_fn``, e.g. the
predictor), 0 when unknown; waiting time counts from ``creationTimestamp``.

**Scope.** With ``namespaces`` empty the controller lists pending pods in all
namespaces (RBAC: a ClusterRole); with a list it lists only those, so a Role
per namespace is enough. **Leadership**: :meth:`GateController.run` takes an
``is_leader`` callable and skips rounds while it is false, so replicas of the
extender (or of ``tandem extender queue-gate``) never release in parallel.

**Release** is one JSON patch per pod that tests the gate is still at the index
read, removes it and stamps ``tandem.io/queue-released-at``; a pod that changed
meanwhile fails the test (HTTP 422) and is simply seen again next round. All
state is read back from the API each round, so a restart loses nothing.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from extender.core.demand import DemandError, gpu_count_of, parse_demand
from extender.queue.fair import FairQueue, QueueConfig, QueueError, QueueItem

GATE_NAME = "tandem.io/queue"
RELEASED_ANNOTATION = "tandem.io/queue-released-at"
log = logging.getLogger("tandem.queue.gate")

DemandFn = Callable[[Mapping[str, Any]], tuple[float, float]]
"""``pod -> (util_percent, mem_mib)`` for pods that assert neither."""


class CoreV1Like(Protocol):
    """The ``kubernetes.client.CoreV1Api`` calls the controller makes."""

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        """List pods (called with ``_preload_content=False``; ``.data`` is the JSON)."""

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        """List one namespace's pods (same call convention)."""

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        """Patch one pod."""


@dataclass(frozen=True)
class GateConfig:
    """Controller settings."""

    queue: QueueConfig = QueueConfig()
    interval_seconds: float = 5.0
    """Time between rounds (> 0)."""
    gate_name: str = GATE_NAME
    """The ``spec.schedulingGates`` entry this controller owns and removes."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty = all namespaces."""

    def __post_init__(self) -> None:
        if not self.interval_seconds > 0:
            raise QueueError("interval_seconds", "must be > 0")
        if not self.gate_name:
            raise QueueError("gate_name", "must be non-empty")
        if any(not ns for ns in self.namespaces):
            raise QueueError("namespaces", "must not contain empty names")


@dataclass(frozen=True)
class RoundReport:
    """What one round saw and did."""

    gated: int = 0
    in_flight: int = 0
    released: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    """Pods whose release patch was refused (changed or gone); retried next round."""
    error: str | None = None
    classes: tuple[tuple[int, int, float, float], ...] = field(default=())
    """(class, length, median wait s, weight) per class."""
    oldest_wait_seconds: float = 0.0
    """How long the oldest gated pod has waited (0 when none is gated)."""


def gate_index(pod: Mapping[str, Any], gate_name: str = GATE_NAME) -> int | None:
    """Index of the gate ``gate_name`` in ``spec.schedulingGates`` (None when absent)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    for i, gate in enumerate(gates):
        if isinstance(gate, Mapping) and gate.get("name") == gate_name:
            return i
    return None


def _created_at(pod: Mapping[str, Any], fallback: float) -> float:
    stamp = (pod.get("metadata") or {}).get("creationTimestamp")
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return fallback
    return fallback


def _owner(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("uid"):
            return str(ref["uid"])
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name``."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def release_patch(pod: Mapping[str, Any], index: int, now_seconds: float,
                  gate_name: str = GATE_NAME) -> list[dict[str, Any]]:
    """JSON patch: test the gate is at ``index``, remove it, stamp the release time."""
    stamp = datetime.fromtimestamp(now_seconds).astimezone().isoformat()
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": gate_name},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
    if (pod.get("metadata") or {}).get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations/"
                    + RELEASED_ANNOTATION.replace("~", "~0").replace("/", "~1"), "value": stamp})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations",
                    "value": {RELEASED_ANNOTATION: stamp}})
    return ops


class GateController:
    """Releases gated GPU pods in weighted-fair order; one :meth:`reconcile` per round."""

    def __init__(self, api: CoreV1Like, config: GateConfig | None = None,
                 clock: Callable[[], float] | None = None, demand_fn: DemandFn | None = None):
        import time

        self.api = api
        self.config = config or GateConfig()
        self.clock = clock or time.time
        self.demand_fn = demand_fn

    def _list_pending(self) -> list[Mapping[str, Any]]:
        selector = "status.phase=Pending"
        if self.config.namespaces:
            responses = [self.api.list_namespaced_pod(ns, field_selector=selector,
                                                      _preload_content=False)
                         for ns in self.config.namespaces]
        else:
            responses = [self.api.list_pod_for_all_namespaces(field_selector=selector,
                                                              _preload_content=False)]
        pods: list[Mapping[str, Any]] = []
        for response in responses:
            data = json.loads(response.data)
            items = data.get("items") if isinstance(data, Mapping) else None
            pods.extend(p for p in items or [] if isinstance(p, Mapping))
        return pods

    def _item(self, pod: Mapping[str, Any], tasks: int, now: float) -> QueueItem:
        util = mem = 0.0
        try:
            demand = parse_demand(pod)
            gpus = max(1, demand.gpu_count)
            ask = demand.inputs
            if ask.util_percent is not None and ask.mem_mib is not None:
                util, mem = ask.util_percent, ask.mem_mib
            elif self.demand_fn is not None:
                util, mem = self.demand_fn(pod)
            util = ask.util_percent if ask.util_percent is not None else util
            mem = ask.mem_mib if ask.mem_mib is not None else mem
        except DemandError:
            gpus = max(1, _safe_gpu_count(pod))  # still queued; the extender reports the error
        except Exception as exc:  # noqa: BLE001 - a failing predictor must not stop the queue
            log.warning("demand-failed", extra={"pod": pod_key(pod), "event": "demand-failed",
                                                 "error": str(exc)})
            gpus = max(1, _safe_gpu_count(pod))
        return QueueItem(key=pod_key(pod), enqueued_at_seconds=_created_at(pod, now),
                         tasks=tasks, util_percent=float(util), gpus_per_task=gpus,
                         mem_mib=float(mem))

    def reconcile(self) -> RoundReport:
        """One round: read pending pods, release up to ``beta - in_flight`` of the gated ones."""
        now = self.clock()
        try:
            pods = self._list_pending()
        except Exception as exc:  # noqa: BLE001 - API down: report and try next round
            return RoundReport(error=f"list pods: {exc}")
        name = self.config.gate_name
        gated = [p for p in pods if gate_index(p, name) is not None and _safe_gpu_count(p) > 0]
        in_flight = sum(1 for p in pods if gate_index(p, name) is None
                        and RELEASED_ANNOTATION in ((p.get("metadata") or {}).get("annotations")
                                                    or {})
                        and not (p.get("spec") or {}).get("nodeName"))
        owners: dict[str, int] = {}
        for p in gated:
            owners[_owner(p)] = owners.get(_owner(p), 0) + 1
        queue = FairQueue(self.config.queue)
        by_key = {}
        for p in gated:
            item = self._item(p, owners[_owner(p)], now)
            by_key[item.key] = p
            queue.add(item)
        slots = max(0, self.config.queue.beta - in_flight)
        picked = queue.select(now, slots)  # with no slot: classes for the report, no release
        released, conflicts = [], []
        for item in picked:
            pod = by_key[item.key]
            meta = pod.get("metadata") or {}
            index = gate_index(pod, name)
            assert index is not None
            try:
                self.api.patch_namespaced_pod(
                    meta.get("name", ""), meta.get("namespace", "default"),
                    release_patch(pod, index, now, name),
                    _content_type="application/json-patch+json")
                released.append(item.key)
                log.info("released", extra={"pod": item.key, "event": "released",
                                            "class": queue.class_of(item.key)})
            except Exception as exc:  # noqa: BLE001 - 404/409/422: the pod changed; next round
                conflicts.append(item.key)
                log.info("release-conflict", extra={
                    "pod": item.key, "event": "release-conflict",
                    "status": getattr(exc, "status", None)})
        classes = tuple((c.index, c.length, round(c.median_wait_seconds, 3), round(c.weight, 3))
                        for c in queue.last_classes)
        oldest = max((now - item.enqueued_at_seconds for item in queue.items()), default=0.0)
        return RoundReport(gated=len(gated), in_flight=in_flight, released=tuple(released),
                           conflicts=tuple(conflicts), classes=classes,
                           oldest_wait_seconds=round(max(0.0, oldest), 3))

    def run(self, stop: threading.Event, is_leader: Callable[[], bool] | None = None,
            on_round: Callable[[RoundReport], None] | None = None) -> None:
        """Reconcile every ``interval_seconds`` until ``stop`` is set; idle while not leader."""
        while not stop.is_set():
            if is_leader is None or is_leader():
                report = self.reconcile()
                if report.error:
                    log.warning("round-failed", extra={"event": "round-failed",
                                                       "error": report.error})
                if on_round is not None:
                    on_round(report)
            stop.wait(self.config.interval_seconds)


def controller_from_kube(config: GateConfig | None = None,
                         demand_fn: DemandFn | None = None) -> GateController:
    """A controller on the real API: in-cluster service account, else the local kubeconfig."""
    from kubernetes import client
    from kubernetes import config as kube_config

    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    return GateController(client.CoreV1Api(), config, demand_fn=demand_fn)


def _safe_gpu_count(pod: Mapping[str, Any]) -> int:
    try:
        return gpu_count_of(pod)
    except (DemandError, TypeError, ValueError):
        return 0
