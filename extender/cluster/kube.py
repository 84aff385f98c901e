"""The ``kube`` cluster source: Kubernetes nodes and pods through the official client.

- Inventory per node from NVIDIA GPU Feature Discovery labels
  (``nvidia.com/gpu.count``, ``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory``
  in MiB per GPU); agent reports override it in ``ClusterState`` because they are
  measured. GFD labels carry no UUIDs, so until a report arrives a GPU's uuid is
  its index, which ``NVIDIA_VISIBLE_DEVICES`` accepts as well.
- Placements are rebuilt from bound pods' ``tandem.io/*`` annotations on start
  (list), then kept fresh by watches; a watch that fails or expires (410) relists.
- Bind is one round trip: it creates ``pods/binding`` carrying the pod UID as a
  precondition (a recreated pod of the same name is never bound by mistake) and
  the output annotations, which the API server copies onto the pod in the same
  update as ``nodeName``, so a bound pod always has its decision. Events are
  posted by a background worker so the bind path never waits on them; identical
  events queued together go out as one with a count.
- Lists, watches and pod reads go through the official client with
  ``_preload_content=False`` and plain JSON: turning full Pod objects into client
  models and back costs more than the rest of a bind (profiled), and nothing here
  needs the models. Bindings and events go through ``kube_http.LeanPoster``, built
  from the same configuration: urllib3 and ``http.client`` cost more than the API
  server's own work per binding (profiled).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from contracts.logs import get_logger
from extender.cluster.kube_http import LeanPoster, api_error, supports
from extender.cluster.source import DONE_PHASES, Verifier, same_decision, trusted_placement
from extender.core import GpuSpec, NodeSpec, Placement, PodRef
from extender.errors import BindOutcomeUnknown, SourceError

GFD_COUNT = "nvidia.com/gpu.count"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
COMPONENT = "tandem-extender"
EVENT_QUEUE_LIMIT = 1000


def _json(response: Any) -> Any:
    """The body of a ``_preload_content=False`` answer as plain JSON; the connection goes back."""
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


def _drain(response: Any) -> None:
    """Read and drop an answer nobody needs, so its keep-alive connection can be reused."""
    response.drain_conn()
    response.release_conn()


class PlainWatch(watch.Watch):
    """A watch whose events carry plain JSON objects (no client models).

    Unlike ``stream(..., deserialize=False)``, error events (410 Gone) still become
    ``ApiException`` here, so an expired watch relists instead of retrying forever.
    """

    def get_return_type(self, func: Any) -> None:
        """No model type: ``unmarshal_event`` then leaves the object as parsed JSON."""
        return None


def node_spec(node: Mapping[str, Any]) -> NodeSpec:
    """A NodeSpec from a Node object's GFD labels (no GPUs when labels are missing or bad)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    name = str(meta.get("name", ""))
    try:
        count = int(labels.get(GFD_COUNT, "0"))
        memory = float(labels.get(GFD_MEMORY, "0"))
    except (TypeError, ValueError):
        return NodeSpec(name, ())
    product = labels.get(GFD_PRODUCT)
    if count <= 0 or memory <= 0 or not product or count > 64:
        return NodeSpec(name, ())
    return NodeSpec(name, tuple(GpuSpec(i, str(i), str(product), memory) for i in range(count)))


class KubeSource:
    """Nodes and pods from the API server; binds through ``pods/binding``."""

    kubelet_admits = True

    def __init__(self, api: client.CoreV1Api,
                 watch_factory: Callable[[], Any] = PlainWatch,
                 watch_timeout_seconds: int = 300, background_events: bool = True):
        self.api = api
        self._watch_factory = watch_factory
        self._timeout = watch_timeout_seconds
        self._background_events = background_events
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue(EVENT_QUEUE_LIMIT)
        self._log = get_logger()
        self._signer: Any = None
        self._on_untrusted: Callable[[str], None] | None = None
        self._distrusted: set[str] = set()
        """Pods already reported as carrying an unverifiable placement (reported once)."""
        # Bindings and events go through the lean client when it can speak for this
        # configuration (kube_http.py says why); reads and watches stay on the official one.
        api_client = getattr(api, "api_client", None)
        configuration = getattr(api_client, "configuration", None)
        self._poster = LeanPoster(configuration, api_client.user_agent) \
            if configuration is not None and supports(configuration) else None

    signs_placements = True

    def use_signer(self, signer: Any, on_untrusted: Callable[[str], None] | None = None,
                   ) -> None:
        """Sign placements at bind and verify them when rebuilding (``extender.state.signing``);
        ``on_untrusted(problem)`` counts pods whose placement did not verify."""
        self._signer = signer
        self._on_untrusted = on_untrusted

    @classmethod
    def from_environment(cls) -> KubeSource:
        """In-cluster config, else the local kubeconfig."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(client.CoreV1Api())

    def _plain(self, obj: Any) -> dict[str, Any]:
        return self.api.api_client.sanitize_for_serialization(obj)

    def _list(self, lister: Callable[..., Any], **kwargs: Any) -> tuple[list[Any], str]:
        body = _json(lister(_preload_content=False, **kwargs))
        return body.get("items") or [], str((body.get("metadata") or {}).get("resourceVersion"))

    # ---- sync and watch --------------------------------------------------------------
    def sync(self, state: Any) -> tuple[str, str]:
        """List nodes and bound pods into ``state``; returns (node, pod) resourceVersions."""
        nodes, node_rv = self._list(self.api.list_node)
        state.set_nodes([node_spec(n) for n in nodes])
        listed_at = state.now()
        pods, pod_rv = self._list(self.api.list_pod_for_all_namespaces,
                                  field_selector="spec.nodeName!=")
        bound: set[str] = set()
        for pod in pods:
            state.handoffs.observe(pod)
            uid = self._observe_bound(state, pod)
            if uid is not None:
                bound.add(uid)
        # A relist is the truth: pods deleted or finished while no watch ran are released.
        for gone in state.retain_placed(bound, listed_at):
            self._distrusted.discard(gone.pod_uid)
            self._log.info("released on relist", extra={"pod": gone.pod})
        state.mark_synced()
        return node_rv, pod_rv

    def apply_node_event(self, state: Any, kind: str, node: Mapping[str, Any]) -> None:
        """Update the inventory from one watch event."""
        spec = node_spec(node)
        if kind == "DELETED":
            state.delete_node(spec.name)
        else:
            state.upsert_node(spec)

    def apply_pod_event(self, state: Any, kind: str, pod: Mapping[str, Any]) -> None:
        """Update the ledger from one watch event.

        A pod with our annotations but no ``nodeName`` yet is mid-bind: its assumed
        placement is left alone (forgetting it would free capacity still promised).
        """
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        phase = (pod.get("status") or {}).get("phase")
        state.handoffs.observe(pod, deleted=kind == "DELETED")
        if kind == "DELETED" or phase in DONE_PHASES:
            state.forget(uid)
            self._distrusted.discard(uid)
            return
        self._observe_bound(state, pod)

    def _observe_bound(self, state: Any, pod: Mapping[str, Any]) -> str | None:
        """Confirm a bound pod's placement, trusting only what the extender decided.

        A pod the ledger already holds keeps the decision held (a watch event or a
        relist never changes a placement's GPUs or reservations); a pod it does not
        hold is taken as its signed annotations say, or conservatively when they do
        not verify (``extender.state.signing``). Returns the UID of the pod placed, if any.
        """
        verifier: Verifier | None = self._signer
        placement, verified = trusted_placement(pod, verifier, state.named_gpus)
        if placement is None:
            return None
        held: Placement | None = state.placement_of(placement.pod_uid)
        if held is not None and not (verified and same_decision(held, placement)):
            self._distrust(pod, placement, "changed", "differs from the placement bound")
            state.confirm(held)
            return held.pod_uid
        if not verified:
            self._distrust(pod, placement, "unsigned",
                           "has no valid tandem.io/placement-signature")
        state.confirm(placement)
        return placement.pod_uid

    def _distrust(self, pod: Mapping[str, Any], placement: Placement, kind: str,
                  problem: str) -> None:
        if placement.pod_uid in self._distrusted:
            return
        self._distrusted.add(placement.pod_uid)
        if self._on_untrusted is not None:
            self._on_untrusted(kind)
        meta = pod.get("metadata") or {}
        ref = PodRef(str(meta.get("namespace", "")), str(meta.get("name", "")),
                     placement.pod_uid)
        message = (f"the GPU placement recorded on this pod {problem}; tandem keeps the "
                   "placement it decided, or holds every GPU named in full")
        self._log.warning("untrusted placement annotations",
                          extra={"pod": ref.key, "problem": problem})
        self.record_event(ref, "TandemPlacementUntrusted", message, True)

    def start(self, state: Any) -> None:
        """Initial sync, then node and pod watches and the event worker in threads."""
        node_rv, pod_rv = self.sync(state)
        self._spawn("nodes", lambda rv: self._watch(state, self.api.list_node,
                                                     self.apply_node_event, rv), node_rv)
        self._spawn("pods", lambda rv: self._watch(state, self.api.list_pod_for_all_namespaces,
                                                    self.apply_pod_event, rv), pod_rv)
        if self._background_events:
            worker = threading.Thread(target=self._event_worker, name="tandem-events",
                                      daemon=True)
            worker.start()
            self._threads.append(worker)

    def _spawn(self, name: str, loop: Callable[[str], None], rv: str) -> None:
        thread = threading.Thread(target=loop, args=(rv,), name=f"tandem-watch-{name}",
                                  daemon=True)
        thread.start()
        self._threads.append(thread)

    def _watch(self, state: Any, lister: Callable[..., Any],
               apply: Callable[[Any, str, Mapping[str, Any]], None], rv: str) -> None:
        relist = False
        while not self._stop.is_set():
            try:
                if relist:
                    # Inside the try: a relist that fails too (API server down) is retried
                    # after the backoff; it must never end the watch thread.
                    rv = self.sync(state)[0 if lister == self.api.list_node else 1]
                    relist = False
                    if self._stop.is_set():
                        return
                stream = self._watch_factory().stream(lister, resource_version=rv,
                                                      timeout_seconds=self._timeout)
                for event in stream:
                    obj = event["object"]
                    plain = obj if isinstance(obj, Mapping) else self._plain(obj)
                    rv = (plain.get("metadata") or {}).get("resourceVersion", rv)
                    apply(state, event["type"], plain)
                    if self._stop.is_set():
                        return
                if self._stop.wait(0.5):  # the server closed the watch: pause, then resume
                    return
            except ApiException as exc:
                self._log.warning("watch failed; relisting", extra={"error": str(exc.status)})
                relist = True
                if self._stop.wait(1.0):
                    return
            except Exception as exc:  # network errors: back off and resume
                self._log.warning("watch interrupted", extra={"error": repr(exc)})
                if self._stop.wait(1.0):
                    return

    def stop(self) -> None:
        """Stop the watches and the event worker."""
        self._stop.set()
        if self._poster is not None:
            self._poster.close()  # idle sockets only: a later write opens a new one
        if self._background_events:
            with contextlib.suppress(queue.Full):
                self._events.put_nowait(None)

    # ---- writes ----------------------------------------------------------------------
    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as plain JSON, or None on 404."""
        try:
            return _json(self.api.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str]) -> bool:
        """Create the binding with the UID precondition and the annotations (one round trip);
        confirmation arrives through the pod watch, so this returns False."""
        if not pod.uid:
            # without a UID the API server cannot tell a recreated pod from this one
            raise ValueError(f"bind of {pod.key} needs the pod UID")
        if self._signer is not None:
            annotations = self._signer.sign(pod.uid, node, annotations)
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                             "annotations": dict(annotations)},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            if self._poster is not None:
                self._poster.post(f"/api/v1/namespaces/{quote(pod.namespace, safe='')}/pods/"
                                  f"{quote(pod.name, safe='')}/binding",
                                  json.dumps(body).encode())
                return False
            # _preload_content=False: the answer is a Status nobody reads (and the client
            # cannot deserialise it as a Binding, kubernetes-client/python#825).
            _drain(self.api.create_namespaced_pod_binding(pod.name, pod.namespace, body,
                                                          _preload_content=False))
        except ApiException as exc:
            if exc.status is not None and 400 <= exc.status < 500:
                raise SourceError(api_error(exc)) from None  # refused: nothing was applied
            raise BindOutcomeUnknown(api_error(exc)) from None
        except Exception as exc:  # timeouts, lost connections: it may have been applied
            raise BindOutcomeUnknown(f"no answer from the API server ({exc!r})") from None
        return False

    def record_event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        """Queue an Event on the pod (dropped, with a log line, when the queue is full)."""
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": pod.name,
                               "namespace": pod.namespace, "uid": pod.uid},
            "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal", "source": {"component": COMPONENT},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": COMPONENT}
        try:
            self._events.put_nowait(event)
        except queue.Full:
            self._log.warning("event queue full; event dropped", extra={"pod": pod.key})

    def drain_events(self) -> int:
        """Post every queued event now, identical ones as one with a count; returns the posts.

        The worker's body (tests call it directly).
        """
        batch = []
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            if event is None:
                break
            batch.append(event)
        return self._post_batch(batch)

    def _post_batch(self, batch: list[dict[str, Any]]) -> int:
        # Like client-go's event correlator: repeats of one event (a bind failing the same
        # way again) become one Event whose count says how often, not one object each.
        merged: dict[tuple[str, ...], dict[str, Any]] = {}
        for event in batch:
            key = _event_key(event)
            first = merged.get(key)
            if first is None:
                merged[key] = event
            else:
                first["count"] += event["count"]
                first["lastTimestamp"] = event["lastTimestamp"]
        for event in merged.values():
            self._post(event)
        return len(merged)

    def _post(self, event: dict[str, Any]) -> None:
        namespace = event["metadata"]["namespace"]
        try:
            if self._poster is not None:
                self._poster.post(f"/api/v1/namespaces/{quote(namespace, safe='')}/events",
                                  json.dumps(event).encode())
            else:
                _drain(self.api.create_namespaced_event(namespace, event,
                                                        _preload_content=False))
        except ApiException as exc:
            self._log.warning("event not posted", extra={"error": str(exc.status)})
        except Exception as exc:  # network errors: the event is lost, the worker lives on
            self._log.warning("event not posted", extra={"error": repr(exc)})

    def _event_worker(self) -> None:
        while True:
            event = self._events.get()
            if event is None or self._stop.is_set():
                return
            # Whatever queued up meanwhile goes in the same batch (merged when identical).
            batch, stop = [event], False
            while not stop:
                try:
                    more = self._events.get_nowait()
                except queue.Empty:
                    break
                stop = more is None
                if more is not None:
                    batch.append(more)
            self._post_batch(batch)
            if stop:
                return


def _event_key(event: Mapping[str, Any]) -> tuple[str, ...]:
    """What makes two events the same (client-go aggregates on these too)."""
    obj = event["involvedObject"]
    return (obj["namespace"], obj["name"], obj["uid"], event["type"], event["reason"],
            event["message"])
