"""Remote model references fetched in the background, never on a caller's thread.

A scheduling request that names ``https://host/m.onnx`` must not wait on that
host: anyone who can create a pod picks the host, and one that accepts and never
answers would hold the request (and, with a few pods, every server thread). So
:class:`BackgroundFetcher` downloads on a small pool of its own threads, through
the store (size cap, per-read timeout) plus a total deadline, and callers get
:class:`ModelBeingFetched` at once until the file is in the store's cache. A
failed fetch is remembered for ``retry_after_seconds`` so a bad host is not
asked again on every request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from predictor.errors import ModelUnavailable, PredictorError
from predictor.store import ModelStore

MAX_CONCURRENT_FETCHES = 2
MAX_PENDING_FETCHES = 32
RETRY_AFTER_SECONDS = 60.0


class ModelBeingFetched(ModelUnavailable):
    """The referenced model is being downloaded; ask again later."""


class BackgroundFetcher:
    """Bounded background downloads of remote model references into the store's cache."""

    def __init__(self, store: ModelStore, workers: int = MAX_CONCURRENT_FETCHES,
                 max_pending: int = MAX_PENDING_FETCHES,
                 retry_after_seconds: float = RETRY_AFTER_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tandem-fetch")
        self._max_pending = max_pending
        self._retry_after = retry_after_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._failed: dict[str, tuple[float, str]] = {}

    def resolve(self, ref: str) -> Path:
        """The local file of ``ref`` if it is local or already fetched; otherwise start a
        fetch (once) and raise ModelBeingFetched, or ModelUnavailable if it failed lately."""
        if not self.store.is_remote(ref):
            return self.store.resolve(ref)
        self.store.check_remote(ref)  # refused schemes fail at once, nothing is queued
        cached = self.store.cached(ref)
        if cached is not None:
            return cached
        with self._lock:
            failure = self._failed.get(ref)
            if failure is not None:
                if self._clock() < failure[0] + self._retry_after:
                    raise ModelUnavailable(f"{ref}: fetch failed: {failure[1]}")
                del self._failed[ref]
            if ref not in self._pending:
                if len(self._pending) >= self._max_pending:
                    raise ModelUnavailable(f"{ref}: too many model fetches in progress")
                self._pending.add(ref)
                self._pool.submit(self._fetch, ref)
        raise ModelBeingFetched(f"{ref}: model being fetched")

    def _fetch(self, ref: str) -> None:
        try:
            self.store.resolve(ref)
        except (PredictorError, OSError) as exc:
            with self._lock:
                self._failed[ref] = (self._clock(), str(exc)[:300])
        finally:
            with self._lock:
                self._pending.discard(ref)

    def in_flight(self) -> int:
        """Fetches queued or running."""
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Stop taking fetches (running ones end at their deadline)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
