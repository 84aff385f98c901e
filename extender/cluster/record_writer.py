"""Placement records written off the scheduler's bind path, batched per node.

Bind creates the Binding (one API round trip the scheduler waits for) and hands
the decision's record entry to :class:`RecordWriter`, which writes it into the
node's record (:mod:`extender.cluster.records`) in the background, after a pause
in binding (:mod:`extender.cluster.traffic`: a burst's binds do not wait behind
its records): all entries
waiting for one node go out in one PUT, at most one PUT per node is in flight, and
a failed write is retried with backoff until it lands (entries of pods that are
gone meanwhile are dropped by the record's ``keep`` rule, as on every write).

Why this order loses nothing: the Binding carries the decision as signed
annotations (``extender.state.signing``), copied onto the pod in the same update as
``nodeName``. Until the record is written the ledger of this process holds the
decision; if the process dies first, the next rebuild finds a bound pod without a
record whose signature verifies, takes its placement from the annotations and
writes the record back (``KubeSource._observe_bound``). The only loss is a pod whose
owner edits those annotations inside that window *and* the extender dies in it:
the edit breaks the signature, so the pod holds its whole node (the safe side)
until it ends. The reverse order (record first) put two sequential writes on every
bind; a Binding written after the answer is impossible (the scheduler needs its
outcome).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from contracts.logs import get_logger
from extender.cluster.records import PlacementRecords
from extender.cluster.traffic import BindTraffic

WORKERS = 4
"""Nodes whose records are written at once (one PUT in flight per node)."""
DEFER_SECONDS = 1.0
"""Longest a record write waits for a pause in binding (``extender.cluster.traffic``)."""
RETRY_SECONDS = (0.2, 10.0)
"""First and longest pause before a failed node's record is written again."""
STOP_SECONDS = 5.0
"""Longest :meth:`RecordWriter.stop` waits for a write already sent, after its flush: both
fit the 30 s termination grace period with the rest of a shutdown."""


class RecordWriter:
    """Queued record entries per node, written by a few background threads."""

    def __init__(self, records: PlacementRecords, workers: int = WORKERS,
                 clock: Callable[[], float] = time.monotonic,
                 traffic: BindTraffic | None = None):
        self.records = records
        self._traffic = traffic
        """Bindings in flight: a write waits for a pause in them (binds first)."""
        self._workers = workers
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: dict[str, dict[str, tuple[str, Callable[[str], bool]]]] = {}
        """node -> uid -> (entry, keep): waiting for the node's next PUT."""
        self._in_flight: set[str] = set()
        self._retry_at: dict[str, tuple[float, float]] = {}
        """node -> (when it may be written again, the pause after that)."""
        self._threads: list[threading.Thread] = []
        self._generation = 0
        """Bumped by stop: workers of an older generation take no more writes and end."""
        self.written = 0
        """Entries written so far (tests and benchmarks)."""
        self._log = get_logger()

    def submit(self, node: str, uid: str, entry: str, keep: Callable[[str], bool]) -> None:
        """Queue ``uid``'s entry for ``node``'s record (never blocks on the API)."""
        with self._cond:
            self._pending.setdefault(node, {})[uid] = (entry, keep)
            if not self._threads:
                self._start()
            self._cond.notify()

    def _start(self) -> None:
        for i in range(self._workers):
            thread = threading.Thread(target=self._run, args=(self._generation,),
                                      name=f"tandem-records-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def pending(self) -> int:
        """Entries queued, plus one per node whose PUT is in flight (0: all written)."""
        with self._cond:
            return sum(len(v) for v in self._pending.values()) + len(self._in_flight)

    def flush(self, timeout_seconds: float) -> bool:
        """Wait until every queued entry is written; False if some are not by then."""
        deadline = self._clock() + timeout_seconds
        with self._cond:
            if self._pending and not self._threads:
                self._start()  # entries left by an earlier stop
            while self._pending or self._in_flight:
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._retry_at.clear()  # a shutdown does not wait out a backoff
                self._cond.notify_all()
                self._cond.wait(min(left, 0.05))
        return True

    def stop(self, timeout_seconds: float = 5.0) -> None:
        """Write what is queued (up to ``timeout_seconds``), then end the threads (a later
        :meth:`submit` starts new ones). Once it returns, nothing more is sent: no worker
        takes another write, and one already sent has been answered (what is still queued
        stays queued, as in a process that died)."""
        written = self.flush(timeout_seconds)
        with self._cond:
            left = sum(len(v) for v in self._pending.values())
            self._generation += 1  # a worker slow to see it must not write after we return
            self._cond.notify_all()
            threads, self._threads = self._threads, []
            deadline = self._clock() + STOP_SECONDS
            while self._in_flight and self._clock() < deadline:
                self._cond.wait(0.05)
        joined_by = time.monotonic() + 1.0  # one second for all: a hung write keeps its own
        for thread in threads:
            thread.join(timeout=max(0.0, joined_by - time.monotonic()))
        if not written:
            self._log.warning("placement records not written before stopping; a restart "
                              "takes those pods from their signed annotations",
                              extra={"entries": left})

    def _next(self) -> str | None:
        """A node to write now (pending, not in flight, not backing off); None: wait."""
        now = self._clock()
        for node in self._pending:
            if node not in self._in_flight and self._retry_at.get(node, (0.0, 0.0))[0] <= now:
                return node
        return None

    def _run(self, generation: int) -> None:
        while True:
            with self._cond:
                node = self._next()
                while node is None:
                    if generation != self._generation:
                        return
                    waits = [at for n, (at, _) in self._retry_at.items()
                             if n in self._pending and n not in self._in_flight]
                    self._cond.wait(max(0.0, min(waits) - self._clock()) if waits else None)
                    node = self._next()
            if self._traffic is not None:
                self._traffic.wait_idle(DEFER_SECONDS)  # binds first; more entries gather
            with self._cond:
                if generation != self._generation:
                    return  # stopped meanwhile: the batch stays queued
                node = self._next()  # another worker may have taken it meanwhile
                if node is None:
                    continue
                batch = self._pending.pop(node)
                self._in_flight.add(node)
            self._write(node, batch)

    def _write(self, node: str, batch: dict[str, tuple[str, Callable[[str], bool]]]) -> None:
        try:
            self.records.write_batch(node, {u: e for u, (e, _) in batch.items()},
                                     [k for _, k in batch.values()])
        except Exception as exc:  # noqa: BLE001 - any failure: keep the entries, retry
            with self._cond:
                waiting = self._pending.setdefault(node, {})
                for uid, item in batch.items():
                    waiting.setdefault(uid, item)  # a newer entry for the pod wins
                pause = self._retry_at.get(node, (0.0, RETRY_SECONDS[0]))[1]
                self._retry_at[node] = (self._clock() + pause, min(2 * pause, RETRY_SECONDS[1]))
            self._log.warning("placement record not written; retrying",
                              extra={"node": node, "entries": len(batch), "error": repr(exc),
                                     "retry_seconds": pause})
        else:
            with self._cond:
                self._retry_at.pop(node, None)
                self.written += len(batch)
        finally:
            with self._cond:
                self._in_flight.discard(node)
                self._cond.notify_all()
