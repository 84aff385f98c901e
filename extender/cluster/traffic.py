"""Binds first: events wait while bindings are in flight to the API server.

kube-scheduler binds concurrently (a burst of pods, one goroutine each). Every
bind also queues a pod event; posted at once, the events double the API
server's writes during the burst and the binds wait behind them. The event
worker therefore waits until no binding is in flight (at most ``max_wait``, so
a steady stream of binds never starves events), then posts what gathered.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class BindTraffic:
    """Counts bindings in flight; lets the event worker wait for a pause."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._in_flight = 0

    @contextlib.contextmanager
    def binding(self) -> Iterator[None]:
        """Around one binding's API call."""
        with self._cond:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                if not self._in_flight:
                    self._cond.notify_all()

    def wait_idle(self, max_wait: float) -> bool:
        """Wait until no binding is in flight, at most ``max_wait`` s; True when idle."""
        deadline = time.monotonic() + max_wait
        with self._cond:
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
