"""Deterministic replays in virtual time: arrival streams driven through the real runtime.

The runtime, its executor loop and its batch formation are the production code;
only the clock is virtual and the executor is the profile-driven simulator, so a
minute of GPU serving replays in well under a second of CPU.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from agent.inference.clock import VirtualClock
from agent.inference.errors import SessionNotFound
from agent.inference.runtime.runtime import ServingRuntime
from agent.inference.runtime.stats import Outcome


@dataclass(frozen=True)
class Arrival:
    """One request arriving at ``at_ms`` for ``session``."""

    at_ms: float
    session: str


def uniform_arrivals(
    session: str, rate_rps: float, duration_ms: float, start_ms: float = 0.0
) -> list[Arrival]:
    """Evenly spaced arrivals at ``rate_rps``."""
    gap = 1000.0 / rate_rps
    count = int(duration_ms / gap)
    return [Arrival(start_ms + (i + 0.5) * gap, session) for i in range(count)]


def poisson_arrivals(
    session: str, rate_rps: float, duration_ms: float, seed: int, start_ms: float = 0.0
) -> list[Arrival]:
    """Poisson arrivals at mean ``rate_rps`` from a seeded generator."""
    rng = random.Random(seed)
    out, t = [], start_ms
    while True:
        t += rng.expovariate(rate_rps / 1000.0)
        if t >= start_ms + duration_ms:
            return out
        out.append(Arrival(t, session))


def merge(*streams: Iterable[Arrival]) -> list[Arrival]:
    """All streams in time order (stable by session name for equal times)."""
    return sorted((a for s in streams for a in s), key=lambda a: (a.at_ms, a.session))


def replay(
    runtime: ServingRuntime,
    clock: VirtualClock,
    arrivals: Sequence[Arrival],
    until_ms: float,
    tensor: Callable[[str], np.ndarray] | None = None,
    on_done: Callable[[str, Outcome], None] | None = None,
    hooks: Sequence[tuple[float, Callable[[], None]]] = (),
    max_steps: int = 10_000_000,
) -> int:
    """Drive ``runtime`` through ``arrivals`` until ``until_ms``; returns the steps taken.

    ``hooks`` are ``(time_ms, fn)`` calls made once virtual time reaches them (add or
    remove a session under load). The step bound keeps a broken loop from hanging.
    """
    make = tensor or (lambda _s: np.zeros((1, 1), dtype=np.float32))
    pending_hooks = sorted(hooks, key=lambda h: h[0])
    i = h = steps = 0
    while steps < max_steps:
        now = clock.now_ms()
        while h < len(pending_hooks) and pending_hooks[h][0] <= now:
            pending_hooks[h][1]()
            h += 1
        while i < len(arrivals) and arrivals[i].at_ms <= now:
            arrival = arrivals[i]
            callback = (lambda o, s=arrival.session: on_done(s, o)) if on_done else (lambda o: None)
            # A session removed by a hook: its remaining traffic stops counting.
            with contextlib.suppress(SessionNotFound):
                runtime.submit(arrival.session, make(arrival.session), callback, arrival.at_ms)
            i += 1
        if now >= until_ms:
            return steps
        steps += 1
        if runtime.step():
            continue
        candidates = [until_ms]
        if i < len(arrivals):
            candidates.append(arrivals[i].at_ms)
        if h < len(pending_hooks):
            candidates.append(pending_hooks[h][0])
        wake = runtime.next_wakeup_ms()
        if wake is not None and wake > now:
            candidates.append(wake)
        clock.advance_to(max(now + 1e-6, min(candidates)))
    raise RuntimeError(f"replay did not finish within {max_steps} steps")
