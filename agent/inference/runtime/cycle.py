"""What the executor loop runs next: Nexus duty cycles, overruns and probe slices.

State of the executor loop (one decision per ``step``)::

    cycle start ──> SLO phase: one batch per SLO session, round robin, in plan order
                      │  (batches formed by early or lazy drop, dispatch.py)
                      v
                    slack phase: SLO requests left by a burst, then probe slices of
                      │  a registration, then best-effort segments chosen by the
                      │  quanta scheduler; each started only if it ends before the
                      │  cycle does, except that after ``overrun_every_cycles``
                      │  cycles in which none found room, one may overrun the cycle
                      │  (no starvation) by no more than the plan's headroom
                      │  (no SLO miss)
                      v
                    next cycle at ``start + d``; with no best-effort work it starts
                    as soon as an SLO request waits (work conserving)

This part owns the cycle's position and its overrun counters. It reads the
sessions, the plan and the waiting probes it is given, takes batches and pieces
through the sessions' own methods, and gives back the action to run and the
requests it dropped. Called under the runtime's lock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agent.inference.errors import DropReason
from agent.inference.quanta import QuantaScheduler
from agent.inference.runtime.batch_formation import Request
from agent.inference.runtime.registry import SessionRegistry
from agent.inference.runtime.sacrifice import BestEffortThrottle
from agent.inference.runtime.session_state import Action, RuntimeConfig, SloState
from planner import GpuPlan


@dataclass
class Decision:
    """What to run next (None: nothing now) and what was dropped deciding it."""

    action: Action | None = None
    drops: list[tuple[Request, DropReason]] = field(default_factory=list)


@dataclass(frozen=True)
class LoopView:
    """What a decision reads: the sessions, the plan and what else waits."""

    sessions: SessionRegistry
    plan: GpuPlan | None
    overrun_headroom_ms: float
    probe_ms: float | None
    """The expected length of the first waiting probe slice (None: none waits)."""
    quanta: QuantaScheduler
    throttle: BestEffortThrottle
    """The share of the executor best effort may take now (``sacrifice.py``)."""

    def best_effort_waiting(self) -> bool:
        return not self.throttle.stopped and any(
            b.runnable() for b in self.sessions.best_effort.values())


class DutyCycle:
    """Where the executor loop is in its duty cycle, and what it runs next."""

    def __init__(self, config: RuntimeConfig, now_ms: float):
        self._config = config
        self.start_ms = now_ms
        self._pos = 0
        self.cycles = 0
        self._last_be_cycle = 0
        """The cycle in which a best-effort segment last started."""
        self._last_probe_cycle = 0
        self.overruns = 0
        self.overruns_refused = 0
        """Decisions in which a segment waited because overrunning would exceed the headroom."""

    def restart(self) -> None:
        """A new plan: its first session goes next."""
        self._pos = 0

    def next_wakeup_ms(self, view: LoopView) -> float | None:
        """When the loop has timed work next (the end of a waiting slack phase), if ever."""
        waiting = view.probe_ms is not None or view.best_effort_waiting()
        if view.plan and view.plan.allocations and waiting:
            return self.start_ms + view.plan.duty_cycle_ms
        return None

    def decide(self, now: float, view: LoopView) -> Decision:
        out = Decision()
        plan = view.plan
        slo = view.sessions.slo
        order = [a.session.name for a in plan.allocations] if plan else []
        for _ in range(2):  # at most one cycle restart per decision
            while self._pos < len(order):
                sess = slo.get(order[self._pos])
                self._pos += 1
                if sess is None or not sess.queue:
                    continue
                out.action = self._batch_action(sess, now, out)
                if out.action is not None:
                    return out
            cycle_end = self.start_ms + plan.duty_cycle_ms if order and plan else math.inf
            out.action = (self._overflow_batch(order, slo, now, cycle_end, out)
                          or self._next_probe(order, view.probe_ms, now, cycle_end)
                          or self._next_segment(view, now, cycle_end))
            if out.action is not None:
                return out
            # Waiting probes do not hold SLO requests to the cycle's end, as best-effort
            # work does: they only fill time no SLO request wants.
            be_waiting = view.best_effort_waiting()
            slo_waiting = any(s.queue for s in slo.values())
            if not order or not (now >= cycle_end or (slo_waiting and not be_waiting)):
                return out
            self.start_ms = now
            self._pos = 0
            self.cycles += 1
        return out

    def _overflow_batch(self, order: list[str], slo: dict[str, SloState], now: float,
                        cycle_end: float, out: Decision) -> Action | None:
        """Slack goes to SLO requests left over by a burst before best-effort work.

        A Poisson burst leaves more than ``b`` requests; waiting a whole cycle would
        make them miss ``d + l(b)``. An extra batch that ends before the cycle does
        delays nobody's next slot, so it only takes time best effort would have had.
        """
        for name in order:
            sess = slo.get(name)
            if sess is None or not sess.queue:
                continue
            size = min(len(sess.queue), sess.batch)
            if now + sess.profile.latency_ms(size) > cycle_end:
                continue
            action = self._batch_action(sess, now, out)
            if action is not None:
                return action
        return None

    def _batch_action(self, sess: SloState, now: float, out: Decision) -> Action | None:
        """The session's next batch under the drop policy, with what it drops."""
        batch, why, dropped = sess.take_batch(now, self._config.drop_policy)
        out.drops.extend((req, why) for req in dropped)
        return Action("batch", sess, batch) if batch else None

    def _next_segment(self, view: LoopView, now: float, cycle_end: float) -> Action | None:
        jobs = view.sessions.best_effort
        if view.throttle.stopped:
            return None
        name = view.quanta.select([n for n, b in jobs.items() if b.runnable()])
        if name is None:
            return None
        be = jobs[name]
        flight = be.next_piece(view.quanta.quantum_ms * self._config.segment_fraction_of_quantum)
        cost = flight.costs_ms[flight.index]
        # Profiled fractions of l(b) drift from what a segment takes at this batch on
        # this device; the job's observed measured/profiled ratio corrects the estimate.
        expected = cost * be.cost_scale
        push = now + expected - cycle_end
        if push > 0 and not self._may_overrun(push, bool(view.sessions.slo),
                                              view.overrun_headroom_ms):
            return None  # would push the next SLO cycle back: wait for it
        if not view.throttle.allows(expected, now):
            return None  # best effort gives way to the SLO sessions: its share is spent
        if push > 0:
            self.overruns += 1
        self._last_be_cycle = self.cycles
        return Action("segment", be, profiled_ms=cost)

    def _may_overrun(self, push_ms: float, has_slo: bool, headroom_ms: float) -> bool:
        """A segment that found no room for N whole cycles may overrun this one, or it
        might never run: best effort gets a bounded share (one overrun per N cycles)
        instead of starving. The SLO sessions' next slot then moves back by ``push_ms``,
        so with SLO sessions it may only where the plan keeps that much headroom
        (``plan_with_headroom``): an overrun never makes an SLO session miss. Admission
        refuses jobs that could run no other way (``planner.overrun``)."""
        if has_slo and push_ms > headroom_ms + 1e-6:
            self.overruns_refused += 1
            return False
        return self.cycles - self._last_be_cycle >= self._config.overrun_every_cycles

    def _next_probe(self, order: list[str], expected: float | None, now: float,
                    cycle_end: float) -> Action | None:
        """A registration's probe slice, if one waits and fits before the next cycle.

        Probes go before best-effort segments (a registration is waiting on them) but
        after every SLO batch; one that never fits overruns like a segment, one cycle
        in ``overrun_every_cycles``, so a registration cannot starve either."""
        if expected is None:
            return None
        fits = not order or now + expected <= cycle_end
        if not fits and self.cycles - self._last_probe_cycle < self._config.overrun_every_cycles:
            return None
        self._last_probe_cycle = self.cycles
        return Action("probe", None, profiled_ms=expected)
