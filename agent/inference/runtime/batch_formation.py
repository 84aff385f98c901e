"""Batch formation for SLO sessions: Nexus's early drop (sliding window) and lazy drop.

Both take the session's FIFO queue, the time now, the planned batch size and
``l(b)``, and return the batch to run plus the requests to drop. Pure functions:
the runtime calls them under its lock and resolves the drops outside it.

- Early drop (Nexus Section 6.3): slide a window of the planned batch size along
  the queue and stop at the first request whose deadline allows the whole window's
  batch latency. Requests skipped on the way would force a sub-optimal batch; of
  those, only the ones that cannot meet their deadline even in a batch of one are
  dropped, the rest stay queued and may still be served when the queue is short.
- Lazy drop (Clipper; Nexus's baseline): drop only requests past saving, then size
  the batch by the oldest request's remaining budget.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class DropPolicy(enum.Enum):
    """How a session's batch is formed from its queue."""

    EARLY = "early"
    LAZY = "lazy"


@dataclass(eq=False)
class Request:
    """One queued inference request (a single sample for SLO sessions)."""

    session: str
    tensor: Any  # np.ndarray; typed loosely to keep this module numpy-free
    arrival_ms: float
    deadline_ms: float | None
    """The executor's deadline: the client's less the time its answer needs to go back."""
    on_done: Callable[[Any], None] = field(repr=False)
    late_ok: bool = False
    """The client asked for the outputs even when they are ready after the deadline."""
    inline: bool = False
    """``on_done`` only wakes a waiter (a future's result): the executor's thread answers
    it itself, saving the hand-off to a post-processing thread (one thread wake-up)."""


def _fits(req: Request, now_ms: float, latency_ms: float) -> bool:
    return req.deadline_ms is None or now_ms + latency_ms <= req.deadline_ms


def form_batch(
    queue: deque[Request],
    now_ms: float,
    batch: int,
    latency_ms: Callable[[int], float],
    policy: DropPolicy,
) -> tuple[list[Request], list[Request]]:
    """Take the next batch (at most ``batch`` requests) off ``queue``; returns (batch, dropped)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if policy is DropPolicy.LAZY:
        return _lazy(queue, now_ms, batch, latency_ms)
    return _early(queue, now_ms, batch, latency_ms)


def _early(
    queue: deque[Request], now_ms: float, batch: int, latency_ms: Callable[[int], float]
) -> tuple[list[Request], list[Request]]:
    items = list(queue)
    start = len(items)
    for i, req in enumerate(items):
        window = min(batch, len(items) - i)
        if _fits(req, now_ms, latency_ms(window)):
            start = i
            break
    window = min(batch, len(items) - start)
    chosen = items[start : start + window]
    one = latency_ms(1)
    kept: list[Request] = []
    dropped: list[Request] = []
    for req in items[:start]:
        (kept if _fits(req, now_ms, one) else dropped).append(req)
    queue.clear()
    queue.extend(kept)
    queue.extend(items[start + window :])
    return chosen, dropped


def _lazy(
    queue: deque[Request], now_ms: float, batch: int, latency_ms: Callable[[int], float]
) -> tuple[list[Request], list[Request]]:
    dropped: list[Request] = []
    one = latency_ms(1)
    while queue and not _fits(queue[0], now_ms, one):
        dropped.append(queue.popleft())
    if not queue:
        return [], dropped
    size = min(batch, len(queue))
    while size > 1 and not _fits(queue[0], now_ms, latency_ms(size)):
        size -= 1
    return [queue.popleft() for _ in range(size)], dropped
