"""Placement records: what bind decided, kept where pod owners cannot write.

A pod owner can edit every annotation of their pod, so a ledger rebuilt from pod
annotations (restart, relist after a 410) would take their word for which GPUs
the pod holds. Bind therefore writes each decision, right after the Binding and off
the scheduler's path (``extender.cluster.record_writer`` says why that order loses
nothing), into one ConfigMap per node in the extender's own namespace, which only the extender's
service account may write (``manifests/``, ``charts/``): ``tandem-placements-<node>``,
labelled ``tandem.io/placement-record: "true"``, ``data[<pod uid>]`` one JSON entry
(:func:`encode_entry`). A rebuild takes a bound pod's placement from the entry for
its UID on the node it is bound to; the annotations stay a record for people.

Entries of pods that are gone are dropped when the node's record is next written
(``keep``), once they are :data:`KEEP_SECONDS` old (a new leader's pod watch may
not have shown it a pod the old leader bound a moment ago), so a record holds at
most the pods bound to its node plus those that ended since shortly before its
last bind.

kube-scheduler binds concurrently, and on a small cluster several binds of a burst
land on one node: they share its record's writes (:meth:`PlacementRecords.write_batch`
from the background writer; :meth:`PlacementRecords.write` for a caller that waits),
where a lock per node held across each write made them queue behind each other.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from kubernetes.client.rest import ApiException

from extender.core import Placement, SessionSpec, Workload

RECORD_LABEL = "tandem.io/placement-record"
NODE_ANNOTATION = "tandem.io/node"
NAME_PREFIX = "tandem-placements-"
MAX_RECORD_BYTES = 900_000
"""A ConfigMap holds at most 1 MiB; headroom for its metadata."""
MAX_ENTRY_BYTES = 8192
WRITE_ATTEMPTS = 3
KEEP_SECONDS = 600.0
"""Entries younger than this stay even when ``keep`` does not know their pod."""
_VERSION = 1


class RecordError(Exception):
    """The record could not be written (the bind is refused: nothing was applied)."""


def check_entry(entry: str) -> None:
    """RecordError when ``entry`` is too large for a record (bind checks before binding)."""
    if len(entry) > MAX_ENTRY_BYTES:
        raise RecordError(f"placement record entry of {len(entry)} bytes "
                          f"(limit {MAX_ENTRY_BYTES})")


def record_name(node: str) -> str:
    """The ConfigMap holding ``node``'s placements (a hash when the name would be too long)."""
    name = NAME_PREFIX + node
    if len(name) <= 253:
        return name
    return NAME_PREFIX + hashlib.sha256(node.encode()).hexdigest()[:40]


def encode_entry(p: Placement, at: float | None = None) -> str:
    """One placement as the record keeps it (what a rebuild needs, nothing a pod wrote);
    ``at``: when (wall clock, seconds), now by default."""
    session = None if p.session is None else [p.session.model, p.session.slo_ms,
                                              p.session.rate_rps]
    return json.dumps({"v": _VERSION, "at": round(time.time() if at is None else at, 3),
                       "pod": p.pod, "node": p.node,
                       "gpus": list(p.gpu_indices), "uuids": list(p.gpu_uuids),
                       "util": p.util_percent, "mem": p.mem_mib, "workload": p.workload.value,
                       "session": session, "weight": p.weight,
                       "containers": [[c, list(i)] for c, i in p.containers]},
                      separators=(",", ":"))


def decode_entry(uid: str, pod: str, node: str, text: Any,
                 annotations: tuple[tuple[str, str], ...] = ()) -> Placement | None:
    """The placement an entry records for pod ``pod`` (namespace/name) on ``node``, or None
    when the entry is unreadable or names another pod or node."""
    try:
        e = json.loads(text) if isinstance(text, str) and len(text) <= MAX_ENTRY_BYTES else None
        if not isinstance(e, dict) or e.get("v") != _VERSION or e.get("pod") != pod \
                or e.get("node") != node:
            return None
        gpus = tuple(_int(i) for i in e["gpus"])
        uuids = tuple(str(u) for u in e["uuids"])
        util, mem = _number(e["util"]), _number(e["mem"])
        workload = Workload(e["workload"])
        raw = e.get("session")
        session = None if raw is None else SessionSpec(pod, str(raw[0]), _number(raw[1]),
                                                       _number(raw[2]))
        containers = tuple((str(c), tuple(_int(i) for i in ix)) for c, ix in e["containers"])
        weight = _int(e["weight"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    if not gpus or (uuids and len(uuids) != len(gpus)):
        return None
    return Placement(uid, pod, node, gpus, util, mem, workload, session, annotations,
                     weight, uuids, containers)


def _written_at(text: str) -> float:
    """When an entry was written (0 when unreadable: it may go)."""
    try:
        at = json.loads(text).get("at")
    except (ValueError, AttributeError):
        return 0.0
    return float(at) if isinstance(at, int | float) and math.isfinite(at) else 0.0


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ValueError(value)
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(value)
    return float(value)


def _plain(response: Any) -> Any:
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


class _Batch:
    """Entries written together by one PUT; ``done`` once it succeeded or failed (``error``)."""

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}
        self.keeps: list[Callable[[str], bool]] = []
        self.done = False
        self.error: BaseException | None = None


class _NodeQueue:
    """One node's writes: whether a PUT is in flight, and the batch gathering meanwhile."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.writing = False
        self.gathering: _Batch | None = None


class PlacementRecords:
    """The per-node records in one namespace, cached (only the leader writes them).

    Reads and writes of one record go through ``poster`` (``kube_http.LeanPoster``) when
    there is one, else through the official client; the list at start always does."""

    def __init__(self, api: Any, namespace: str, poster: Any = None):
        self.api, self.namespace, self._poster = api, namespace, poster
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[str | None, dict[str, str]]] = {}
        """node -> (resourceVersion, None when the ConfigMap does not exist; its data)."""
        self._queues: dict[str, _NodeQueue] = {}
        """node -> its writes (group commit, :meth:`write`)."""
        self._listed = False
        """After :meth:`load_all`, a node it did not find has no record yet (no read)."""

    def load_all(self) -> None:
        """Read every record (start, relist): the cache then answers without a round trip."""
        body = _plain(self.api.list_namespaced_config_map(
            self.namespace, label_selector=f"{RECORD_LABEL}=true", _preload_content=False))
        nodes: dict[str, tuple[str | None, dict[str, str]]] = {}
        for cm in body.get("items") or []:
            meta = cm.get("metadata") or {}
            node = (meta.get("annotations") or {}).get(NODE_ANNOTATION)
            if isinstance(node, str) and meta.get("name") == record_name(node):
                nodes[node] = (meta.get("resourceVersion"), dict(cm.get("data") or {}))
        with self._lock:
            self._nodes, self._listed = nodes, True

    def entry(self, node: str, uid: str, refresh: bool) -> str | None:
        """``uid``'s entry on ``node``; on a miss, with ``refresh``, the record is read again
        (a pod another replica bound a moment ago)."""
        with self._lock:
            found = self._nodes.get(node, (None, {}))[1].get(uid)
        if found is not None or not refresh:
            return found
        self._fetch(node)  # a write racing it at worst leaves a stale version: a 409, a retry
        with self._lock:
            return self._nodes.get(node, (None, {}))[1].get(uid)

    def _path(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{quote(self.namespace, safe='')}/configmaps" + \
            (f"/{quote(name, safe='')}" if name else "")

    def _fetch(self, node: str) -> tuple[str | None, dict[str, str]]:
        try:
            if self._poster is not None:
                cm = json.loads(self._poster.request("GET", self._path(record_name(node))))
            else:
                cm = _plain(self.api.read_namespaced_config_map(
                    record_name(node), self.namespace, _preload_content=False))
            found = ((cm.get("metadata") or {}).get("resourceVersion"), dict(cm.get("data") or {}))
        except ApiException as exc:
            if exc.status != 404:
                raise
            found = (None, {})
        with self._lock:
            self._nodes[node] = found
        return found

    def write(self, node: str, uid: str, entry: str, keep: Callable[[str], bool]) -> None:
        """Add ``uid``'s entry to ``node``'s record (dropping entries ``keep`` refuses), with
        the record's resourceVersion as precondition; RecordError when it cannot.

        Group commit: while one write of a node's record is in flight, the entries of
        binds arriving for that node gather into one batch, written by the next PUT, so a
        burst of binds on one node waits for at most two PUTs instead of queueing for one
        each. A bind returns only once a PUT holding its entry succeeded, and every bind of
        a batch whose PUT failed is refused."""
        check_entry(entry)
        queue = self._queue(node)
        with queue.cond:
            batch = queue.gathering
            if batch is None:
                batch = queue.gathering = _Batch()
            batch.entries[uid] = entry
            batch.keeps.append(keep)
            while queue.writing and not batch.done:
                queue.cond.wait()
            if not batch.done:  # no write in flight: this bind writes the batch
                queue.writing, queue.gathering = True, None
        if not batch.done:
            try:
                self._commit(node, batch)
            except BaseException as exc:
                batch.error = exc
                raise
            finally:
                with queue.cond:
                    queue.writing, batch.done = False, True
                    queue.cond.notify_all()
        if batch.error is not None:  # another bind wrote this batch, and failed
            raise RecordError(str(batch.error) if isinstance(batch.error, RecordError)
                              else f"placement record of {node} not written "
                                   f"({batch.error!r})")

    def write_batch(self, node: str, entries: Mapping[str, str],
                    keeps: list[Callable[[str], bool]]) -> None:
        """Add ``entries`` (uid -> entry) to ``node``'s record in one write (the background
        writer's: it keeps one write per node in flight itself); RecordError, or the
        API's error, when it cannot."""
        batch = _Batch()
        batch.entries.update(entries)
        batch.keeps.extend(keeps)
        self._commit(node, batch)

    def _queue(self, node: str) -> _NodeQueue:
        with self._lock:
            return self._queues.setdefault(node, _NodeQueue())

    def _commit(self, node: str, batch: _Batch) -> None:
        """One batch in one PUT; on 409 (another writer) or 404 (deleted) read and merge again."""
        for _ in range(WRITE_ATTEMPTS):
            with self._lock:
                cached = self._nodes.get(node) or ((None, {}) if self._listed else None)
            version, data = cached if cached is not None else self._fetch(node)
            young = time.time() - KEEP_SECONDS
            data = {u: t for u, t in data.items() if u not in batch.entries and (
                any(k(u) for k in batch.keeps) or _written_at(t) > young)}
            data.update(batch.entries)
            if sum(len(u) + len(t) for u, t in data.items()) > MAX_RECORD_BYTES:
                raise RecordError(f"the placement record of {node} is full")
            try:
                self._put(node, version, data)
                return
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise RecordError(f"placement record of {node}: HTTP {exc.status} "
                                      f"{exc.reason}") from None
                self._fetch(node)  # another writer, or deleted: read it and retry
            except Exception:
                with self._lock:
                    self._nodes.pop(node, None)  # it may have been applied: read it next
                raise
        raise RecordError(f"placement record of {node}: conflicting writers")

    def _put(self, node: str, version: str | None, data: Mapping[str, str]) -> None:
        meta: dict[str, Any] = {"name": record_name(node), "namespace": self.namespace,
                                "labels": {RECORD_LABEL: "true",
                                           "app.kubernetes.io/managed-by": "tandem"},
                                "annotations": {NODE_ANNOTATION: node}}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data)}
        if version is not None:
            meta["resourceVersion"] = version
        if self._poster is not None:
            stored = json.loads(self._poster.request(
                "POST" if version is None else "PUT",
                self._path("" if version is None else record_name(node)),
                json.dumps(body, separators=(",", ":")).encode()))
        elif version is None:
            stored = _plain(self.api.create_namespaced_config_map(
                self.namespace, body, _preload_content=False))
        else:
            stored = _plain(self.api.replace_namespaced_config_map(
                record_name(node), self.namespace, body, _preload_content=False))
        with self._lock:
            self._nodes[node] = ((stored.get("metadata") or {}).get("resourceVersion"),
                                 dict(data))
