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

Decisions are made under the runtime's lock and change only loop state; the
runtime (``runtime.py``) owns that state, this mixin reads and advances it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from agent.inference.batch_formation import DropPolicy, Request, form_batch
from agent.inference.errors import DropReason
from agent.inference.quanta import QuantaScheduler
from agent.inference.session_state import Action, BestEffortState, InFlight, RuntimeConfig, SloState
from planner import GpuPlan


class DutyCycle:
    """The decision half of the executor loop (mixed into ``ServingRuntime``)."""

    config: RuntimeConfig
    plan: GpuPlan | None
    quanta: QuantaScheduler
    overruns: int
    overruns_refused: int
    overrun_headroom_ms: float
    _slo: dict[str, SloState]
    _be: dict[str, BestEffortState]
    _probes: deque[tuple[Callable[[], Any], float, Future[Any]]]
    _drops: list[tuple[Request, DropReason]]
    _cycle_start_ms: float
    _cycle_pos: int
    _cycles: int
    _last_be_cycle: int
    _last_probe_cycle: int

    def _decide(self, now: float) -> Action | None:
        order = [a.session.name for a in self.plan.allocations] if self.plan else []
        for _ in range(2):  # at most one cycle restart per decision
            while self._cycle_pos < len(order):
                sess = self._slo.get(order[self._cycle_pos])
                self._cycle_pos += 1
                if sess is None or not sess.queue:
                    continue
                action = self._batch_action(sess, now)
                if action is not None:
                    return action
            cycle_end = (
                self._cycle_start_ms + self.plan.duty_cycle_ms if order and self.plan else math.inf
            )
            overflow = self._overflow_batch(order, now, cycle_end)
            if overflow is not None:
                return overflow
            probe = self._next_probe(order, now, cycle_end)
            if probe is not None:
                return probe
            segment = self._next_segment(now, cycle_end)
            if segment is not None:
                return segment
            # Waiting probes do not hold SLO requests to the cycle's end, as best-effort
            # work does: they only fill time no SLO request wants.
            be_waiting = any(b.runnable() for b in self._be.values())
            slo_waiting = any(s.queue for s in self._slo.values())
            if not order or not (now >= cycle_end or (slo_waiting and not be_waiting)):
                return None
            self._cycle_start_ms = now
            self._cycle_pos = 0
            self._cycles += 1
        return None

    def _overflow_batch(self, order: list[str], now: float, cycle_end: float) -> Action | None:
        """Slack goes to SLO requests left over by a burst before best-effort work.

        A Poisson burst leaves more than ``b`` requests; waiting a whole cycle would
        make them miss ``d + l(b)``. An extra batch that ends before the cycle does
        delays nobody's next slot, so it only takes time best effort would have had.
        """
        for name in order:
            sess = self._slo.get(name)
            if sess is None or not sess.queue:
                continue
            size = min(len(sess.queue), sess.batch)
            if now + sess.profile.latency_ms(size) > cycle_end:
                continue
            action = self._batch_action(sess, now)
            if action is not None:
                return action
        return None

    def _batch_action(self, sess: SloState, now: float) -> Action | None:
        """The session's next batch under the drop policy, counting what it drops."""
        batch, dropped = form_batch(
            sess.queue, now, sess.batch, sess.profile.latency_ms, self.config.drop_policy
        )
        self._record_drops(sess, dropped)
        return Action("batch", sess, batch) if batch else None

    def _record_drops(self, sess: SloState, dropped: list[Request]) -> None:
        reason = (
            DropReason.EARLY_DROP
            if self.config.drop_policy is DropPolicy.EARLY
            else DropReason.DEADLINE_EXPIRED
        )
        for req in dropped:
            sess.stats.record_drop(reason)
            self._drops.append((req, reason))

    def _next_segment(self, now: float, cycle_end: float) -> Action | None:
        name = self.quanta.select([n for n, b in self._be.items() if b.runnable()])
        if name is None:
            return None
        be = self._be[name]
        if be.current is None:
            req = be.queue.popleft()
            items = int(req.tensor.shape[0]) if getattr(req.tensor, "ndim", 0) else 1
            whole = be.profile.latency_ms(min(max(items, 1), be.profile.max_batch))
            whole *= math.ceil(max(items, 1) / be.profile.max_batch)
            target = self.quanta.quantum_ms * self.config.segment_fraction_of_quantum
            costs = be.loaded.segment_costs_ms(whole, target)
            be.current = InFlight(req, costs, 0, {be.loaded.input_name: req.tensor})
        cost = be.current.costs_ms[be.current.index]
        # Profiled fractions of l(b) drift from what a segment takes at this batch on
        # this device; the job's observed measured/profiled ratio corrects the estimate.
        expected = cost * be.cost_scale
        if now + expected > cycle_end and not self._may_overrun(now + expected - cycle_end):
            return None  # would push the next SLO cycle back: wait for it
        if now + expected > cycle_end:
            self.overruns += 1
        self._last_be_cycle = self._cycles
        return Action("segment", be, profiled_ms=cost)

    def _may_overrun(self, push_ms: float) -> bool:
        """A segment that found no room for N whole cycles may overrun this one, or it
        might never run: best effort gets a bounded share (one overrun per N cycles)
        instead of starving. The SLO sessions' next slot then moves back by ``push_ms``,
        so with SLO sessions it may only where the plan keeps that much headroom
        (``plan_with_headroom``): an overrun never makes an SLO session miss. Admission
        refuses jobs that could run no other way (``planner.overrun``)."""
        if self._slo and push_ms > self.overrun_headroom_ms + 1e-6:
            self.overruns_refused += 1
            return False
        return self._cycles - self._last_be_cycle >= self.config.overrun_every_cycles

    def _next_probe(self, order: list[str], now: float, cycle_end: float) -> Action | None:
        """A registration's probe slice, if one waits and fits before the next cycle.

        Probes go before best-effort segments (a registration is waiting on them) but
        after every SLO batch; one that never fits overruns like a segment, one cycle
        in ``overrun_every_cycles``, so a registration cannot starve either."""
        if not self._probes:
            return None
        expected = self._probes[0][1]
        fits = not order or now + expected <= cycle_end
        if not fits and self._cycles - self._last_probe_cycle < self.config.overrun_every_cycles:
            return None
        self._last_probe_cycle = self._cycles
        return Action("probe", None, profiled_ms=expected)
