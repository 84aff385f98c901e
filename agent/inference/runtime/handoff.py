"""Handing work between threads: results to the requests' waiters, probe slices to the loop.

Results go to a post-processing pool so the executor loop moves on at once,
except those whose callback only wakes a waiting thread (``Request.inline``);
requests dropped under the runtime's lock are answered after it is released.
A registration's device calls wait as probe slices until the loop runs them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from agent.inference.errors import DropReason
from agent.inference.runtime.batch_formation import Request
from agent.inference.runtime.stats import Outcome


class Delivery:
    """Answers requests off the executor thread and outside the runtime's lock."""

    def __init__(self, post_workers: int):
        self._post = ThreadPoolExecutor(post_workers, "tandem-post") if post_workers else None
        self._pending: list[tuple[Request, DropReason]] = []
        self._lock = threading.Lock()

    def drop_later(self, drops: list[tuple[Request, DropReason]]) -> None:
        """Answer these at the next ``flush`` (callers hold the runtime's lock now)."""
        if drops:
            with self._lock:
                self._pending.extend(drops)

    def flush(self, now_ms: float) -> None:
        with self._lock:
            drops, self._pending = self._pending, []
        if drops:
            self.deliver([(r, Outcome(None, why, now_ms - r.arrival_ms)) for r, why in drops])

    def deliver(self, results: list[tuple[Request, Outcome]]) -> None:
        """Hand results to the post-processing pool so the GPU loop moves on at once."""
        if not results:
            return
        waiters = [(req, o) for req, o in results if req.inline]
        if waiters:
            for req, outcome in waiters:
                req.on_done(outcome)
            results = [(req, o) for req, o in results if not req.inline]
            if not results:
                return
        if self._post is not None:
            try:
                self._post.submit(lambda: [req.on_done(o) for req, o in results])
                return
            except RuntimeError:  # the pool is shut down (after ``stop``): answer inline
                pass
        for req, outcome in results:
            req.on_done(outcome)

    def shutdown(self) -> None:
        if self._post is not None:
            self._post.shutdown(wait=True)


class ProbeQueue:
    """A registration's device calls waiting for the loop (called under the runtime's lock)."""

    def __init__(self) -> None:
        self._waiting: deque[tuple[Callable[[], Any], float, Future[Any]]] = deque()

    def put(self, fn: Callable[[], Any], expected_ms: float) -> Future[Any]:
        future: Future[Any] = Future()
        self._waiting.append((fn, expected_ms, future))
        return future

    def head_ms(self) -> float | None:
        """The first waiting slice's expected length; None when none waits."""
        return self._waiting[0][1] if self._waiting else None

    def take(self) -> tuple[Callable[[], Any], Future[Any]]:
        fn, _expected, future = self._waiting.popleft()
        return fn, future

    def take_all(self) -> list[Future[Any]]:
        futures = [f for _fn, _e, f in self._waiting]
        self._waiting.clear()
        return futures
