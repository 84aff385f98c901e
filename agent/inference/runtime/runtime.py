"""The per-GPU serving runtime: one executor thread, Nexus duty cycles, Olympian quanta.

The runtime composes parts with one job each and holds the one lock they are
called under: the sessions (``registry.py``), admission and removal
(``registration.py``), the plan in force and replanning (``planning.py``), what
the loop runs next (``cycle.py``: the duty cycle, the overrun policy, probe
slices), running it (``execution.py``) and the hand-off of results and probe
slices between threads (``handoff.py``). This module holds request intake, the
loop's thread and the read side; no part writes another's fields.

Only the executor thread touches the device. A registration has its model
checked and cut in a worker process (``prepare.py``), builds its sessions on
its own (HTTP) thread, and hands each measurement run of its profile as
one *probe slice* to the loop (``run_in_slice``), which runs it in the
slack of a cycle ahead of best-effort segments, only where its expected length
fits before the next cycle (or one cycle in N, as segments overrun). A slice is
one atom or segment of the model at a profiled batch size, or one whole run at
batch 1 (at each profiled size for a model with no cut), so an existing session
waits at most one such slice (``probe_max_ms``), never a whole profile. The
duty cycle comes from ``planner.plan_gpu`` (the one implementation) and
is recomputed when sessions change or an EWMA of a session's arrival rate drifts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from agent.inference.clock import Clock
from agent.inference.errors import DropReason, ServerStopping
from agent.inference.executors.executors import Executor
from agent.inference.quanta import QuantaScheduler
from agent.inference.runtime.batch_formation import Request
from agent.inference.runtime.cycle import DutyCycle, LoopView
from agent.inference.runtime.execution import Execution, yield_cpu_to_request_path
from agent.inference.runtime.executor_tail import ExecutorHost
from agent.inference.runtime.handoff import Delivery, ProbeQueue
from agent.inference.runtime.holding import MISSES
from agent.inference.runtime.pathcost import HostLimits, RequestPathCost, RequestPathLimits
from agent.inference.runtime.planning import Planning
from agent.inference.runtime.registration import Parts, Registration
from agent.inference.runtime.registry import SessionRegistry
from agent.inference.runtime.session_state import BestEffortState, RuntimeConfig, SloState
from agent.inference.runtime.stats import Outcome
from planner import GpuPlan
from predictor.batching import BatchingProfile

__all__ = ["RuntimeConfig", "ServingRuntime"]


class ServingRuntime:
    """Sessions, queues and the executor loop of one GPU."""

    def __init__(
        self,
        executor: Executor,
        clock: Clock,
        config: RuntimeConfig,
        profiles: Mapping[str, BatchingProfile] | None = None,
        post_workers: int = 0,
        timer: Callable[[], float] = time.perf_counter,
        path_cost: RequestPathCost | None = None,
        path_limits: RequestPathLimits | HostLimits | None = None,
        executor_probe: Callable[[], ExecutorHost] | None = None,
    ):
        """``path_cost``: the request path's own cost, which admission and the plan
        count (none: requests are submitted in-process); ``path_limits``: what the
        request path may hold (its cores and HTTP workers; ``HostLimits``: measured again
        at each registration); ``executor_probe``: the host as the executor's priority
        finds it, measured at each SLO registration (``executor_tail``)."""
        self.clock = clock
        self.config = config
        self._timer = timer
        self._cv = threading.Condition()
        now = clock.now_ms()
        self.sessions = SessionRegistry(dict(profiles or {}))
        self.path_cost = path_cost or RequestPathCost()
        self.planning = Planning(config, now, self.path_cost)
        self.cycle = DutyCycle(config, now)
        self.quanta = QuantaScheduler(config.quantum_ms or config.min_quantum_ms)
        self.execution = Execution(
            executor, clock, self.planning.margin if config.learn_latency_margin else None)
        self._delivery = Delivery(post_workers)
        self._probes = ProbeQueue()
        self._registration = Registration(Parts(
            config, clock, executor, self.sessions, self.planning, self.quanta, self._cv,
            self._adopt, path_limits, executor_probe))
        if hasattr(executor, "device_gate"):
            executor.device_gate = self.run_in_slice
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.started_ms = now
        self.scheduler_seconds = 0.0
        self.executor_nice = 0
        """The executor thread's nice value (above 0: it yields the CPU to the request path)."""

    def _adopt(self, plan: GpuPlan | None) -> None:
        """Make ``plan`` the one in force (under the lock): each part takes its share."""
        self.planning.adopt(plan)
        self.sessions.follow(plan)
        self.cycle.restart()

    # ---- registration (HTTP threads) -------------------------------------------------

    def add_slo_session(
        self, name: str, model: str, slo_ms: float, rate_rps: float, priority: int = 0
    ) -> dict[str, Any]:
        """Register an SLO session, or raise AdmissionRefused with state unchanged.
        ``priority``: higher gives way later to a busy host (``sacrifice.py``)."""
        return self._registration.add_slo(name, model, slo_ms, rate_rps, self._check_open,
                                          priority)

    def add_best_effort_session(
        self, name: str, model: str, weight: int = 1, priority: int = 0
    ) -> dict[str, Any]:
        """Register a best-effort job that shares the duty cycle's slack in quanta."""
        return self._registration.add_best_effort(name, model, weight, priority,
                                                  self._check_open)

    def remove_session(self, name: str) -> None:
        """Remove a session; its queued requests are answered with SESSION_REMOVED."""
        self._delivery.drop_later(self._registration.remove(name))
        self._delivery.flush(self.clock.now_ms())

    def _check_open(self) -> None:
        if self._stopping:
            raise ServerStopping("the server is shutting down; no session changes")

    # ---- requests (HTTP threads) -------------------------------------------------------

    def input_contract(self, name: str) -> tuple[np.dtype, tuple[int | None, ...] | None,
                                                  float | None]:
        """(dtype, per-sample shape, SLO in ms or None for best effort) of the session's
        requests; raises SessionNotFound."""
        with self._cv:
            sess = self.sessions.find(name)
            slo = sess.spec.slo_ms if isinstance(sess, SloState) else None
            return sess.loaded.input_dtype, sess.loaded.sample_shape, slo

    def profile(self, name: str) -> BatchingProfile:
        """The batching profile a session was planned with; raises SessionNotFound."""
        with self._cv:
            return self.sessions.find(name).profile

    def submit(
        self,
        name: str,
        tensor: np.ndarray,
        on_done: Callable[[Outcome], None],
        arrival_ms: float | None = None,
        deadline_ms: float | None = None,
        late_ok: bool = False,
        inline: bool = False,
    ) -> None:
        """Queue one request; ``on_done`` gets its Outcome (from the executor or a worker).

        ``arrival_ms``: when the request arrived (default now); an SLO request's
        deadline is its arrival plus the SLO, or ``deadline_ms`` if earlier; one that
        could not finish by then even alone is answered DEADLINE_EXPIRED at once.
        ``late_ok``: outputs finished after the deadline are given, marked late.
        ``inline``: ``on_done`` is cheap and never blocks (it wakes a waiter), so the
        executor's thread may call it."""
        with self._cv:
            now = self.clock.now_ms() if arrival_ms is None else arrival_ms
            target = self.sessions.find(name)
            target.stats.arrived += 1
            if self._stopping:  # the loop is gone: answer now rather than at the HTTP timeout
                target.stats.record_drop(DropReason.SHUTDOWN)
                on_done(Outcome(None, DropReason.SHUTDOWN, 0.0))
                return
            if len(target.queue) >= self.config.max_queue:
                target.stats.record_drop(DropReason.QUEUE_FULL)
                on_done(Outcome(None, DropReason.QUEUE_FULL, 0.0))
                return
            if isinstance(target, SloState):
                if target.hold is not None and not target.hold.take(self.clock.now_ms()):
                    target.stats.record_drop(DropReason.SCALED_DOWN)
                    on_done(Outcome(None, DropReason.SCALED_DOWN, 0.0))
                    return
                deadline = now + target.spec.slo_ms
                if deadline_ms is not None:
                    deadline = min(deadline, deadline_ms)
                # The executor must finish in time for the answer to travel back and,
                # unless late answers are fine, pass the last check (``infer.py``).
                deadline -= self.path_cost.back_reserve_ms() + (
                    0.0 if late_ok else self.path_cost.write_reserve_ms())
                if max(now, self.clock.now_ms()) + target.profile.latency_ms(1) > deadline:
                    target.stats.record_drop(DropReason.DEADLINE_EXPIRED)
                    on_done(Outcome(None, DropReason.DEADLINE_EXPIRED, self.clock.now_ms() - now))
                    return
                target.enqueue(Request(name, tensor, now, deadline, on_done, late_ok, inline))
            elif self.planning.sacrifice.best_effort.refuses(len(target.queue)):  # not held
                target.stats.record_drop(DropReason.THROTTLED)
                on_done(Outcome(None, DropReason.THROTTLED, 0.0))
                return
            else:
                target.queue.append(Request(name, tensor, now, None, on_done, late_ok, inline))
            self._cv.notify_all()

    def submit_future(self, name: str, tensor: np.ndarray, arrival_ms: float | None = None,
                      deadline_ms: float | None = None, late_ok: bool = False
                      ) -> Future[Outcome]:
        """Queue one request and return a future of its Outcome (``submit``'s arguments)."""
        future: Future[Outcome] = Future()
        self.submit(name, tensor, future.set_result, arrival_ms, deadline_ms, late_ok,
                    inline=True)
        return future

    def note_answer(self, name: str, reason: DropReason | None, counted: bool = True,
                    held: bool = True) -> None:
        """How the HTTP path answered one SLO request (``reason`` None: on time), for the
        session's held rate (``holding.py``). ``counted`` False: the executor's counters
        do not know it yet: dropped before it was queued (arrived and dropped), or served
        in time but too late to answer at the last check (late, not good). ``held``
        False: not the server's to hold (its deadline passed before it arrived)."""
        with self._cv:
            sess = self.sessions.slo.get(name)
            if sess is None:
                return
            if not counted and reason is DropReason.DEADLINE_EXPIRED:
                sess.stats.arrived += 1
                sess.stats.record_drop(reason)
            elif not counted and reason is DropReason.DEADLINE_MISSED:
                sess.stats.good -= 1
                sess.stats.late += 1
            if held and sess.hold is not None and (reason is None or reason in MISSES):
                sess.hold.outcome(reason is not None)

    # ---- the executor thread -----------------------------------------------------------

    def run_in_slice(self, fn: Callable[[], Any], expected_ms: float) -> Any:
        """Run one device call of a registration as a probe slice of the executor loop
        (inline when no loop runs, as in replays); its result or exception comes back."""
        thread = self._thread
        if thread is None or thread is threading.current_thread() or not thread.is_alive():
            return fn()
        with self._cv:
            if self._stopping:  # ``stop`` fails queued probes once; none may follow it
                raise ServerStopping("the server is shutting down; no session changes")
            future = self._probes.put(fn, expected_ms)
            self._cv.notify_all()
        return future.result()

    def _view(self) -> LoopView:
        return LoopView(self.sessions, self.planning.plan, self.planning.overrun_headroom_ms,
                        self._probes.head_ms(), self.quanta, self.planning.sacrifice.best_effort)

    def step(self) -> bool:
        """Make one scheduling decision and run it; False when there was nothing to do."""
        start = self._timer()
        with self._cv:
            now = self.clock.now_ms()
            plan = self.planning.on_tick(now, self.sessions.slo,
                                         self._registration.longest_segment_ms(),
                                         bool(self.sessions.best_effort))
            if plan is not None:
                self._adopt(plan)
                self._registration.check_best_effort()
            if self.planning.sacrifice.best_effort.stopped:
                self._delivery.drop_later(self._throttled_best_effort())
            decision = self.cycle.decide(now, self._view())
            self._delivery.drop_later(decision.drops)
            probe = self._probes.take() if decision.action and \
                decision.action.kind == "probe" else None
        self.scheduler_seconds += self._timer() - start
        self._delivery.flush(self.clock.now_ms())
        action = decision.action
        if action is None:
            return False
        if probe is not None:
            self.execution.run_probe(*probe)
        elif action.kind == "batch":
            self._delivery.deliver(self.execution.run_batch(action))
        else:
            self._delivery.deliver(self.execution.run_segment(action, self.quanta))
        return True

    def _throttled_best_effort(self) -> list[tuple[Request, DropReason]]:
        """Best effort gives way: what its jobs hold is answered THROTTLED rather than
        kept waiting (each waiting request holds an HTTP worker the SLO sessions need)."""
        drops = []
        for be in self.sessions.best_effort.values():
            for req in be.abandon():
                be.stats.record_drop(DropReason.THROTTLED)
                drops.append((req, DropReason.THROTTLED))
        return drops

    def next_wakeup_ms(self) -> float | None:
        """When the loop has timed work next (the end of a waiting slack phase), if ever."""
        with self._cv:
            return self.cycle.next_wakeup_ms(self._view())

    def _run_forever(self) -> None:
        """The executor thread's loop; returns after ``stop``."""
        while not self._stopping:
            if self.step():
                continue
            wake = self.next_wakeup_ms()
            with self._cv:
                if self._stopping:
                    continue
                timeout = 0.05 if wake is None else max(0.0, (wake - self.clock.now_ms()) / 1000.0)
                self._cv.wait(min(timeout, 0.05))

    def _loop(self) -> None:
        self.executor_nice = yield_cpu_to_request_path(self.execution.executor)
        self._run_forever()

    def is_running(self) -> bool:
        """Whether the executor thread is alive (readiness)."""
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        """Start the executor thread."""
        self._thread = threading.Thread(target=self._loop, name="tandem-gpu", daemon=True)
        self._thread.start()

    def stop(self, join_timeout_seconds: float = 5.0) -> None:
        """Stop the loop: the batch or segment running finishes and is answered; every
        queued request, a best-effort job between its segments and every later request
        is answered with SHUTDOWN (HTTP 503, reason ``shutdown``). Idempotent."""
        with self._cv:
            self._stopping = True
            drops: list[tuple[Request, DropReason]] = []
            for sess in self.sessions.all():
                for req in sess.queue:
                    sess.stats.record_drop(DropReason.SHUTDOWN)
                    drops.append((req, DropReason.SHUTDOWN))
                sess.queue.clear()
            self._delivery.drop_later(drops)
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=join_timeout_seconds)
        with self._cv:
            # The loop has stopped between two steps: a job paused between segments
            # will not resume, and registrations waiting for the loop get an answer.
            for be in self.sessions.best_effort.values():
                paused = be.abandon()
                for _req in paused:
                    be.stats.record_drop(DropReason.SHUTDOWN)
                self._delivery.drop_later([(r, DropReason.SHUTDOWN) for r in paused])
            probes = self._probes.take_all()
        for future in probes:
            future.set_exception(ServerStopping("the server stopped before the model loaded"))
        self._delivery.flush(self.clock.now_ms())
        self._delivery.shutdown()

    # ---- read side -------------------------------------------------------------------

    def _entry(self, sess: SloState | BestEffortState, total_gpu: float, elapsed: float
               ) -> dict[str, Any]:
        """A session in GET /v1/sessions; a best-effort job's promise is best effort's share."""
        entry = sess.to_json(total_gpu, elapsed)
        if isinstance(sess, BestEffortState):
            entry["promised"] = self.planning.sacrifice.best_effort.promised()
        return entry

    def snapshot(self) -> dict[str, Any]:
        """Sessions, counters and plan as JSON (GET /v1/sessions)."""
        with self._cv:
            elapsed = self.clock.now_ms() - self.started_ms
            total_gpu = sum(s.stats.gpu_time_ms for s in self.sessions.all())
            sessions: list[SloState | BestEffortState] = list(self.sessions.all())
            plan, exe, cyc, pl = self.planning.plan, self.execution, self.cycle, self.planning
            return {
                "gpu_type": self.config.gpu_type,
                "executor": exe.executor.kind,
                "executor_nice": self.executor_nice,
                "drop_policy": self.config.drop_policy.value,
                "duty_cycle_ms": plan.duty_cycle_ms if plan else None,
                "occupancy": plan.occupancy if plan else None,
                "quantum_ms": self.quanta.quantum_ms,
                "busy_ms": exe.busy_ms,
                "scheduler_seconds": self.scheduler_seconds,
                "replans": pl.replans,
                "overruns": cyc.overruns,
                "overruns_refused": cyc.overruns_refused,
                "probe_slices": exe.probe_slices,
                "probe_max_ms": exe.probe_max_ms,
                "latency_margin": pl.margin.margin,
                "latency_start_delay_ms": pl.margin.start_delay_ms,
                "executor_share": pl.margin.share,
                "replans_refused": pl.replans_refused,
                "overrun_headroom_ms": pl.overrun_headroom_ms,
                "best_effort_throttle": pl.sacrifice.best_effort.to_json(),
                "request_path": {**pl.path.figures().to_json(),
                                 "startup": pl.path.startup.to_json(),
                                 "observed_requests": pl.path.observed,
                                 "crossing_ms": pl.path.crossing_ms(),
                                 "write_reserve_ms": pl.path.write_reserve_ms()},
                "sessions": [self._entry(s, total_gpu, elapsed) for s in sessions],
            }
