"""The ``kube`` cluster source: Kubernetes nodes and pods through the official client.

- Inventory per node from NVIDIA GPU Feature Discovery labels
  (``nvidia.com/gpu.count``, ``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory``
  in MiB per GPU); agent reports override it in ``ClusterState`` because they are
  measured. GFD labels carry no UUIDs, so until a report arrives a GPU's uuid is
  its index, which ``NVIDIA_VISIBLE_DEVICES`` accepts as well.
- Placements are rebuilt on start (list) from the placement records bind wrote
  (:mod:`extender.cluster.records`), one per bound pod the API server lists, then
  kept fresh by watches; a watch that fails or expires (410) relists. A bound pod
  that asks for ``tandem.io/gpu`` with no record holds every GPU of its node.
- Bind creates ``pods/binding`` carrying the pod UID as a precondition (a recreated
  pod of the same name is never bound by mistake) and the signed output
  annotations, which the API server copies onto the pod in the same update as
  ``nodeName``: the one API round trip the scheduler waits for. The decision's
  entry in the node's record is then written in the background
  (``extender.cluster.record_writer``: batched per node; why a crash between the
  two loses nothing). Events are posted by a background worker too; identical
  events queued together go out as one with a count.
- Lists, watches and pod reads go through the official client with
  ``_preload_content=False`` and plain JSON: client models cost more than the rest of
  a bind (profiled), and nothing here needs them. Bindings and events go through
  ``kube_http.LeanPoster``, built from the same configuration: urllib3 and
  ``http.client`` cost more than the API server's own work per binding (profiled).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from contracts.logs import get_logger
from extender.cluster.kube_events import EventQueue
from extender.cluster.kube_http import LeanPoster, api_error, pooled, supports
from extender.cluster.namespace import own_namespace
from extender.cluster.record_writer import RecordWriter
from extender.cluster.records import (
    PlacementRecords,
    RecordError,
    check_entry,
    decode_entry,
    encode_entry,
)
from extender.cluster.source import (
    DONE_PHASES,
    PendingPods,
    host_of,
    observe_host,
    placement_from_pod,
    requests_gpus,
    same_decision,
    untrusted_placement,
)
from extender.cluster.traffic import BindTraffic
from extender.cluster.written import WrittenAnnotations
from extender.core import GpuSpec, NodeSpec, Placement, PodRef
from extender.errors import BindOutcomeUnknown, SourceError

GFD_COUNT = "nvidia.com/gpu.count"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"


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
        return NodeSpec(name, (), host_of(node))
    product = labels.get(GFD_PRODUCT)
    if count <= 0 or memory <= 0 or not product or count > 64:
        return NodeSpec(name, (), host_of(node))
    return NodeSpec(name, tuple(GpuSpec(i, str(i), str(product), memory) for i in range(count)),
                    host_of(node))


class KubeSource:
    """Nodes and pods from the API server; binds through ``pods/binding``."""

    kubelet_admits = True

    def __init__(self, api: client.CoreV1Api,
                 watch_factory: Callable[[], Any] = PlainWatch,
                 watch_timeout_seconds: int = 300, background_events: bool = True,
                 records_namespace: str | None = None):
        self.api = api
        self._state: Any = None
        self._watch_factory = watch_factory
        self._timeout = watch_timeout_seconds
        self._background_events = background_events
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
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
        self._traffic = BindTraffic()
        """Bindings in flight: events, records and the pod watch wait for a pause in them."""
        self._events = EventQueue(api, self._poster, self._traffic)
        self.records = PlacementRecords(api, own_namespace(records_namespace),
                                        self._poster)
        """Where bind records its decisions: the install's namespace, resolved as for
        everything tandem stores (``extender.cluster.namespace``)."""
        self.record_writer = RecordWriter(self.records, traffic=self._traffic)
        """Writes them after the Binding, off the bind path."""
        self._pending = PendingPods()
        """Pods waiting for a node, as the pod watch last delivered them (bind reads here)."""
        self._written = WrittenAnnotations()  # the watch knows bind's writes undecoded

    signs_placements = True

    def use_signer(self, signer: Any, on_untrusted: Callable[[str], None] | None = None,
                   ) -> None:
        """Sign the annotations bind writes (``extender.state.signing``; a pod bound before
        placement records existed is taken from them when they verify);
        ``on_untrusted(problem)`` counts pods whose placement cannot be trusted."""
        self._signer = signer
        self._on_untrusted = on_untrusted

    @classmethod
    def from_environment(cls) -> KubeSource:
        """In-cluster config, else the local kubeconfig (pool sized by ``pooled``)."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(client.CoreV1Api(pooled(client.Configuration.get_default_copy())))

    def _list(self, lister: Callable[..., Any], **kwargs: Any) -> tuple[list[Any], str]:
        body = _json(lister(_preload_content=False, **kwargs))
        return body.get("items") or [], str((body.get("metadata") or {}).get("resourceVersion"))

    # ---- sync and watch --------------------------------------------------------------
    def sync(self, state: Any) -> tuple[str, str]:
        """List nodes and bound pods into ``state``; returns (node, pod) resourceVersions."""
        self._state = state
        nodes, node_rv = self._list(self.api.list_node)
        state.set_nodes([node_spec(n) for n in nodes])
        listed_at = state.now()
        self.records.load_all()  # before the pods: one bound after it is read again
        pods, pod_rv = self._list(self.api.list_pod_for_all_namespaces,
                                  field_selector="spec.nodeName!=")
        bound: set[str] = set()
        for pod in pods:
            state.handoffs.observe(pod)
            observe_host(state, pod)
            uid = self._observe_bound(state, pod)
            if uid is not None:
                bound.add(uid)
        # Pods waiting for a node: bind finds them without a read (the watch keeps them fresh)
        self._pending.reset(self._list(self.api.list_pod_for_all_namespaces,
                                       field_selector="spec.nodeName=")[0])
        # A relist is the truth: pods deleted or finished while no watch ran are released.
        state.hosts.retain({str((p.get("metadata") or {}).get("uid")) for p in pods})
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
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        phase = (pod.get("status") or {}).get("phase")
        state.handoffs.observe(pod, deleted=kind == "DELETED")
        self._pending.observe(pod, kind == "DELETED")
        if kind == "DELETED" or phase in DONE_PHASES:
            state.hosts.gone(uid)
            state.forget(uid)
            self._distrusted.discard(uid)
            self._written.forget(uid)
            return
        observe_host(state, pod)
        self._observe_bound(state, pod)

    def _observe_bound(self, state: Any, pod: Mapping[str, Any]) -> str | None:
        """Confirm a bound pod's placement, trusting only what the extender decided.

        A pod the ledger holds on that node keeps the decision held (a watch event or a
        relist never changes a placement). Else the node's placement record says what
        bind decided; a pod bound before records existed is taken from its annotations if
        their signature verifies; else the record is read again (a pod another replica
        bound a moment ago), and a pod asking for ``tandem.io/gpu`` with no record holds
        every GPU of its node in full. Returns the UID of the pod placed, if any.
        """
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        node = (pod.get("spec") or {}).get("nodeName")
        uid = str(meta.get("uid") or "")
        if not uid or not isinstance(node, str) or not node \
                or (pod.get("status") or {}).get("phase") in DONE_PHASES:
            return None
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        held: Placement | None = state.placement_of(uid)
        if held is not None and held.node == node \
                and self._written.unchanged(uid, node, meta.get("annotations")):
            state.confirm(held)  # exactly what bind sent: it decodes to the decision held
            return uid
        written = placement_from_pod(pod)
        if held is not None and held.node == node:
            # The Binding wrote the annotations in the same update as nodeName, so every
            # bound event of a pod held here carries them: none that parse is an edit too,
            # flagged now rather than at the next rebuild.
            if held.trusted and written is None:
                self._distrust(pod, held, "changed", "has output annotations that no longer "
                               "parse (removed or edited)")
            elif written is not None and held.trusted and not same_decision(held, written):
                self._distrust(pod, held, "changed", "differs from the placement bound")
            state.confirm(held)
            return uid
        ann = written.annotations if written is not None else ()
        recorded = decode_entry(uid, key, node, self.records.entry(node, uid, False), ann)
        if recorded is None and written is not None and self._signer is not None \
                and self._signer.verify(uid, node, meta.get("annotations") or {}):
            # Bound by a process that stopped before writing the record (or by a version
            # that kept none): its signature verifies, so the record is written back.
            recorded = written
            self._record_later(node, uid, encode_entry(written))
        elif recorded is None:
            recorded = decode_entry(uid, key, node, self.records.entry(node, uid, True), ann)
        if recorded is not None and (written is None or not same_decision(written, recorded)):
            self._distrust(pod, recorded, "changed", "differs from the placement bound")
        if recorded is None:
            if not requests_gpus(pod):
                # No tandem GPU to be had (the device plugin hands out only tandem.io/gpu):
                # output annotations alone must not let any pod block a node.
                return None
            recorded = untrusted_placement(uid, key, node, state.node_gpus(node), ann)
            self._distrust(pod, recorded, "unrecorded",
                           "has no placement record tandem wrote at bind (edited, forged, "
                           "or bound without the tandem scheduler)")
        state.confirm(recorded)
        return uid

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
        message = (f"the GPU placement of this pod {problem}; tandem keeps the placement it "
                   "decided, or holds every GPU of the node in full until the pod is gone "
                   "(the tandem device plugin refuses it)")
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
            worker = threading.Thread(target=self._events.run, name="tandem-events",
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
                    plain = event["object"] if isinstance(event["object"], Mapping) \
                        else self.api.api_client.sanitize_for_serialization(event["object"])
                    rv = (plain.get("metadata") or {}).get("resourceVersion", rv)
                    apply(state, event["type"], plain)
                    if apply == self.apply_pod_event:  # a burst's binds before their events
                        self._traffic.pace_watch()
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
        """Write the records still queued (a few seconds at most), then stop the watches
        and the event worker."""
        self.record_writer.stop()
        self._stop.set()
        if self._poster is not None:
            self._poster.close()  # idle sockets only: a later write opens a new one
        if self._background_events:
            self._events.close()

    # ---- writes ----------------------------------------------------------------------
    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as plain JSON, or None on 404 (bind reads it: the lean client if it can)."""
        try:
            if self._poster is not None:
                return json.loads(self._poster.request(
                    "GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/"
                           f"{quote(name, safe='')}"))
            return _json(self.api.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def current_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as the API server has it: the pod watch's copy of a pending pod, else
        read (a pod created before this process started, or not yet seen)."""
        return self._pending.get(namespace, name) or self.read_pod(namespace, name)

    def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str],
             placement: Placement | None = None) -> bool:
        """Create the binding with the UID precondition and the signed annotations, then
        queue the placement for the node's record (written in the background; a pod of no
        GPU has none); confirmation arrives through the pod watch, so this returns False."""
        if not pod.uid:
            # without a UID the API server cannot tell a recreated pod from this one
            raise ValueError(f"bind of {pod.key} needs the pod UID")
        entry = None if placement is None else encode_entry(placement)  # None: a pod of no GPU
        try:
            if entry is not None:
                check_entry(entry)  # a record could never hold it: refuse before binding
        except RecordError as exc:
            raise SourceError(str(exc)) from None
        if self._signer is not None and entry is not None:
            annotations = self._signer.sign(pod.uid, node, annotations)
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                             "annotations": dict(annotations)},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        if placement is not None:  # before: the watch may show the Binding before it returns
            self._written.note(pod.uid, node, placement.annotations, annotations)
        try:
            if self._poster is not None:
                with self._traffic.binding():
                    self._poster.post(f"/api/v1/namespaces/{quote(pod.namespace, safe='')}/"
                                      f"pods/{quote(pod.name, safe='')}/binding",
                                      json.dumps(body).encode())
            else:
                # _preload_content=False: the answer is a Status nobody reads (and the client
                # cannot deserialise it as a Binding, kubernetes-client/python#825).
                _drain(self.api.create_namespaced_pod_binding(pod.name, pod.namespace, body,
                                                              _preload_content=False))
        except ApiException as exc:
            if exc.status is not None and 400 <= exc.status < 500:
                self._written.forget(pod.uid)
                raise SourceError(api_error(exc)) from None  # refused: nothing was applied
            self._record_later(node, pod.uid, entry)  # it may have been applied
            raise BindOutcomeUnknown(api_error(exc)) from None
        except Exception as exc:  # timeouts, lost connections: it may have been applied
            self._record_later(node, pod.uid, entry)
            raise BindOutcomeUnknown(f"no answer from the API server ({exc!r})") from None
        self._record_later(node, pod.uid, entry)
        return False

    def _record_later(self, node: str, uid: str, entry: str | None) -> None:
        """Queue ``uid``'s entry for ``node``'s record (an entry of a pod that turns out
        not bound is harmless: a later write drops it once it is old; None: nothing)."""
        state = self._state
        if entry is None:
            return
        self.record_writer.submit(node, uid, entry, lambda other: other == uid or state is None
                                  or state.is_known(other))

    def record_event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        """Queue an Event on the pod (dropped, with a log line, when the queue is full)."""
        self._events.record(pod, reason, message, warning)

    def drain_events(self) -> int:
        """Post every queued event now (tests call it; the worker does the same)."""
        return self._events.drain()
