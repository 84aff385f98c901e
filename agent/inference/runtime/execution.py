"""Running what the loop decided, on the executor thread.

A batch runs the whole model for one SLO session; a segment runs one piece of a
best-effort job (charged its measured time); a probe runs one measurement of a
registration. This part owns the device's busy-time counters; it gives back each
finished request's Outcome for the hand-off to deliver, and changes a session
only through its own methods.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from agent.inference.clock import Clock
from agent.inference.errors import DropReason
from agent.inference.executors.executors import Executor
from agent.inference.quanta import QuantaScheduler
from agent.inference.runtime.admission import LatencyMargin
from agent.inference.runtime.batch_formation import Request
from agent.inference.runtime.session_state import Action, BestEffortState, SloState
from agent.inference.runtime.stats import Outcome

Results = list[tuple[Request, Outcome]]

EXECUTOR_NICE = 5
"""How much lower a CPU executor's thread is scheduled than the request path's (Linux
nice; CFS then gives a contended core's time about 3:1 to the request path)."""


def yield_cpu_to_request_path(executor: Executor) -> int:
    """On the executor's own thread: where it computes on the CPU, lower this thread's
    scheduling priority, so that a batch never starves the HTTP front (a request waiting
    for a core loses its deadline before it reaches the queue); the batches' own
    slowdown is what the learned latency margin then plans with. The nice value now."""
    if getattr(executor, "device", None) != "cpu" or not hasattr(os, "setpriority"):
        return 0
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid)
                       + EXECUTOR_NICE)
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:  # not allowed here (a sandbox): the thread keeps the process's priority
        return 0


class Execution:
    """Runs batches, segments and probe slices on the executor."""

    def __init__(self, executor: Executor, clock: Clock, margin: LatencyMargin | None):
        self.executor = executor
        self._clock = clock
        self._margin = margin
        """Observed batch times go here when the runtime learns its latency margin."""
        self.busy_ms = 0.0
        self.probe_slices = 0
        self.probe_max_ms = 0.0
        """The longest probe slice run (what registering a model can delay serving by)."""

    def run_probe(self, fn: Callable[[], Any], future: Future[Any]) -> None:
        start = self._clock.now_ms()
        try:
            future.set_result(fn())
        except BaseException as exc:  # hand any failure back to the registering thread
            future.set_exception(exc)
        took = self._clock.now_ms() - start
        self.busy_ms += took
        self.probe_slices += 1
        self.probe_max_ms = max(self.probe_max_ms, took)

    def run_batch(self, action: Action) -> Results:
        sess: SloState = action.session
        reqs = action.requests
        start = self._clock.now_ms()
        try:
            stacked = np.concatenate([r.tensor for r in reqs], axis=0)
            outputs = self.executor.run_batch(sess.loaded, stacked)
            error = None
        except Exception:  # one bad batch must not stop the GPU loop
            outputs, error = [], DropReason.EXECUTION_FAILED
        finish = self._clock.now_ms()
        elapsed = finish - start
        self.busy_ms += elapsed
        if self._margin is not None and error is None:
            self._margin.observe(elapsed, sess.profile.latency_ms(len(reqs)))
        sess.record_batch(reqs, elapsed)
        stats = sess.stats
        results: Results = []
        for i, req in enumerate(reqs):
            latency = finish - req.arrival_ms
            if error is not None:
                stats.record_drop(error)
                results.append((req, Outcome(None, error, latency)))
                continue
            stats.served += 1
            if req.deadline_ms is not None and finish > req.deadline_ms:
                stats.late += 1
                results.append((req, Outcome(tuple(o[i : i + 1] for o in outputs), None,
                                             latency, late=True) if req.late_ok else
                                Outcome(None, DropReason.DEADLINE_MISSED, latency)))
            else:
                stats.good += 1
                results.append((req, Outcome(tuple(o[i : i + 1] for o in outputs), None, latency)))
        return results

    def run_segment(self, action: Action, quanta: QuantaScheduler) -> Results:
        be: BestEffortState = action.session
        flight = be.current
        assert flight is not None
        start = self._clock.now_ms()
        feed: dict[str, Any] | None
        try:
            feed = self.executor.run_segment(be.loaded, flight.index, flight.feed,
                                             action.profiled_ms)
        except Exception:  # a failing job is dropped, the loop goes on
            feed = None
        measured = self._clock.now_ms() - start
        self.busy_ms += measured
        for record in quanta.charge(be.job.name, action.profiled_ms, measured):
            be.stats.quanta += 1
            be.stats.quantum_lengths_ms.append(record.measured_ms)
        done = be.segment_ran(feed, action.profiled_ms, measured)
        if done is None:
            return []
        latency = self._clock.now_ms() - done.request.arrival_ms
        if feed is None:
            return [(done.request, Outcome(None, DropReason.EXECUTION_FAILED, latency))]
        return [(done.request, Outcome(tuple(done.feed.values()), None, latency))]
