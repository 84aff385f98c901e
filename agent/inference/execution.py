"""Running what the loop decided, and answering the requests it touched.

A batch runs the whole model for one SLO session; a segment runs one piece of a
best-effort job (charged its measured time); a probe runs one measurement of a
registration. Results go to a post-processing pool so the loop moves on at once.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from agent.inference.admission import LatencyMargin
from agent.inference.batch_formation import Request
from agent.inference.clock import Clock
from agent.inference.errors import DropReason
from agent.inference.executors import Executor
from agent.inference.quanta import QuantaScheduler
from agent.inference.session_state import Action, BestEffortState, RuntimeConfig, SloState
from agent.inference.stats import Outcome


class Execution:
    """The running half of the executor loop (mixed into ``ServingRuntime``)."""

    executor: Executor
    clock: Clock
    config: RuntimeConfig
    quanta: QuantaScheduler
    margin: LatencyMargin
    busy_ms: float
    probe_slices: int
    probe_max_ms: float
    _cv: threading.Condition
    _post: ThreadPoolExecutor | None
    _probes: deque[tuple[Callable[[], Any], float, Future[Any]]]
    _drops: list[tuple[Request, DropReason]]

    def _run_probe(self, action: Action) -> None:
        with self._cv:
            fn, _expected, future = self._probes.popleft()
        start = self.clock.now_ms()
        try:
            future.set_result(fn())
        except BaseException as exc:  # hand any failure back to the registering thread
            future.set_exception(exc)
        took = self.clock.now_ms() - start
        self.busy_ms += took
        self.probe_slices += 1
        self.probe_max_ms = max(self.probe_max_ms, took)

    def _run_batch(self, action: Action) -> None:
        sess: SloState = action.session
        reqs = action.requests
        start = self.clock.now_ms()
        try:
            stacked = np.concatenate([r.tensor for r in reqs], axis=0)
            outputs = self.executor.run_batch(sess.loaded, stacked)
            error = None
        except Exception:  # one bad batch must not stop the GPU loop
            outputs, error = [], DropReason.EXECUTION_FAILED
        finish = self.clock.now_ms()
        elapsed = finish - start
        self.busy_ms += elapsed
        if self.config.learn_latency_margin and error is None:
            self.margin.observe(elapsed, sess.profile.latency_ms(len(reqs)))
        stats = sess.stats
        stats.gpu_time_ms += elapsed
        stats.batch_sizes[len(reqs)] += 1
        results: list[tuple[Request, Outcome]] = []
        for i, req in enumerate(reqs):
            latency = finish - req.arrival_ms
            if error is not None:
                stats.record_drop(error)
                results.append((req, Outcome(None, error, latency)))
                continue
            stats.served += 1
            if req.deadline_ms is not None and finish > req.deadline_ms:
                stats.late += 1
                results.append((req, Outcome(None, DropReason.DEADLINE_MISSED, latency)))
            else:
                stats.good += 1
                results.append((req, Outcome(tuple(o[i : i + 1] for o in outputs), None, latency)))
        self._deliver(results)

    def _run_segment(self, action: Action) -> None:
        be: BestEffortState = action.session
        flight = be.current
        assert flight is not None
        start = self.clock.now_ms()
        try:
            flight.feed = self.executor.run_segment(
                be.loaded, flight.index, flight.feed, action.profiled_ms
            )
            failed = False
        except Exception:  # a failing job is dropped, the loop goes on
            failed = True
        measured = self.clock.now_ms() - start
        self.busy_ms += measured
        be.stats.gpu_time_ms += measured
        if action.profiled_ms > 0 and not failed:
            ratio = measured / action.profiled_ms
            be.cost_scale = 0.8 * be.cost_scale + 0.2 * ratio
        for record in self.quanta.charge(be.job.name, action.profiled_ms, measured):
            be.stats.quanta += 1
            be.stats.quantum_lengths_ms.append(record.measured_ms)
        flight.index += 1
        if failed or flight.index >= len(flight.costs_ms):
            be.current = None
            req = flight.request
            latency = self.clock.now_ms() - req.arrival_ms
            if failed:
                be.stats.record_drop(DropReason.EXECUTION_FAILED)
                self._deliver([(req, Outcome(None, DropReason.EXECUTION_FAILED, latency))])
            else:
                be.stats.served += 1
                be.stats.good += 1
                be.stats.batch_sizes[int(req.tensor.shape[0]) if req.tensor.ndim else 1] += 1
                self._deliver([(req, Outcome(tuple(flight.feed.values()), None, latency))])

    def _deliver(self, results: list[tuple[Request, Outcome]]) -> None:
        """Hand results to the post-processing pool so the GPU loop moves on at once."""
        if self._post is not None:
            try:
                self._post.submit(lambda: [req.on_done(o) for req, o in results])
                return
            except RuntimeError:  # the pool is shut down (after ``stop``): answer inline
                pass
        for req, outcome in results:
            req.on_done(outcome)

    def _flush_drops(self) -> None:
        with self._cv:
            drops, self._drops = self._drops, []
        now = self.clock.now_ms()
        self._deliver([(r, Outcome(None, why, now - r.arrival_ms)) for r, why in drops])
