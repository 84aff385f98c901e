"""A fake Kubernetes API server on loopback: the part of core/v1 an extender uses.

It speaks real HTTP/1.1 (keep-alive, chunked watch streams), so the official
``kubernetes`` client runs unchanged against it: list and watch of nodes and pods
(``spec.nodeName`` field selectors), GET pod, PATCH pod metadata (a ``metadata.uid``
that differs from the pod's is a 409, as on the real server), ConfigMaps (a PUT naming
a stale ``resourceVersion`` is a 409 Conflict), TokenReviews (``tokens`` maps each
valid token to its user), POST ``pods/{name}/binding``, POST events, and the pod
status, PodDisruptionBudgets and Eviction API of ``lab/fakes/kube_policy.py``. The binding
behaves like the API
server's ``BindingREST``: the Binding's ``metadata.uid`` is a precondition (409 when
the pod was recreated), its annotations are copied onto the pod in the same
update, and a pod that already has a node is a 409.

Every request is recorded as a :class:`Recorded` (method, path, query, body), so
tests can assert how many round trips a verb made and what it carried.

Faults are injected per request with :meth:`FakeKubeApi.inject`: an HTTP error
code answered instead of the verb (nothing applied), or the verb applied and its
answer lost (``"lost"``: the connection is closed unanswered; ``"stall"``: closed
after a pause, as a client timeout sees it). ``faults_injected`` counts them by kind.

``write_latency_s`` (0 by default: answered at once) makes every write (any verb but
GET) wait that long before it is applied and answered, as a real API server waits for
etcd's commit; concurrent writes wait side by side. See :data:`REAL_WRITE_LATENCY_S`.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

from lab.fakes.kube_http import QuietServer, handler
from lab.fakes.kube_policy import ApiError, PolicyMixin, _selector_matches, status

WATCH_POLL_SECONDS = 0.2
"""How often an idle watch checks whether the server is stopping."""

REAL_WRITE_LATENCY_S = 0.005
"""A write's wait on a real API server (the benchmarks' realistic setting). etcd's
performance guide (etcd.io/docs/v3.6/op-guide/performance/) puts the least time of one
write at the members' round trip (up to several hundred microseconds in a datacenter) plus
the disk's fdatasync (often under 1 ms on SSD, about 10 ms on a spinning disk); its v2.1
benchmark measured a single client's writes at a 90th percentile of 20-21 ms on GCE local
SSDs. The API server adds admission, conversion and the read of a guaranteed update: 5 ms
is a well-provisioned SSD cluster's figure, not a pessimistic one."""


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it."""

    method: str
    path: str
    query: Mapping[str, str]
    body: Any


@dataclass
class Fault:
    """One injected fault: requests matching ``method`` and ``path`` (a regex searched in the
    path with its query) get ``kind`` (an HTTP code, ``"lost"`` or ``"stall"``) ``times``
    more times."""

    method: str
    path: str
    kind: int | str
    times: int = 1
    stall_seconds: float = 0.5


class FakeKubeApi(PolicyMixin):
    """Nodes, pods and their change history behind a threaded HTTP server."""

    def __init__(self, nodes: Iterable[Mapping[str, Any]] = (),
                 pods: Iterable[Mapping[str, Any]] = (), record: bool = True,
                 write_latency_s: float = 0.0):
        self._cond = threading.Condition()
        self._rv = 0
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.pdbs: dict[tuple[str, str], dict[str, Any]] = {}
        self.tokens: dict[str, dict[str, Any]] = {}
        """Bearer token -> the ``status.user`` a TokenReview answers for it (with the
        ``audiences`` it is valid for under the key ``audiences``)."""
        self.requests: list[Recorded] = []
        self.record = record
        self.write_latency_s = write_latency_s
        self.faults: list[Fault] = []
        self.faults_injected: Counter[str] = Counter()
        # (resourceVersion, "nodes"|"pods", one watch event line): watches replay from here
        self._history: list[tuple[int, str, dict[str, Any], bytes]] = []
        self._oldest = 0  # watches from an older resourceVersion get 410 Gone
        self._stopping = False
        self._watch_epoch = 0  # drop_watches() ends the streams opened before it
        self._server: ThreadingHTTPServer | None = None
        for node in nodes:
            self.put_node(node)
        for pod in pods:
            self.put_pod(pod)

    # ---- store -----------------------------------------------------------------------
    def _commit(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        # Caller holds self._cond: bump the version, keep the event for watches, wake them.
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        line = json.dumps({"type": event, "object": obj}).encode() + b"\n"
        self._history.append((self._rv, kind, obj, line))
        self._cond.notify_all()

    def put_node(self, node: Mapping[str, Any]) -> None:
        """Create or replace a node."""
        obj = copy.deepcopy(dict(node))
        with self._cond:
            name = obj["metadata"]["name"]
            event = "MODIFIED" if name in self.nodes else "ADDED"
            self.nodes[name] = obj
            self._commit("nodes", event, obj)

    def put_pod(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a pod (a missing uid gets a fresh one); returns the stored pod."""
        obj = copy.deepcopy(dict(pod))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        with self._cond:
            key = (meta["namespace"], meta["name"])
            event = "MODIFIED" if key in self.pods else "ADDED"
            self.pods[key] = obj
            self._commit("pods", event, obj)
            return copy.deepcopy(obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (its watchers get DELETED)."""
        with self._cond:
            obj = self.pods.pop((namespace, name))
            self._commit("pods", "DELETED", copy.deepcopy(obj))

    def compact(self) -> None:
        """Forget the change history, as etcd compaction does: older watches get 410 Gone."""
        with self._cond:
            self._history.clear()
            self._oldest = self._rv

    def drop_watches(self) -> None:
        """End every open watch stream, as an API server restart does: with :meth:`compact`
        first, the clients' resumed watches get 410 Gone and relist."""
        with self._cond:
            self._watch_epoch += 1
            self._cond.notify_all()

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """A copy of the stored pod (KeyError when absent)."""
        with self._cond:
            return copy.deepcopy(self.pods[(namespace, name)])

    def inject(self, method: str, path: str, kind: int | str, times: int = 1,
               stall_seconds: float = 0.5) -> Fault:
        """Make the next ``times`` matching requests fail with ``kind`` (see the module doc)."""
        if not (isinstance(kind, int) or kind in ("lost", "stall")):
            raise ValueError(f"fault kind {kind!r}: an HTTP code, 'lost' or 'stall'")
        fault = Fault(method, path, kind, times, stall_seconds)
        with self._cond:
            self.faults.append(fault)
        return fault

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._cond:
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and re.search(fault.path, path):
                    fault.times -= 1
                    self.faults_injected[str(fault.kind)] += 1
                    return fault
        return None

    # ---- verbs -----------------------------------------------------------------------
    def _stored_pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        return pod

    def _check_uid(self, pod: Mapping[str, Any], uid: str | None) -> None:
        actual = pod["metadata"].get("uid")
        if uid and uid != actual:
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, "
                                            f"UID in object meta: {actual}")

    def patch_pod(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """Merge ``metadata.annotations``/``labels`` (None deletes a key)."""
        if not isinstance(body, dict):
            raise ApiError(415, "UnsupportedMediaType", "only merge patches are supported")
        meta = body.get("metadata") or {}
        with self._cond:
            pod = copy.deepcopy(self._stored_pod(namespace, name))
            self._check_uid(pod, meta.get("uid"))
            for field in ("annotations", "labels"):
                merged = pod["metadata"].setdefault(field, {})
                for key, value in (meta.get(field) or {}).items():
                    if value is None:
                        merged.pop(key, None)
                    else:
                        merged[key] = str(value)
            self.pods[(namespace, name)] = pod
            self._commit("pods", "MODIFIED", pod)
            return copy.deepcopy(pod)

    def bind_pod(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """Assign the pod to ``target.name`` with the Binding's UID precondition and annotations."""
        if not isinstance(body, dict) or not (body.get("target") or {}).get("name"):
            raise ApiError(400, "BadRequest", "binding needs target.name")
        meta = body.get("metadata") or {}
        with self._cond:
            pod = copy.deepcopy(self._stored_pod(namespace, name))
            self._check_uid(pod, meta.get("uid"))
            spec = pod.setdefault("spec", {})
            if spec.get("nodeName"):
                raise ApiError(409, "Conflict", f"pod {name} is already assigned to node "
                                                f'"{spec["nodeName"]}"')
            spec["nodeName"] = body["target"]["name"]
            annotations = pod["metadata"].setdefault("annotations", {})
            annotations.update({k: str(v) for k, v in (meta.get("annotations") or {}).items()})
            self.pods[(namespace, name)] = pod
            self._commit("pods", "MODIFIED", pod)
        return status(201)

    def post_event(self, namespace: str, body: Any) -> dict[str, Any]:
        """Store an Event (``generateName`` gets a suffix) and echo it."""
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "event body must be an object")
        event = copy.deepcopy(body)
        meta = event.setdefault("metadata", {})
        meta.setdefault("namespace", namespace)
        if "name" not in meta:
            meta["name"] = f"{meta.get('generateName', 'event.')}{uuid.uuid4().hex[:10]}"
        with self._cond:
            self.events.append(event)
        return event

    def configmap(self, method: str, namespace: str, name: str | None, body: Any,
                  selector: str = "") -> tuple[int, dict[str, Any]]:
        """GET (one, or a list by ``a=b`` label), POST (create; 409 if it exists) and PUT
        (replace; 404 if absent, 409 unless ``metadata.resourceVersion`` is the stored one)."""
        with self._cond:
            if method == "GET" and not name:
                label, _, value = selector.partition("=")
                items = [copy.deepcopy(cm) for (ns, _), cm in sorted(self.configmaps.items())
                         if ns == namespace and (not label or (
                             (cm.get("metadata") or {}).get("labels") or {}).get(label) == value)]
                return 200, {"kind": "ConfigMapList", "apiVersion": "v1", "items": items}
            if method == "POST" and isinstance(body, dict):
                name = str((body.get("metadata") or {}).get("name", ""))
                if (namespace, name) in self.configmaps:
                    raise ApiError(409, "AlreadyExists", f"configmaps {name} already exists")
            key = (namespace, name or "")
            if method == "GET":
                if key not in self.configmaps:
                    raise ApiError(404, "NotFound", f"configmaps {name} not found")
                return 200, copy.deepcopy(self.configmaps[key])
            if method not in ("POST", "PUT") or not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "configmap body must be an object")
            if method == "PUT" and key not in self.configmaps:
                raise ApiError(404, "NotFound", f"configmaps {name} not found")
            given = (body.get("metadata") or {}).get("resourceVersion")
            if method == "PUT" and given not in (None, self.configmaps[key]["metadata"].get(
                    "resourceVersion")):
                raise ApiError(409, "Conflict", f'configmaps "{name}": the object was modified')
            stored = copy.deepcopy(body)
            self._rv += 1
            stored.setdefault("metadata", {}).update(namespace=namespace,
                                                     resourceVersion=str(self._rv))
            self.configmaps[key] = stored
            return (201 if method == "POST" else 200), copy.deepcopy(stored)

    def token_review(self, body: Any) -> dict[str, Any]:
        """A TokenReview's answer: authenticated with the user of a known token whose
        audiences include the one asked for, else not authenticated."""
        spec = (body or {}).get("spec") or {} if isinstance(body, dict) else {}
        known = self.tokens.get(str(spec.get("token", "")))
        wanted = spec.get("audiences") or []
        ok = known is not None and all(a in known.get("audiences", []) for a in wanted)
        status_: dict[str, Any] = {"authenticated": ok}
        if ok and known is not None:
            status_["user"] = {k: v for k, v in known.items() if k != "audiences"}
            status_["audiences"] = wanted
        return {**body, "status": status_}

    def list_objects(self, kind: str, selector: str) -> dict[str, Any]:
        """A NodeList or PodList at the current resourceVersion."""
        with self._cond:
            store = self.nodes.values() if kind == "nodes" else self.pods.values()
            items = [o for o in store if kind == "nodes" or _selector_matches(o, selector)]
            body = {"kind": "NodeList" if kind == "nodes" else "PodList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self._rv)}, "items": items}
            return json.loads(json.dumps(body))  # a snapshot, not the live objects

    def watch_lines(self, kind: str, selector: str, since: int, timeout: float,
                    ) -> Iterable[bytes]:
        """Watch event lines after resourceVersion ``since`` until ``timeout`` or stop."""
        deadline = time.monotonic() + timeout
        if since < self._oldest:
            gone = status(410, "Expired", f"too old resource version: {since} ({self._oldest})")
            yield json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n"
            return
        position = bisect.bisect_right(self._history, since, key=lambda h: h[0])
        epoch = self._watch_epoch
        while True:
            with self._cond:
                while position >= len(self._history) and not self._stopping:
                    if epoch != self._watch_epoch:
                        return
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._cond.wait(min(left, WATCH_POLL_SECONDS))
                if self._stopping:
                    return
                batch = self._history[position:]
                position = len(self._history)
            for _, k, obj, line in batch:
                if k == kind and (kind == "nodes" or _selector_matches(obj, selector)):
                    yield line

    def record_request(self, method: str, path: str, query: Mapping[str, str],
                       body: Any) -> None:
        """Keep the request as a :class:`Recorded` (when ``record``)."""
        if self.record:
            self.requests.append(Recorded(method, path, query, body))

    # ---- server ----------------------------------------------------------------------
    def start(self, port: int = 0) -> int:
        """Serve on 127.0.0.1 (port 0 picks a free one) in a daemon thread; returns the port."""
        server = QuietServer(("127.0.0.1", port), handler(self))
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.05,), name="fake-kube-api",
                         daemon=True).start()  # a short poll: stop() returns quickly
        return int(server.server_address[1])

    @property
    def connections_accepted(self) -> int:
        """TCP connections clients have opened so far."""
        return self._server.accepted if self._server is not None else 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        """End open watches and stop serving."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
