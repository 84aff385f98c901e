"""Kubernetes Events from the ``kube`` source, posted off the bind path.

Events are queued and posted by a background worker so the bind path never waits
on them; identical events queued together go out as one with a count (as
client-go's event correlator does). They go through ``kube_http.LeanPoster`` when
it can speak for the configuration, else through the official client.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import queue
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from kubernetes.client.rest import ApiException

from contracts.logs import get_logger
from extender.cluster.traffic import BindTraffic
from extender.core import PodRef

COMPONENT = "tandem-extender"
EVENT_QUEUE_LIMIT = 1000
Queued = tuple[PodRef, str, str, bool, float]
"""(pod, reason, message, warning, when): an event as queued, built by the worker."""
EVENT_DEFER_SECONDS = 1.0
"""Longest an event batch waits for a pause in binding (``extender.cluster.traffic``)."""


class EventQueue:
    """A bounded queue of Events and the worker that posts them."""

    def __init__(self, api: Any, poster: Any = None, traffic: BindTraffic | None = None):
        self.api, self._poster, self._traffic = api, poster, traffic
        self._events: queue.Queue[Queued | None] = queue.Queue(EVENT_QUEUE_LIMIT)
        self._log = get_logger()

    def record(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        """Queue an Event on the pod (dropped, with a log line, when the queue is full); the
        object is built by the worker, off the caller's path (bind's)."""
        try:
            self._events.put_nowait((pod, reason, message, warning, time.time()))
        except queue.Full:
            self._log.warning("event queue full; event dropped", extra={"pod": pod.key})

    def close(self) -> None:
        """Ask the worker to stop after what is queued."""
        with contextlib.suppress(queue.Full):
            self._events.put_nowait(None)

    def drain(self) -> int:
        """Post every queued event now, identical ones as one with a count; returns the posts."""
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

    def _post_batch(self, batch: list[Queued]) -> int:
        # Repeats of one event (a bind failing the same way again) become one Event whose
        # count says how often, not one object each.
        merged: dict[tuple[str, ...], dict[str, Any]] = {}
        for event in map(_event, batch):
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
                response = self.api.create_namespaced_event(namespace, event,
                                                            _preload_content=False)
                response.drain_conn()
                response.release_conn()
        except ApiException as exc:
            self._log.warning("event not posted", extra={"error": str(exc.status)})
        except Exception as exc:  # network errors: the event is lost, the worker lives on
            self._log.warning("event not posted", extra={"error": repr(exc)})

    def run(self) -> None:
        """The worker: post events as they come, until :meth:`close`."""
        while True:
            event = self._events.get()
            if event is None:
                return
            if self._traffic is not None:  # binds first (extender.cluster.traffic)
                self._traffic.wait_idle(EVENT_DEFER_SECONDS)
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


def _event(queued: Queued) -> dict[str, Any]:
    """The Event object of a queued event."""
    pod, reason, message, warning, at = queued
    now = dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds") \
        .replace("+00:00", "Z")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": pod.name,
                           "namespace": pod.namespace, "uid": pod.uid},
        "reason": reason, "message": message[:1024],
        "type": "Warning" if warning else "Normal", "source": {"component": COMPONENT},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "reportingComponent": COMPONENT}


def _event_key(event: Mapping[str, Any]) -> tuple[str, ...]:
    """What makes two events the same (client-go aggregates on these too)."""
    obj = event["involvedObject"]
    return (obj["namespace"], obj["name"], obj["uid"], event["type"], event["reason"],
            event["message"])
