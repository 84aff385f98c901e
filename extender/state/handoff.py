"""At most one pod per node waiting for its GPU from the device plugin.

The kubelet's ``Allocate`` call names device IDs, not the pod, so tandem's device
plugin (``agent/device_plugin``) can tell which pod is being admitted only when
one pod on the node is waiting for its GPUs. With ``handoff.mode: device-plugin``
the extender keeps it that way: from bind until the kubelet has admitted the pod
(it sets ``status.startTime``; a rejected pod becomes ``Failed``), or until it is
deleted, or ``handoff.timeout_seconds`` pass, the node takes no other tandem pod.
Filter reports such nodes as resolvable (``HandoffPending``), so the scheduler
picks another node or retries a moment later.

Pod events come from the cluster source, which is the only place that sees the
kubelet's status updates; the gate itself is a small thread-safe map.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ADMITTED_PHASES = ("Running", "Succeeded", "Failed")


@dataclass(frozen=True)
class Waiting:
    """The pod a node is handing its GPU to."""

    uid: str
    pod: str
    deadline_seconds: float


def admitted(pod: Mapping[str, Any]) -> bool:
    """True once the kubelet has admitted (or rejected) the pod."""
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    return bool(status.get("startTime")) or status.get("phase") in ADMITTED_PHASES


class HandoffGate:
    """Node -> the pod waiting for its hand-off; expired entries are dropped on read."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: dict[str, Waiting] = {}

    def holder(self, node: str, uid: str = "") -> Waiting | None:
        """The other pod ``node`` is handing a GPU to, or None (``uid`` is the asking pod)."""
        with self._lock:
            entry = self._waiting.get(node)
            if entry is not None and entry.deadline_seconds <= self._clock():
                del self._waiting[node]
                return None
            return entry if entry is not None and entry.uid != uid else None

    def claim(self, node: str, uid: str, pod: str, timeout_seconds: float) -> Waiting | None:
        """Reserve ``node`` for ``uid`` unless another pod holds it; returns that pod.

        Check and reservation are one step: the scheduler binds pods concurrently, and
        two binds that both saw the node free would leave two pods waiting on it.
        """
        with self._lock:
            entry = self._waiting.get(node)
            if entry is not None and entry.uid != uid and entry.deadline_seconds > self._clock():
                return entry
            self._waiting[node] = Waiting(uid, pod, self._clock() + timeout_seconds)
            return None

    def begin(self, node: str, uid: str, pod: str, timeout_seconds: float) -> None:
        """``uid`` was bound to ``node`` and now waits for its GPU."""
        with self._lock:
            self._waiting[node] = Waiting(uid, pod, self._clock() + timeout_seconds)

    def release(self, uid: str) -> None:
        """The pod was admitted, rejected or deleted: its node is free for the next bind."""
        with self._lock:
            for node in [n for n, w in self._waiting.items() if w.uid == uid]:
                del self._waiting[node]

    def observe(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """Feed a pod event from the cluster source."""
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        uid = meta.get("uid")
        if isinstance(uid, str) and uid and (deleted or admitted(pod)):
            self.release(uid)

    def waiting(self) -> dict[str, Waiting]:
        """A copy of every node's waiting pod (for ``/v1/state`` and tests)."""
        with self._lock:
            return dict(self._waiting)
