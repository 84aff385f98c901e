"""The request-deadline headers of the inference API (server, session proxy, clients).

- ``X-Tandem-Timeout-Ms: N``: the client's budget, N ms (0 < N <= 600000) from
  when the request arrived. The server answers by then or not at all: a request
  that cannot make it is answered 503 (``deadline_expired``, ``deadline_missed``
  or ``timeout``). An SLO session's deadline is the earlier of this and its SLO.
- ``X-Tandem-Deadline: T``: the same as an absolute time, T in ms since the Unix
  epoch (this host's wall clock; for clients whose clock is synchronised with the
  server's). Unlike the budget, it also counts time the request spent before the
  server accepted its connection. With both, the earlier deadline holds.
- ``X-Tandem-Late: accept``: outputs that finish after the deadline are still
  sent, with status 200 and the answer header ``X-Tandem-Late: true``. Without
  it no 200 is sent after the deadline.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping

from contracts.window import SortedWindow

TIMEOUT_HEADER = "X-Tandem-Timeout-Ms"
DEADLINE_HEADER = "X-Tandem-Deadline"
LATE_HEADER = "X-Tandem-Late"
MAX_TIMEOUT_MS = 600_000.0


class DeadlineHeaderError(ValueError):
    """A deadline header is malformed; the message says what is allowed."""


def _number(raw: str) -> float:
    """A header's number, NaN when it is not one (every range check then refuses it)."""
    try:
        return float(raw)
    except ValueError:
        return math.nan


def client_budget_ms(headers: Mapping[str, str]) -> float | None:
    """The ``X-Tandem-Timeout-Ms`` value in ms, None when absent."""
    raw = headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    value = _number(raw)
    if not 0 < value <= MAX_TIMEOUT_MS:
        raise DeadlineHeaderError(
            f"{TIMEOUT_HEADER} must be a number of ms in (0, {MAX_TIMEOUT_MS:.0f}]")
    return value


def absolute_deadline_left_ms(headers: Mapping[str, str], now_unix_ms: float) -> float | None:
    """Ms left until the ``X-Tandem-Deadline`` time (<= 0: passed), None when absent."""
    raw = headers.get(DEADLINE_HEADER)
    if raw is None:
        return None
    value = _number(raw)
    left = value - now_unix_ms
    if not math.isfinite(value) or left > MAX_TIMEOUT_MS:
        raise DeadlineHeaderError(f"{DEADLINE_HEADER} must be a time in ms since the Unix "
                                  f"epoch, at most {MAX_TIMEOUT_MS:.0f} ms ahead")
    return left


def accepts_late(headers: Mapping[str, str]) -> bool:
    """Whether the client asked for late answers (``X-Tandem-Late: accept``)."""
    raw = headers.get(LATE_HEADER)
    if raw is None:
        return False
    if raw.strip().lower() != "accept":
        raise DeadlineHeaderError(f"{LATE_HEADER} must be 'accept' when given")
    return True


class AnswerReserve:
    """What the last deadline check before a 200 keeps for the answer to reach the client.

    The answer is written after that check, and the client still has to be woken to
    read it, so a 200 is sent only if the deadline less this reserve has not passed.
    The reserve is the larger of a floor (measured on this host at start-up: a
    thread's wake-up tail and a small write) and the observed ``quantile`` of the
    time from the check to the answer written, over every answer (errors too, so a
    server that answers few 200s still learns it); before ``min_samples`` answers
    the largest one seen stands in for the quantile. Thread-safe.
    """

    def __init__(self, floor_ms: float = 0.0, quantile: float = 0.99, window: int = 2000,
                 min_samples: int = 50):
        self.floor_ms = floor_ms
        self._quantile = quantile
        self._min_samples = min_samples
        self._seen = SortedWindow(window)
        self._lock = threading.Lock()

    def observe(self, write_ms: float) -> None:
        """One answer's time from the last check until it was written."""
        if math.isfinite(write_ms) and write_ms >= 0:
            with self._lock:
                self._seen.append(write_ms)

    def reserve_ms(self) -> float:
        """The time the last check keeps back from the deadline (ms)."""
        with self._lock:
            if not self._seen:
                return self.floor_ms
            if len(self._seen) < self._min_samples:
                return max(self.floor_ms, self._seen.largest())
            return max(self.floor_ms, self._seen.quantile(self._quantile))

    def too_late(self, now_ms: float, deadline_ms: float | None) -> bool:
        """Whether a 200 written from ``now_ms`` would reach the client after the deadline."""
        return deadline_ms is not None and now_ms + self.reserve_ms() > deadline_ms
