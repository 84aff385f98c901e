"""Binds first: events, placement records and the pod watch wait while bindings are in flight.

kube-scheduler binds concurrently (a burst of pods, one goroutine each). Every
bind also queues a pod event and its node's placement record; written at once,
they triple the API server's writes during the burst (and the extender's own
work beside the binds), and the binds wait behind them. The event worker and the
record writer therefore wait until no binding is in flight and none ended in the
last ``QUIET_SECONDS`` (a burst's binds arrive a few milliseconds apart), at most
``max_wait`` so a steady stream of binds never starves them, then write what
gathered. The pod watch waits too: each Binding causes a pod event, and decoding
and applying it during the burst takes the interpreter from the binds still
running; the events queue on the watch's connection and are applied after, at
most ``WATCH_LAG_SECONDS`` late (:meth:`BindTraffic.pace_watch`).
"""

from __future__ import annotations

import threading
import time

WATCH_LAG_SECONDS = 0.05
"""Longest the pod watch waits for the bindings in flight before it reads on (then it reads
for as long again without waiting: under a steady stream of binds it keeps up)."""
QUIET_SECONDS = 0.02
"""How long after the last binding ended the writers still wait (the burst's next bind)."""


class BindTraffic:
    """Counts bindings in flight; lets the event worker wait for a pause."""

    def __init__(self) -> None:
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        """Waiters for the bindings in flight to end (notified when none is left)."""
        self._calm = threading.Condition(lock)
        """Waiters for the quiet time after the last one (timed only: a binding that ends
        meanwhile does not wake them, each wakes once per quiet time at most)."""
        self._in_flight = 0
        self._last_end = float("-inf")
        self._watch_free_until = float("-inf")
        """Until when the pod watch reads on without waiting (it waited its whole lag)."""

    def binding(self) -> BindTraffic:
        """Around one binding's API call (``with traffic.binding(): ...``)."""
        return self

    def __enter__(self) -> None:
        with self._cond:
            self._in_flight += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._in_flight -= 1
            self._last_end = time.monotonic()
            if not self._in_flight:
                self._cond.notify_all()

    def wait_idle(self, max_wait: float, quiet: float = QUIET_SECONDS) -> bool:
        """Wait until no binding is in flight and none ended in the last ``quiet`` s, at most
        ``max_wait`` s; True when idle."""
        deadline = time.monotonic() + max_wait
        with self._cond:
            while True:
                now = time.monotonic()
                calm = 0.0 if self._in_flight else self._last_end + quiet - now
                if not self._in_flight and calm <= 0:
                    return True
                if now >= deadline:
                    return False
                if calm > 0:
                    self._calm.wait(min(deadline - now, calm))
                else:
                    self._cond.wait(deadline - now)

    def pace_watch(self, lag: float = WATCH_LAG_SECONDS) -> None:
        """Before the pod watch reads its next event: wait while bindings are in flight, at
        most ``lag`` s; after a wait that ran out, none for the next ``lag`` s (the watch
        catches up). What a binding's event confirms arrives later, never lost: the assumed
        placement holds its GPUs meanwhile."""
        if time.monotonic() >= self._watch_free_until and not self.wait_idle(lag, 0.0):
            self._watch_free_until = time.monotonic() + lag
