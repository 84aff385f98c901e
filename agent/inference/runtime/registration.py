"""Adding and removing sessions (HTTP threads): admission, then the plan changes once.

A registration loads and profiles its model outside the runtime's lock (its
device calls wait as probe slices for the executor loop), then plans under the
lock: a refusal leaves every part as it was; an admission adds the session and
adopts the new plan in one step. An SLO session is admitted only where the plan
holds it with the request path's own time taken from its SLO and the request path
holds it too (its CPU and its workers, ``pathcost.host_refusal``); a refusal says
why and the highest rate this host would hold now (``holdable_rate_rps``), so the
caller can scale the session down. Before any request was served, the request path
is measured again at each SLO registration beside the executor running the sessions'
own models (``RequestPathCost.probe``, ``probe_work``): beside a CPU hog, a 150 ms
session admitted at 100 requests/s on a start-up figure of 16 ms (an idle executor
beside it) met 50-100 ms there and lost 72% of its requests after admission.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from agent.inference.clock import Clock
from agent.inference.errors import (
    AdmissionRefused,
    BadRequest,
    BestEffortRefused,
    DropReason,
)
from agent.inference.executors.executors import Executor, LoadedModel
from agent.inference.quanta import JobSpec, QuantaScheduler, choose_quantum_ms
from agent.inference.runtime.admission import best_effort_refusal_on
from agent.inference.runtime.batch_formation import Request
from agent.inference.runtime.executor_tail import ExecutorHost
from agent.inference.runtime.holding import Hold
from agent.inference.runtime.pathcost import (
    HostLimits,
    PathFigures,
    PathLoad,
    RequestPathLimits,
    current_limits,
    host_refusal,
    path_queue_ms,
)
from agent.inference.runtime.planning import Planning
from agent.inference.runtime.probe_work import own_batches
from agent.inference.runtime.registry import SessionRegistry
from agent.inference.runtime.session_state import (
    BestEffortState,
    RuntimeConfig,
    SloState,
    profile_json,
)
from planner import GpuPlan, Infeasible, SessionError, SessionSpec
from planner.overrun import slack_ms
from predictor.batching import BatchingProfile


@dataclass(frozen=True)
class Parts:
    """What a registration works with; the runtime builds them and holds the lock."""

    config: RuntimeConfig
    clock: Clock
    executor: Executor
    sessions: SessionRegistry
    planning: Planning
    quanta: QuantaScheduler
    lock: threading.Condition
    adopt: Callable[[GpuPlan | None], None]
    """Make a plan the one in force (sessions take their batches, the cycle restarts)."""
    path_limits: RequestPathLimits | HostLimits | None = None
    """What the request path may hold (None: in-process use, no HTTP path to count);
    ``HostLimits``: measured again at each registration."""
    probe_executor: Callable[[], ExecutorHost] | None = None
    """The host as the executor's priority finds it, measured at each SLO registration
    (``executor_tail``; None: not measured)."""


PROBE_REUSE_MS = 30_000.0
"""A registration within this of the last path measurement, at no higher a rate, plans
with it: a refusal's holdable rate was found on it, and a second measurement's noise
would refuse the rate the first named."""


def request_bytes(loaded: LoadedModel) -> float:
    """An SLO request's body: one sample of the model's input, plus the .npy header."""
    dims = [d or 1 for d in loaded.sample_shape or ()]
    return float(np.dtype(loaded.input_dtype).itemsize * int(np.prod(dims)) + 128)


class Registration:
    """Admission of SLO sessions and best-effort jobs, and their removal."""

    def __init__(self, parts: Parts):
        self._p = parts
        self._admin = threading.Lock()
        """One registration at a time: the plan each proposes sees the one before."""
        self._limits: RequestPathLimits | None = None
        """The request path's limits this registration admits with (measured at its start)."""
        self._host: ExecutorHost | None = None
        """The host as the executor's priority found it at this registration's start."""
        self._probed = (-math.inf, 0.0)
        """When the request path was last measured at a registration, and at what rate."""

    def longest_segment_ms(self) -> float:
        p = self._p
        return p.sessions.longest_segment_ms(
            p.quanta.quantum_ms * p.config.segment_fraction_of_quantum)

    def _replan(self) -> GpuPlan | Infeasible:
        p = self._p
        return p.planning.propose(p.sessions.admitted_specs(), p.planning.profile_map(
            p.sessions.slo.values()), self.longest_segment_ms())

    def add_slo(self, name: str, model: str, slo_ms: float, rate_rps: float,
                check_open: Callable[[], None], priority: int = 0) -> dict[str, Any]:
        """Register an SLO session, or raise AdmissionRefused with state unchanged."""
        p = self._p
        with self._admin:
            check_open()
            p.sessions.check_free(name)
            try:
                spec = SessionSpec(name, model, float(slo_ms), float(rate_rps))
            except SessionError as exc:
                raise BadRequest(str(exc)) from exc
            loaded, profile = p.sessions.load_and_profile(p.executor, model)
            self._limits = current_limits(p.path_limits)  # the host as it is now
            self._host = p.probe_executor() if p.probe_executor else None
            self._probe_path(spec, loaded, profile)
            with p.lock:
                profiles = self._profiles_at(spec, profile, spec.rate_rps)
                plan = p.planning.propose(p.sessions.admitted_specs() + [spec], profiles,
                                          self.longest_segment_ms(), self._queue_ms(spec, loaded))
                refusal = self._refusal(plan, spec, loaded, profile)
                if refusal is not None:
                    self._observe_host_at(0.0)  # the executor as the admitted leave it
                    raise refusal
                assert isinstance(plan, GpuPlan)
                now = p.clock.now_ms()
                state = SloState(spec, loaded, profile, 1, window_start_ms=now,
                                 rate_ewma_rps=spec.rate_rps, hold=Hold(spec.rate_rps, now),
                                 priority=priority)
                p.sessions.add_slo(state)
                p.adopt(plan)
                self.check_best_effort()
                if p.sessions.best_effort:
                    p.planning.sacrifice.admitted(now, name)
                p.lock.notify_all()
                alloc = plan.allocation(name)
                return {
                    "name": name, "kind": "slo", "batch": alloc.batch if alloc else 1,
                    "duty_cycle_ms": plan.duty_cycle_ms, "occupancy": plan.occupancy,
                    "worst_case_latency_ms": alloc.latency_ms if alloc else None,
                    "request_path": {**p.planning.path_in_plan.to_json(), "cores":
                                     self._limits.cores if self._limits else None,
                                     "write_reserve_ms": p.planning.path.write_reserve_ms()},
                    "profile": profile_json(profile), "priority": priority,
                    "executor_share": p.planning.margin.share,
                    "promised": state.promised(),
                    "best_effort": (p.planning.sacrifice.best_effort.promised()
                                    if p.sessions.best_effort else None),
                }  # fmt: skip

    def _probe_path(self, new: SessionSpec, loaded: LoadedModel,
                    profile: BatchingProfile) -> None:
        """Measure the request path again (``RequestPathCost.probe``) at the rate the SLO
        sessions will send with ``new``, beside the executor running the sessions' own
        models in proportion to their rates (``probe_work.own_batches``) in batches of a
        duty cycle's requests (``_cycle_ms``), where no served requests show the path
        yet: those do, at no cost to them."""
        p = self._p
        path, now = p.planning.path, p.clock.now_ms()
        if path.probe is None or path.served():
            return
        mix = [(s.admitted_spec().rate_rps, s.loaded, s.profile.max_batch)
               for s in p.sessions.slo.values()]
        mix.append((new.rate_rps, loaded, profile.max_batch))
        total = sum(rate for rate, _m, _b in mix)
        last_ms, last_rps = self._probed
        if total <= 0 or (now - last_ms < PROBE_REUSE_MS and total <= last_rps):
            return  # a session scaled down to the rate a refusal named: the same host
        path.recalibrate(path.probe(total, own_batches(p.executor, mix),
                                    self._cycle_ms(new, loaded, profile)))
        self._probed = (p.clock.now_ms(), total)

    def _cycle_ms(self, new: SessionSpec, loaded: LoadedModel, profile: BatchingProfile
                  ) -> float:
        """The duty cycle a plan with ``new`` would have on the figures known before the
        probe (half the tightest SLO where none fits): the probe's batches hold a cycle's
        requests, as the served ones will."""
        p = self._p
        specs = [*p.sessions.admitted_specs(), new]
        with p.lock:
            plan = p.planning.trial(specs, self._profiles_at(new, profile, new.rate_rps),
                                    self.longest_segment_ms(), self._queue_ms(new, loaded))
        if isinstance(plan, GpuPlan) and plan.duty_cycle_ms > 0:
            return plan.duty_cycle_ms
        return min(s.slo_ms for s in specs) / 2.0

    def _profiles_at(self, new: SessionSpec, profile: BatchingProfile, rate_rps: float
                     ) -> dict[tuple[str, str], BatchingProfile]:
        """Every session's profile as planning sees it with ``new`` beside them at
        ``rate_rps`` (0: without it): the executor's priority at the share and delay the
        host leaves it now (``self._host``) and at the rate the sessions then send."""
        p = self._p
        self._observe_host_at(rate_rps)
        return {**p.planning.profile_map(p.sessions.slo.values()),
                (new.model, p.config.gpu_type): p.planning.planned(profile)}

    def _observe_host_at(self, rate_rps: float) -> None:
        """Plan the executor at the host this registration found (``self._host``) with the
        admitted sessions and ``rate_rps`` more sending."""
        p = self._p
        if self._host is not None:
            admitted = sum(s.rate_rps for s in p.sessions.admitted_specs())
            p.planning.observe_host(self._host, admitted + rate_rps)

    def _rates(self, new: SessionSpec, loaded: LoadedModel) -> list[PathLoad]:
        """Every session's requests with ``new`` beside them, each held its SLO at most."""
        loads = [PathLoad(s.admitted_spec().rate_rps, s.spec.slo_ms, request_bytes(s.loaded))
                 for s in self._p.sessions.slo.values()]
        return [*loads, PathLoad(new.rate_rps, new.slo_ms, request_bytes(loaded))]

    def _queue_ms(self, new: SessionSpec, loaded: LoadedModel) -> float:
        """The request path's CPU queue tail with ``new`` beside the sessions, as planning
        takes it from the SLOs (capped: a saturated path is refused, not planned for)."""
        tail = path_queue_ms(self._rates(new, loaded), self._p.planning.path.figures(),
                             self._limits)
        return min(tail, new.slo_ms)

    def _loads(self, plan: GpuPlan, new: SessionSpec, loaded: LoadedModel) -> list[PathLoad]:
        """Each session's requests as the request path holds them: a worker from arrival
        until the plan's worst case for its batch has passed and the answer is back."""
        figures = self._p.planning.path.figures()

        def held_ms(spec: SessionSpec) -> float:
            alloc = plan.allocation(spec.name)
            worst = alloc.latency_ms if alloc else spec.slo_ms
            return min(spec.slo_ms, worst + figures.front_ms + figures.back_ms)

        loads = [PathLoad(s.admitted_spec().rate_rps, held_ms(s.spec), request_bytes(s.loaded))
                 for s in self._p.sessions.slo.values()]
        return [*loads, PathLoad(new.rate_rps, held_ms(new), request_bytes(loaded))]

    def _why_not(self, plan: GpuPlan | Infeasible, spec: SessionSpec, loaded: LoadedModel
                 ) -> tuple[str, dict[str, Any]] | None:
        """None when the request path and the plan hold ``spec`` beside the sessions;
        else the reason's text and its fields (the request path's first: its wait is
        what shortens every SLO the planner sees)."""
        p = self._p
        path = p.planning.path.figures()
        queue = path_queue_ms(self._rates(spec, loaded), path, self._limits)
        own = p.planning.own_ms(queue)
        tightest = min([s.slo_ms for s in p.sessions.admitted_specs()] + [spec.slo_ms])
        if own >= tightest and math.isfinite(own):
            text = (f"RequestPathQueue: a request would spend {own:.3g} ms on the request "
                    f"path at p99 ({_path_text(path, queue, p.planning.path.write_reserve_ms())}"
                    f"), the tightest SLO is {tightest:.3g} ms")
            return text, {"reason": "RequestPathQueue", "required": own,
                          "available": tightest, "session": spec.name}
        if isinstance(plan, GpuPlan):
            host = host_refusal(self._loads(plan, spec, loaded), path, self._limits)
        else:  # a saturated path (infinite wait) is the reason, not the plan it spoilt
            host = None if math.isfinite(own) else host_refusal(self._rates(spec, loaded), path,
                                                                self._limits)
            if host is None:
                note = f" (planned with the request path's own {own:.3g} ms taken from each SLO)"
                return plan.message() + (note if own > 0 else ""), {
                    "reason": plan.reason.value, "required": plan.required,
                    "available": plan.available, "session": plan.session}
        if host is None:
            return None
        return host.message(), {"reason": host.reason, "required": host.required,
                                "available": host.available, "session": spec.name}

    def _refusal(self, plan: GpuPlan | Infeasible, spec: SessionSpec, loaded: LoadedModel,
                 profile: BatchingProfile) -> AdmissionRefused | None:
        """Why ``spec`` cannot be admitted (None: it can), with the rate that could."""
        why = self._why_not(plan, spec, loaded)
        if why is None:
            return None
        text, fields = why
        holdable = self._holdable_rate(spec, loaded, profile)
        return AdmissionRefused(
            f"session {spec.name} refused: {text}; this host holds it at up to "
            f"{holdable:.4g} rps now", holdable_rate_rps=holdable, **fields)

    def _holdable_rate(self, spec: SessionSpec, loaded: LoadedModel,
                       profile: BatchingProfile) -> float:
        """The highest rate (to 1/256 of the asked one) at which ``spec`` would be admitted,
        each rate tried with the executor as the sessions' rates with it leave it."""
        p = self._p
        specs = p.sessions.admitted_specs()
        low, high = 0.0, spec.rate_rps
        for _ in range(8):
            mid = (low + high) / 2
            trial = replace(spec, rate_rps=mid)
            profiles = self._profiles_at(spec, profile, mid)
            plan = p.planning.trial([*specs, trial], profiles, self.longest_segment_ms(),
                                    self._queue_ms(trial, loaded))
            low, high = (mid, high) if self._why_not(plan, trial, loaded) is None else (low, mid)
        return round(low, 3)

    def add_best_effort(self, name: str, model: str, weight: int, priority: int,
                        check_open: Callable[[], None]) -> dict[str, Any]:
        """Register a best-effort job that shares the duty cycle's slack in quanta."""
        p = self._p
        with self._admin:
            check_open()
            p.sessions.check_free(name)
            try:
                job = JobSpec(name, weight, priority)
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
            loaded, profile = p.sessions.load_and_profile(p.executor, model)
            fraction = p.config.segment_fraction_of_quantum
            curve = p.executor.overhead_curve(loaded, profile, fraction)
            quantum = p.config.quantum_ms or choose_quantum_ms(
                [*p.sessions.curves.values(), curve], p.config.overhead_tolerance_percent,
                p.config.min_quantum_ms, p.config.max_quantum_ms)
            target = quantum * fraction
            p.executor.prepare_segments(loaded, target)
            with p.lock:
                self._refuse_unrunnable(name, loaded, profile, target)
                p.quanta.quantum_ms = quantum
                p.quanta.register(job)
                p.sessions.add_best_effort(BestEffortState(job, loaded, profile), curve)
                if p.sessions.slo:  # make room for this job's overruns where the plan can
                    plan = self._replan()
                    if isinstance(plan, GpuPlan):
                        p.adopt(plan)
                self.check_best_effort()
                p.lock.notify_all()
                in_force = p.planning.plan
            return {
                "name": name, "kind": "best_effort", "weight": weight, "priority": priority,
                "quantum_ms": quantum, "cuts": loaded.cuts,
                "segments": len(loaded.segment_fractions or ()),
                "segment_overhead": loaded.segment_overhead,
                "duty_cycle_ms": in_force.duty_cycle_ms if in_force else None,
                "profile": profile_json(profile),
                "promised": p.planning.sacrifice.best_effort.promised(),
            }  # fmt: skip

    def check_best_effort(self) -> None:
        """Under the lock, after a plan changed: block best effort while a job's longest
        piece fits neither the plan's slack nor its overrun headroom (the executor loop
        would never start it: an SLO session admitted after the job can leave it none)."""
        p = self._p
        plan, why = p.planning.plan, None
        target = p.quanta.quantum_ms * p.config.segment_fraction_of_quantum
        for job in p.sessions.best_effort.values() if plan and plan.allocations else ():
            piece = max(job.loaded.segment_costs_ms(job.profile.latency_ms(1), target))
            piece *= job.cost_scale
            if piece > slack_ms(plan) + 1e-6 and piece > p.planning.overrun_headroom_ms + 1e-6:
                why = (f"NoBestEffortSlack: best-effort job {job.job.name}'s longest piece "
                       f"takes {piece:.4g} ms, more than the SLO sessions' slack "
                       f"({slack_ms(plan):.4g} ms a duty cycle) and than the headroom an "
                       f"overrun has ({p.planning.overrun_headroom_ms:.4g} ms)")
                break
        p.planning.sacrifice.best_effort.block(why)

    def _refuse_unrunnable(self, name: str, loaded: LoadedModel, profile: BatchingProfile,
                           target_ms: float) -> None:
        """Raise BestEffortRefused when the job's longest piece could only run by
        making an SLO session miss (``planner.overrun``, the extender's rule too)."""
        p = self._p
        if not p.sessions.slo:
            return
        piece = max(loaded.segment_costs_ms(profile.latency_ms(1), target_ms))
        refusal = best_effort_refusal_on(
            p.sessions.admitted_specs(), p.planning.profile_map(p.sessions.slo.values()),
            p.config.gpu_type, p.config.memory_mib, piece)
        if refusal is not None:
            raise BestEffortRefused(
                f"best-effort session {name} refused: its longest piece takes {piece:.4g} ms, "
                f"more than the SLO sessions' slack, and overrunning a duty cycle by it would "
                f"make an SLO session miss: {refusal.message()}",
                reason=refusal.reason.value, required=refusal.required,
                available=refusal.available,
            )

    def remove(self, name: str) -> list[tuple[Request, DropReason]]:
        """Remove a session; its queued requests, to be answered SESSION_REMOVED."""
        p = self._p
        with self._admin, p.lock:
            gone = p.sessions.remove(name)
            if isinstance(gone, SloState):
                plan = self._replan()
                p.adopt(plan if isinstance(plan, GpuPlan) else None)
                pending = list(gone.queue)
            else:
                p.quanta.deregister(name)
                if p.sessions.slo and p.planning.overrun_headroom_ms > 0:
                    plan = self._replan()  # its headroom is free again
                    if isinstance(plan, GpuPlan):
                        p.adopt(plan)
                pending = gone.abandon()
            if not p.sessions.slo:  # reviews come from SLO sessions: none is left to wait for
                p.planning.sacrifice.best_effort.restore(p.clock.now_ms())
            self.check_best_effort()
            p.lock.notify_all()
        return [(r, DropReason.SESSION_REMOVED) for r in pending]


def _path_text(path: PathFigures, queue_ms: float, reserve_ms: float) -> str:
    """What a request's time on the request path is made of, for a refusal."""
    if path.path_ms > 0:
        return (f"{path.path_ms:.3g} ms measured through the HTTP front with real requests, "
                f"{queue_ms * path.queue_scale:.3g} ms waiting for its CPU at these rates")
    return (f"{queue_ms:.3g} ms waiting for its CPU and the interpreter lock, {reserve_ms:.3g} "
            f"ms kept back for its answer's write and the client's wake-up")
