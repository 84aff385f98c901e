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
from collections.abc import Mapping

TIMEOUT_HEADER = "X-Tandem-Timeout-Ms"
DEADLINE_HEADER = "X-Tandem-Deadline"
LATE_HEADER = "X-Tandem-Late"
MAX_TIMEOUT_MS = 600_000.0


class DeadlineHeaderError(ValueError):
    """A deadline header is malformed; the message says what is allowed."""


def client_budget_ms(headers: Mapping[str, str]) -> float | None:
    """The ``X-Tandem-Timeout-Ms`` value in ms, None when absent."""
    raw = headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT_MS:
        raise DeadlineHeaderError(
            f"{TIMEOUT_HEADER} must be a number of ms in (0, {MAX_TIMEOUT_MS:.0f}]")
    return value


def absolute_deadline_left_ms(headers: Mapping[str, str], now_unix_ms: float) -> float | None:
    """Ms left until the ``X-Tandem-Deadline`` time (<= 0: passed), None when absent."""
    raw = headers.get(DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
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
