"""The per-GPU serving runtime: one executor thread, Nexus duty cycles, Olympian quanta.

This module holds sessions, registration, request intake, the loop's thread and
its read side. What the loop runs next (the duty cycle, the overrun policy and
probe slices) is ``cycle.py``; running it and answering requests, ``execution.py``.

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
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.inference.admission import (
    LatencyMargin,
    best_effort_refusal_on,
    plan_with_headroom,
    scaled_profile,
)
from agent.inference.batch_formation import Request
from agent.inference.clock import Clock
from agent.inference.cycle import DutyCycle
from agent.inference.errors import (
    AdmissionRefused,
    BadRequest,
    BestEffortRefused,
    DropReason,
    ServerStopping,
    SessionConflict,
    SessionNotFound,
)
from agent.inference.execution import Execution
from agent.inference.executors import Executor, LoadedModel
from agent.inference.quanta import JobSpec, OverheadCurve, QuantaScheduler, choose_quantum_ms
from agent.inference.session_state import (
    BestEffortState,
    RuntimeConfig,
    SloState,
    profile_json,
)
from agent.inference.stats import Outcome
from planner import GpuPlan, Infeasible, SessionError, SessionSpec
from predictor.batching import BatchingProfile


class ServingRuntime(DutyCycle, Execution):
    """Sessions, queues and the executor loop of one GPU."""

    def __init__(
        self,
        executor: Executor,
        clock: Clock,
        config: RuntimeConfig,
        profiles: Mapping[str, BatchingProfile] | None = None,
        post_workers: int = 0,
        timer: Callable[[], float] = time.perf_counter,
    ):
        self.executor = executor
        self.clock = clock
        self.config = config
        self._profiles = dict(profiles or {})
        self._timer = timer
        self._cv = threading.Condition()
        self._admin = threading.Lock()
        self._slo: dict[str, SloState] = {}
        self._be: dict[str, BestEffortState] = {}
        self._curves: dict[str, OverheadCurve] = {}
        self.plan: GpuPlan | None = None
        self.quanta = QuantaScheduler(config.quantum_ms or config.min_quantum_ms)
        self._cycle_start_ms = clock.now_ms()
        self._cycle_pos = 0
        self._probes: deque[tuple[Callable[[], Any], float, Future[Any]]] = deque()
        self._last_probe_cycle = 0
        self.probe_slices = 0
        self.probe_max_ms = 0.0
        """The longest probe slice run (what registering a model can delay serving by)."""
        if hasattr(executor, "device_gate"):
            executor.device_gate = self.run_in_slice
        self._drops: list[tuple[Request, DropReason]] = []
        self._last_replan_ms = clock.now_ms()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._post = ThreadPoolExecutor(post_workers, "tandem-post") if post_workers else None
        self.started_ms = clock.now_ms()
        self.scheduler_seconds = 0.0
        self.busy_ms = 0.0
        self.replans = 0
        self.replans_refused = 0
        self._cycles = 0
        self.margin = LatencyMargin(
            config.latency_quantile, config.latency_margin_window, config.min_latency_samples
        )
        self._last_margin_ms = clock.now_ms()
        self.overrun_headroom_ms = 0.0
        self._last_be_cycle = 0
        """The cycle in which a best-effort segment last started."""
        self.overruns = 0
        self.overruns_refused = 0
        """Decisions in which a segment waited because overrunning would exceed the headroom."""

    # ---- registration (HTTP threads) -------------------------------------------------

    def add_slo_session(
        self, name: str, model: str, slo_ms: float, rate_rps: float
    ) -> dict[str, Any]:
        """Register an SLO session, or raise AdmissionRefused with state unchanged."""
        with self._admin:
            self._check_open()
            self._check_free(name)
            try:
                spec = SessionSpec(name, model, float(slo_ms), float(rate_rps))
            except SessionError as exc:
                raise BadRequest(str(exc)) from exc
            loaded, profile = self._load_and_profile(model)
            with self._cv:
                specs = [s.spec for s in self._slo.values()] + [spec]
                plan = self._plan(
                    specs,
                    {**self._profile_map(), (model, self.config.gpu_type): self._planned(profile)},
                )
                if isinstance(plan, Infeasible):
                    raise AdmissionRefused(
                        f"session {name} refused: {plan.message()}",
                        reason=plan.reason.value,
                        required=plan.required,
                        available=plan.available,
                        session=plan.session,
                    )
                now = self.clock.now_ms()
                self._slo[name] = SloState(
                    spec, loaded, profile, 1, window_start_ms=now, rate_ewma_rps=spec.rate_rps
                )
                self._apply(plan)
                self._cv.notify_all()
                alloc = plan.allocation(name)
                return {
                    "name": name,
                    "kind": "slo",
                    "batch": alloc.batch if alloc else 1,
                    "duty_cycle_ms": plan.duty_cycle_ms,
                    "occupancy": plan.occupancy,
                    "worst_case_latency_ms": alloc.latency_ms if alloc else None,
                    "profile": profile_json(profile),
                }

    def add_best_effort_session(
        self, name: str, model: str, weight: int = 1, priority: int = 0
    ) -> dict[str, Any]:
        """Register a best-effort job that shares the duty cycle's slack in quanta."""
        with self._admin:
            self._check_open()
            self._check_free(name)
            try:
                job = JobSpec(name, weight, priority)
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc

            def prepare() -> tuple[LoadedModel, BatchingProfile, OverheadCurve]:
                loaded, profile = self._load_and_profile(model)
                fraction = self.config.segment_fraction_of_quantum
                return loaded, profile, self.executor.overhead_curve(loaded, profile, fraction)

            loaded, profile, curve = prepare()
            curves = {**self._curves, name: curve}
            quantum = self.config.quantum_ms or choose_quantum_ms(
                curves.values(),
                self.config.overhead_tolerance_percent,
                self.config.min_quantum_ms,
                self.config.max_quantum_ms,
            )
            target = quantum * self.config.segment_fraction_of_quantum
            self.executor.prepare_segments(loaded, target)
            with self._cv:
                self._refuse_unrunnable(name, loaded, profile, target)
                self._curves = curves
                self.quanta.quantum_ms = quantum
                self.quanta.register(job)
                self._be[name] = BestEffortState(job, loaded, profile)
                if self._slo:  # make room for this job's overruns where the plan can
                    plan = self._plan([s.spec for s in self._slo.values()], self._profile_map())
                    if isinstance(plan, GpuPlan):
                        self._apply(plan)
                self._cv.notify_all()
            return {
                "name": name,
                "kind": "best_effort",
                "weight": weight,
                "priority": priority,
                "quantum_ms": quantum,
                "cuts": loaded.cuts,
                "segments": len(loaded.segment_fractions or ()),
                "segment_overhead": loaded.segment_overhead,
                "duty_cycle_ms": self.plan.duty_cycle_ms if self.plan else None,
                "profile": profile_json(profile),
            }

    def _refuse_unrunnable(self, name: str, loaded: LoadedModel, profile: BatchingProfile,
                           target_ms: float) -> None:
        """Raise BestEffortRefused when the job's longest piece could only run by
        making an SLO session miss (``planner.overrun``, the extender's rule too)."""
        if not self._slo:
            return
        piece = max(loaded.segment_costs_ms(profile.latency_ms(1), target_ms))
        specs = [s.spec for s in self._slo.values()]
        refusal = best_effort_refusal_on(specs, self._profile_map(), self.config.gpu_type,
                                         self.config.memory_mib, piece)
        if refusal is not None:
            raise BestEffortRefused(
                f"best-effort session {name} refused: its longest piece takes {piece:.4g} ms, "
                f"more than the SLO sessions' slack, and overrunning a duty cycle by it would "
                f"make an SLO session miss: {refusal.message()}",
                reason=refusal.reason.value, required=refusal.required,
                available=refusal.available,
            )

    def remove_session(self, name: str) -> None:
        """Remove a session; its queued requests are answered with SESSION_REMOVED."""
        with self._admin, self._cv:
            if name in self._slo:
                gone = self._slo.pop(name)
                plan = self._plan([s.spec for s in self._slo.values()], self._profile_map())
                self._apply(plan if isinstance(plan, GpuPlan) else None)
                self._drops.extend((r, DropReason.SESSION_REMOVED) for r in gone.queue)
            elif name in self._be:
                be = self._be.pop(name)
                self.quanta.deregister(name)
                if self._slo and self.overrun_headroom_ms > 0:  # its headroom is free again
                    plan = self._plan([s.spec for s in self._slo.values()], self._profile_map())
                    if isinstance(plan, GpuPlan):
                        self._apply(plan)
                self._curves.pop(name, None)
                pending = list(be.queue) + ([be.current.request] if be.current else [])
                self._drops.extend((r, DropReason.SESSION_REMOVED) for r in pending)
            else:
                raise SessionNotFound(f"no session {name!r}")
            self._cv.notify_all()
        self._flush_drops()

    def _check_open(self) -> None:
        if self._stopping:
            raise ServerStopping("the server is shutting down; no session changes")

    def _check_free(self, name: str) -> None:
        if not isinstance(name, str) or not name or len(name) > 128 or "/" in name:
            raise BadRequest("session name must be 1-128 characters without '/'")
        if name in self._slo or name in self._be:
            raise SessionConflict(f"session {name!r} already exists")

    def _load_and_profile(self, model: str) -> tuple[LoadedModel, BatchingProfile]:
        loaded = self.executor.load(model)
        profile = (
            self._profiles.get(model)
            or self._profiles.get(Path(model).stem)
            or self.executor.known_profile(loaded)
            or self.executor.profile(loaded)
        )
        self._profiles.setdefault(model, profile)
        return loaded, profile

    def _profile_map(self) -> dict[tuple[str, str], BatchingProfile]:
        return {
            (s.spec.model, self.config.gpu_type): self._planned(s.profile)
            for s in self._slo.values()
        }

    def _planned(self, profile: BatchingProfile) -> BatchingProfile:
        """The profile as planning sees it: scaled by the learned latency margin."""
        return scaled_profile(profile, self.margin.margin)

    def planning_profile(self, name: str) -> BatchingProfile:
        """The SLO session's profile as admission plans with it (margin applied)."""
        with self._cv:
            if name not in self._slo:
                raise SessionNotFound(f"no SLO session {name!r}")
            return self._planned(self._slo[name].profile)

    def _plan(
        self, specs: list[SessionSpec], profiles: Mapping[tuple[str, str], BatchingProfile]
    ) -> GpuPlan | Infeasible:
        """The Nexus plan, with headroom for best-effort overruns where needed (admission.py)."""
        plan, self.overrun_headroom_ms = plan_with_headroom(
            specs, profiles, self.config.gpu_type, self.config.memory_mib,
            self._longest_segment_ms(),
        )  # fmt: skip
        return plan

    def _longest_segment_ms(self) -> float:
        """The longest best-effort segment at batch 1 (profiled), 0 with no such job."""
        longest = 0.0
        target = self.quanta.quantum_ms * self.config.segment_fraction_of_quantum
        for be in self._be.values():
            whole = be.profile.latency_ms(1)
            costs = be.loaded.segment_costs_ms(whole, target)
            longest = max(longest, max(costs) * be.cost_scale)
        return longest

    def _apply(self, plan: GpuPlan | None) -> None:
        self.plan = plan
        if plan is not None:
            for alloc in plan.allocations:
                sess = self._slo.get(alloc.session.name)
                if sess is not None:
                    sess.batch = alloc.batch
                    # A plan made with headroom carries shortened SLOs: keep the real one.
                    sess.spec = replace(alloc.session, slo_ms=sess.spec.slo_ms)
        self._cycle_pos = 0

    # ---- requests (HTTP threads) -------------------------------------------------------

    def input_contract(self, name: str) -> tuple[np.dtype, tuple[int | None, ...] | None, bool]:
        """(dtype, per-sample shape, is_slo) the session's requests must match."""
        with self._cv:
            sess: SloState | BestEffortState | None = self._slo.get(name) or self._be.get(name)
            if sess is None:
                raise SessionNotFound(f"no session {name!r}")
            return sess.loaded.input_dtype, sess.loaded.sample_shape, name in self._slo

    def profile(self, name: str) -> BatchingProfile:
        """The batching profile a session was planned with; raises SessionNotFound."""
        with self._cv:
            sess: SloState | BestEffortState | None = self._slo.get(name) or self._be.get(name)
            if sess is None:
                raise SessionNotFound(f"no session {name!r}")
            return sess.profile

    def slo_ms(self, name: str) -> float | None:
        """The session's SLO (None for best effort); raises SessionNotFound."""
        with self._cv:
            if name in self._slo:
                return self._slo[name].spec.slo_ms
            if name in self._be:
                return None
            raise SessionNotFound(f"no session {name!r}")

    def submit(
        self,
        name: str,
        tensor: np.ndarray,
        on_done: Callable[[Outcome], None],
        arrival_ms: float | None = None,
    ) -> None:
        """Queue one request; ``on_done`` gets its Outcome (from the executor or a worker)."""
        with self._cv:
            now = self.clock.now_ms() if arrival_ms is None else arrival_ms
            slo = self._slo.get(name)
            be = self._be.get(name)
            if slo is None and be is None:
                raise SessionNotFound(f"no session {name!r}")
            target = slo if slo is not None else be
            assert target is not None
            target.stats.arrived += 1
            if self._stopping:  # the loop is gone: answer now rather than at the HTTP timeout
                target.stats.record_drop(DropReason.SHUTDOWN)
                on_done(Outcome(None, DropReason.SHUTDOWN, 0.0))
                return
            if len(target.queue) >= self.config.max_queue:
                target.stats.record_drop(DropReason.QUEUE_FULL)
                on_done(Outcome(None, DropReason.QUEUE_FULL, 0.0))
                return
            deadline = now + slo.spec.slo_ms if slo is not None else None
            target.queue.append(Request(name, tensor, now, deadline, on_done))
            if slo is not None:
                slo.window_count += 1
            self._cv.notify_all()

    def submit_future(self, name: str, tensor: np.ndarray) -> Future[Outcome]:
        """Queue one request and return a future of its Outcome."""
        future: Future[Outcome] = Future()
        self.submit(name, tensor, future.set_result)
        return future

    # ---- the executor thread -----------------------------------------------------------

    def run_in_slice(self, fn: Callable[[], Any], expected_ms: float) -> Any:
        """Run one device call of a registration as a probe slice of the executor loop
        (inline when no loop runs, as in replays); its result or exception comes back."""
        thread = self._thread
        if thread is None or thread is threading.current_thread() or not thread.is_alive():
            return fn()
        future: Future[Any] = Future()
        with self._cv:
            if self._stopping:  # ``stop`` fails queued probes once; none may follow it
                raise ServerStopping("the server is shutting down; no session changes")
            self._probes.append((fn, expected_ms, future))
            self._cv.notify_all()
        return future.result()

    def step(self) -> bool:
        """Make one scheduling decision and run it; False when there was nothing to do."""
        start = self._timer()
        with self._cv:
            now = self.clock.now_ms()
            self._update_rates(now)
            action = self._decide(now)
        self.scheduler_seconds += self._timer() - start
        self._flush_drops()
        if action is None:
            return False
        if action.kind == "batch":
            self._run_batch(action)
        elif action.kind == "probe":
            self._run_probe(action)
        else:
            self._run_segment(action)
        return True

    def _update_margin(self, now: float) -> bool:
        """Refresh the latency margin once a rate window; True when planning must redo."""
        cfg = self.config
        if not cfg.learn_latency_margin or now - self._last_margin_ms < cfg.rate_window_ms:
            return False
        self._last_margin_ms = now
        return self.margin.refresh()

    def _update_rates(self, now: float) -> None:
        cfg = self.config
        if self._update_margin(now) and self._slo:
            plan = self._plan([s.spec for s in self._slo.values()], self._profile_map())
            if isinstance(plan, GpuPlan):
                self.replans += 1
                self._apply(plan)
            else:  # what is admitted stays; later admissions see the margin
                self.replans_refused += 1
        drifted = False
        for sess in self._slo.values():
            span = now - sess.window_start_ms
            if span < cfg.rate_window_ms:
                continue
            rate = sess.window_count * 1000.0 / span
            sess.rate_ewma_rps = (
                cfg.rate_ewma_alpha * rate + (1 - cfg.rate_ewma_alpha) * sess.rate_ewma_rps
            )
            sess.window_start_ms, sess.window_count = now, 0
            change = abs(sess.rate_ewma_rps - sess.spec.rate_rps) / sess.spec.rate_rps
            drifted |= change * 100.0 > cfg.replan_threshold_percent
        if drifted and now - self._last_replan_ms >= cfg.min_replan_interval_ms:
            self._last_replan_ms = now
            specs = [
                replace(s.spec, rate_rps=max(s.rate_ewma_rps, 0.1)) for s in self._slo.values()
            ]
            plan = self._plan(specs, self._profile_map())
            if isinstance(plan, GpuPlan):
                self.replans += 1
                self._apply(plan)
            else:
                self.replans_refused += 1

    def next_wakeup_ms(self) -> float | None:
        """When the loop has timed work next (the end of a waiting slack phase), if ever."""
        with self._cv:
            waiting = bool(self._probes) or any(b.runnable() for b in self._be.values())
            if self.plan and self.plan.allocations and waiting:
                return self._cycle_start_ms + self.plan.duty_cycle_ms
            return None

    def run_forever(self) -> None:
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

    def is_running(self) -> bool:
        """Whether the executor thread is alive (readiness)."""
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        """Start the executor thread."""
        self._thread = threading.Thread(target=self.run_forever, name="tandem-gpu", daemon=True)
        self._thread.start()

    def stop(self, join_timeout_seconds: float = 5.0) -> None:
        """Stop the loop: the batch or segment running finishes and is answered; every
        queued request, a best-effort job between its segments and every later request
        is answered with SHUTDOWN (HTTP 503, reason ``shutdown``). Idempotent."""
        with self._cv:
            self._stopping = True
            for sess in list(self._slo.values()) + list(self._be.values()):
                for req in sess.queue:
                    sess.stats.record_drop(DropReason.SHUTDOWN)
                    self._drops.append((req, DropReason.SHUTDOWN))
                sess.queue.clear()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=join_timeout_seconds)
        with self._cv:
            # The loop has stopped between two steps: a job paused between segments
            # will not resume, and registrations waiting for the loop get an answer.
            for be in self._be.values():
                if be.current is not None:
                    self._drops.append((be.current.request, DropReason.SHUTDOWN))
                    be.stats.record_drop(DropReason.SHUTDOWN)
                    be.current = None
            probes, self._probes = list(self._probes), deque()
        for _fn, _expected, future in probes:
            future.set_exception(ServerStopping("the server stopped before the model loaded"))
        self._flush_drops()
        if self._post is not None:
            self._post.shutdown(wait=True)

    # ---- read side -------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Sessions, counters and plan as JSON (GET /v1/sessions)."""
        with self._cv:
            elapsed = self.clock.now_ms() - self.started_ms
            total_gpu = sum(s.stats.gpu_time_ms for s in self._slo.values()) + sum(
                b.stats.gpu_time_ms for b in self._be.values()
            )
            sessions = [s.to_json(total_gpu, elapsed) for s in self._slo.values()]
            sessions += [b.to_json(total_gpu, elapsed) for b in self._be.values()]
            plan = self.plan
            return {
                "gpu_type": self.config.gpu_type,
                "executor": self.executor.kind,
                "drop_policy": self.config.drop_policy.value,
                "duty_cycle_ms": plan.duty_cycle_ms if plan else None,
                "occupancy": plan.occupancy if plan else None,
                "quantum_ms": self.quanta.quantum_ms,
                "busy_ms": self.busy_ms,
                "scheduler_seconds": self.scheduler_seconds,
                "replans": self.replans,
                "overruns": self.overruns,
                "overruns_refused": self.overruns_refused,
                "probe_slices": self.probe_slices,
                "probe_max_ms": self.probe_max_ms,
                "latency_margin": self.margin.margin,
                "replans_refused": self.replans_refused,
                "overrun_headroom_ms": self.overrun_headroom_ms,
                "sessions": sessions,
            }
