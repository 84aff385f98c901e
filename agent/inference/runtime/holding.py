"""Holding what was admitted while the host changes: each SLO session's held rate.

Admission sees the host as it was when a session registered. If the host gets
busier later (another process takes the cores, the request path's waits grow),
requests start to miss at the server: dropped where they waited, answered after
their deadline's reserve, or timed out. Rather than keep missing, the server
scales the session down: it holds a lower rate, and requests above it are
answered at once with 503 ``scaled_down`` (the client's cue to go elsewhere),
which relieves the executor and the request path for the rest.

The rule, reviewed once per rate window from the session's own outcomes at the
server (not from a model of the host, so whatever made the host busier counts):

- more than ``overload`` (half) of the window's requests missed: the host cannot
  serve this rate at all, so halve the held rate (below ``min_rps``: hold none)
  and start a new window. A scale-down sheds half of the session's requests, so
  it pays only where more than that are lost anyway; fewer misses (a noisy host
  makes a few requests late) are each dropped where they cannot meet their
  deadline, and cost the session nothing else (best effort gives way for them
  first, ``sacrifice.py``);
- misses within ``1 - target`` since the last change, at least ``cooldown_ms``
  ago, over a quarter window of requests (or none held): raise the held rate by
  half (at least to ``min_rps``), up to the admitted rate.

The held rate is enforced by a token bucket (``burst_s`` seconds of tokens).
Not thread-safe: the runtime calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from agent.inference.errors import DropReason

MISSES = frozenset({DropReason.DEADLINE_EXPIRED, DropReason.EARLY_DROP,
                    DropReason.DEADLINE_MISSED, DropReason.TIMEOUT, DropReason.QUEUE_FULL})
"""Outcomes that count as a miss of the session's deadline at the server."""


@dataclass(frozen=True)
class HoldRule:
    """When to scale a session down and back up."""

    target: float = 0.99
    window: int = 200
    min_rps: float = 1.0
    cooldown_ms: float = 5000.0
    burst_s: float = 0.5
    overload: float = 0.5
    """Share of a window missed beyond which the rate cannot be held (scale down)."""


class Hold:
    """One SLO session's held rate, its recent outcomes and why it was scaled down."""

    def __init__(self, admitted_rps: float, now_ms: float, rule: HoldRule | None = None):
        self.rule = rule or HoldRule()
        self.admitted_rps = admitted_rps
        self.rate_rps = admitted_rps
        self.reason: str | None = None
        """Why the held rate is below the admitted one (None: it is not)."""
        self.scale_downs = 0
        self.shed = 0
        self.misses_total = 0
        self.outcomes_total = 0
        """Every miss and every outcome counted since registration (the order of sacrifice
        looks at what came since its last review)."""
        self._outcomes: deque[bool] = deque(maxlen=self.rule.window)
        self._tokens = self._burst()
        self._refilled_ms = now_ms
        self._changed_ms = now_ms

    def _burst(self) -> float:
        return max(1.0, self.rate_rps * self.rule.burst_s)

    def take(self, now_ms: float) -> bool:
        """Whether a request arriving now is within the held rate (it takes a token)."""
        if self.reason is None:
            return True
        self._tokens = min(self._burst(), self._tokens
                           + (now_ms - self._refilled_ms) * self.rate_rps / 1000.0)
        self._refilled_ms = now_ms
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.shed += 1
        return False

    def outcome(self, missed: bool) -> None:
        """One request's outcome at the server."""
        self._outcomes.append(missed)
        self.misses_total += missed
        self.outcomes_total += 1

    def missed(self) -> int:
        """Misses in the window the rule looks at."""
        return sum(self._outcomes)

    def window_seen(self) -> int:
        """Outcomes in the window the rule looks at."""
        return len(self._outcomes)

    def over_target(self) -> bool:
        """More than ``1 - target`` of the window missed (over at least a quarter of it)."""
        rule, seen = self.rule, self._outcomes
        return len(seen) >= rule.window * 0.25 and sum(seen) > (1.0 - rule.target) * rule.window

    def overloaded(self) -> bool:
        """More than ``overload`` of the window missed (over at least a quarter of it):
        the host cannot serve this rate, and shedding half saves more than it costs."""
        rule, seen = self.rule, self._outcomes
        return len(seen) >= rule.window * 0.25 and sum(seen) > rule.overload * len(seen)

    def may_raise(self, now_ms: float) -> bool:
        """Scaled down, misses within the target since the last change, the cool-down
        passed, and a quarter window answered (or none held, so none could be)."""
        seen = self._outcomes
        return (self.reason is not None
                and sum(seen) <= (1.0 - self.rule.target) * self.rule.window
                and now_ms - self._changed_ms >= self.rule.cooldown_ms
                and (len(seen) >= self.rule.window * 0.25 or self.rate_rps == 0.0))

    def scale_down(self, now_ms: float, reason: str) -> None:
        """Halve the held rate (below ``min_rps``: none), saying why."""
        rate = self.rate_rps / 2.0
        self.rate_rps = rate if rate >= self.rule.min_rps else 0.0
        self.reason = (f"{reason}; held at {self.rate_rps:.3g} of the admitted "
                       f"{self.admitted_rps:.3g} rps")
        self.scale_downs += 1
        self.restart(now_ms)

    def scale_up(self, now_ms: float) -> None:
        """Raise the held rate by half (at least to ``min_rps``), up to the admitted rate."""
        self.rate_rps = min(self.admitted_rps, max(self.rate_rps * 1.5, self.rule.min_rps))
        if self.rate_rps >= self.admitted_rps:
            self.reason = None
        self.restart(now_ms)

    def restart(self, now_ms: float) -> None:
        """A new window of outcomes from now (after a change, or a miss dealt with)."""
        self._outcomes.clear()
        self._changed_ms = self._refilled_ms = now_ms
        self._tokens = min(self._tokens, self._burst())

    def review(self, now_ms: float, why: str) -> bool:
        """Scale down or back up by the rule, this session alone; True when the held rate
        changed. ``why``: the host's state now, for the reason shown with a scale-down.
        (A server with several sessions decides who gives way: ``sacrifice.py``.)"""
        if self.overloaded():
            self.scale_down(now_ms, f"HostBusier: {self.missed()} of the last "
                                    f"{len(self._outcomes)} requests missed their deadline "
                                    f"at the server ({why})")
        elif self.may_raise(now_ms):
            self.scale_up(now_ms)
        else:
            return False
        return True

    def to_json(self) -> dict[str, Any]:
        """The session's entry in GET /v1/sessions under ``held``."""
        return {"rate_rps": self.rate_rps, "admitted_rps": self.admitted_rps,
                "scaled_down": self.reason is not None, "reason": self.reason,
                "scale_downs": self.scale_downs, "shed": self.shed,
                "recent_misses": sum(self._outcomes), "recent_requests": len(self._outcomes)}
