"""Who gives way when the host cannot hold every session: the order of sacrifice.

Each SLO session's outcomes at the server are kept by its ``Hold``; once a rate
window the runtime asks ``Sacrifice.review`` what to do about them, for the host as
a whole (a busy host is shared: whichever session missed, any load shed relieves it):

1. best-effort work gives way first. When more than ``1 - target`` of the SLO
   requests answered since best effort's share last changed missed (over at least
   ``MIN_REQUESTS``), the share of executor time best-effort segments may take halves;
   a session's misses beyond the hold target (``Hold.over_target``) cut it to none,
   and the SLO sessions lose nothing;
2. only with best effort at none, and only where a session lost more than half of
   its window (``Hold.overloaded``: the host cannot serve the rate, so shedding half
   saves more than it costs), are SLO sessions scaled down, lowest ``priority``
   first; among equals one that missed, else the one registered last (what the
   server admitted first comes first), each with the reason: who missed, and the
   host then. Fewer misses shed nothing more: each request is dropped only where it
   cannot meet its deadline;
3. an SLO session admitted beside best effort starts it at ``FLOOR`` (``admitted``):
   what the server promises first comes first, not after it has missed;
4. back up in the reverse order, one step per cool-down while no session misses
   beyond the target: SLO sessions highest priority first, then best effort's
   share doubles to all.

Olympian's priority and Nexus's admission exist to keep the work a server admitted
with a promise from being shed for work it admitted without one. Pure: the
runtime calls it under its lock with its clock's time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.inference.runtime.holding import Hold, HoldRule

FLOOR = 1.0 / 8.0
"""Below this share best effort runs not at all (and back up it starts here)."""
MIN_REQUESTS = 50
"""SLO requests answered before a share of misses among them halves best effort's."""
THROTTLED_QUEUE = 8
"""Requests a best-effort job may keep waiting while its share is below all: each holds
an HTTP worker the SLO sessions need, and a throttled job's clients send faster than it
is served, so more are answered ``throttled`` at once."""


class BestEffortThrottle:
    """The share of the executor's time best-effort segments may take (1: all the slack).

    A segment starts only when the time accrued at ``share`` since the last one covers
    its expected length: best effort then uses at most ``share`` of the executor."""

    def __init__(self) -> None:
        self.share = 1.0
        self.reason: str | None = None
        """Why the share is below 1 (None: it is not)."""
        self.throttles = 0
        self.blocked: str | None = None
        """Why best effort cannot run at all beside the SLO sessions (None: it can)."""
        self.changed_ms = -math.inf
        self._budget_ms = 0.0
        self._accrued_at_ms: float | None = None

    def allows(self, expected_ms: float, now_ms: float) -> bool:
        """Whether a segment expected to take ``expected_ms`` may start now (it is charged)."""
        if self.share >= 1.0:
            return True
        if self.share <= 0.0:
            return False
        if self._accrued_at_ms is not None:
            self._budget_ms = min(expected_ms, self._budget_ms
                                  + (now_ms - self._accrued_at_ms) * self.share)
        self._accrued_at_ms = now_ms
        if self._budget_ms + 1e-9 < expected_ms:
            return False
        self._budget_ms -= expected_ms
        return True

    @property
    def stopped(self) -> bool:
        return self.share <= 0.0 or self.blocked is not None

    def refuses(self, waiting: int) -> bool:
        """Whether a job with ``waiting`` requests queued answers a new one ``throttled``
        at once: while stopped, or throttled with ``THROTTLED_QUEUE`` already waiting."""
        return self.stopped or (self.share < 1.0 and waiting >= THROTTLED_QUEUE)

    def block(self, reason: str | None) -> None:
        """Hold best effort at none while a job's piece can never run beside the SLO
        sessions' plan (None: it can); waiting for a slot that never comes would only
        hold HTTP workers the SLO sessions need."""
        self.blocked = reason

    def cut(self, now_ms: float, reason: str, to_none: bool) -> None:
        """Halve the share (below ``FLOOR``: none), or stop it outright."""
        half = self.share / 2.0
        self._set(0.0 if to_none or half < FLOOR else half, now_ms)
        self.reason = f"{reason}; best effort may take {self.share:.3g} of the executor"
        self.throttles += 1

    def make_room(self, now_ms: float, reason: str) -> bool:
        """Take at most ``FLOOR`` (where the share is above it); True when it changed."""
        if self.share <= FLOOR:
            return False
        self._set(FLOOR, now_ms)
        self.reason = f"{reason}; best effort may take {self.share:.3g} of the executor"
        self.throttles += 1
        return True

    def restore(self, now_ms: float) -> None:
        """All of the slack again: no SLO session is left to give way to."""
        if self.share < 1.0:
            self._set(1.0, now_ms)
        self.reason = None

    def relax(self, now_ms: float) -> None:
        """Double the share (from none: ``FLOOR``), up to all of the slack."""
        self._set(min(1.0, max(self.share * 2.0, FLOOR)), now_ms)
        if self.share >= 1.0:
            self.reason = None

    def _set(self, share: float, now_ms: float) -> None:
        self.share, self.changed_ms = share, now_ms
        self._budget_ms, self._accrued_at_ms = 0.0, None

    def promised(self) -> dict[str, Any]:
        """What a best-effort job is promised now: this share of the executor, at most."""
        if self.blocked is not None:
            return {"share": 0.0, "reason": self.blocked}
        return {"share": self.share, "reason": self.reason}

    def to_json(self) -> dict[str, Any]:
        return {**self.promised(), "throttled": self.stopped or self.reason is not None,
                "throttles": self.throttles}


@dataclass(frozen=True)
class Held:
    """One SLO session as the review sees it, in registration order."""

    name: str
    priority: int
    hold: Hold


class Sacrifice:
    """The order in which sessions give way to a busy host, and back."""

    def __init__(self, rule: HoldRule | None = None):
        rule = rule or HoldRule()
        self.cooldown_ms = rule.cooldown_ms
        self.target = rule.target
        self.best_effort = BestEffortThrottle()
        self._changed_ms = -math.inf
        self._seen: dict[str, tuple[int, int]] = {}
        """Each session's (misses, outcomes) counted by the last review."""
        self._since: dict[str, list[int]] = {}
        """Each session's [misses, outcomes] since best effort's share last changed."""

    def review(self, now_ms: float, slo: Sequence[Held], best_effort: bool, why: str) -> bool:
        """One rate window's decision; True when a promise changed. ``best_effort``:
        whether a best-effort job is registered; ``why``: the host now, for reasons."""
        self._count(slo)
        over = [h for h in slo if h.hold.over_target()]
        if over and best_effort and not self.best_effort.stopped:
            text = _busier(over, why)
            for h in over:
                h.hold.restart(now_ms)
            self._changed_ms = now_ms
            self.best_effort.cut(now_ms, f"{text}: best effort gives way first", True)
            self._since.clear()
            return True
        over = [h for h in over if h.hold.overloaded()]
        if over:
            text = _busier(over, why)
            for h in over:
                h.hold.restart(now_ms)
            self._changed_ms = now_ms
            victim = self._lowest(slo, over)
            if victim is None:
                return False
            first = "" if victim in over else (f"; {victim.name} gives way first (priority "
                                               f"{victim.priority}, registered later)")
            victim.hold.scale_down(now_ms, text + first)
            return True
        missed, answered = (sum(v[i] for v in self._since.values()) for i in (0, 1))
        if best_effort and not self.best_effort.stopped and answered >= MIN_REQUESTS \
                and missed > (1.0 - self.target) * answered:
            who = ", ".join(f"{n} {m} of {k}" for n, (m, k) in self._since.items() if m)
            self.best_effort.cut(now_ms, f"SloMisses: {missed} of the last {answered} SLO "
                                         f"requests missed at the server ({who}; {why}): "
                                         "best effort gives way first", False)
            self._changed_ms = now_ms
            self._since.clear()
            return True
        if any(h.hold.over_target() for h in slo):
            return False
        return self._recover(now_ms, slo, best_effort)

    def admitted(self, now_ms: float, name: str) -> bool:
        """An SLO session was admitted beside best effort: best effort gives way first,
        before the new session has missed anything (admission planned the session on
        that), and comes back up by ``_recover``'s steps while no session misses."""
        if not self.best_effort.make_room(
                now_ms, f"SloAdmitted: SLO session {name} was admitted beside best effort, "
                        "which gives way first and comes back up while the SLO sessions "
                        "meet their deadlines"):
            return False
        self._changed_ms = now_ms
        self._since.clear()
        return True

    def _count(self, slo: Sequence[Held]) -> None:
        """Add up each session's misses and outcomes since the last review."""
        for h in slo:
            misses, outcomes = self._seen.get(h.name, (0, 0))
            dm, do = h.hold.misses_total - misses, h.hold.outcomes_total - outcomes
            self._seen[h.name] = (h.hold.misses_total, h.hold.outcomes_total)
            since = self._since.setdefault(h.name, [0, 0])
            since[0] += dm
            since[1] += do

    def _recover(self, now_ms: float, slo: Sequence[Held], best_effort: bool) -> bool:
        if now_ms - self._changed_ms < self.cooldown_ms:
            return False
        for h in sorted(slo, key=lambda h: -h.priority):  # stable: registered first first
            if h.hold.may_raise(now_ms):
                h.hold.scale_up(now_ms)
                self._changed_ms = now_ms
                return True
        if any(h.hold.reason is not None for h in slo):
            return False
        bet = self.best_effort
        if bet.share < 1.0 and (best_effort or bet.stopped) \
                and now_ms - bet.changed_ms >= self.cooldown_ms:
            bet.relax(now_ms)
            self._changed_ms = now_ms
            self._since.clear()
            return True
        return False

    @staticmethod
    def _lowest(slo: Sequence[Held], over: Sequence[Held]) -> Held | None:
        """The session that gives way next: lowest priority; among equals one that missed
        (its own misses may be its own doing), then the one registered last."""
        holding = [(i, h) for i, h in enumerate(slo) if h.hold.rate_rps > 0]
        if not holding:
            return None
        return min(holding, key=lambda ih: (ih[1].priority, ih[1] not in over, -ih[0]))[1]


def _busier(over: Sequence[Held], why: str) -> str:
    """The reason a review gives: who missed how much, and the host then."""
    return "HostBusier: " + ", ".join(
        f"{h.hold.missed()} of the last {h.hold.window_seen()} requests of {h.name}"
        for h in over) + f" missed their deadline at the server ({why})"
