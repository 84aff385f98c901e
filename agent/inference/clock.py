"""Clocks the executor loop runs on: the machine's monotonic clock or a virtual one.

The virtual clock makes scheduling tests deterministic and fast: the simulated
executor "runs" a batch by advancing it, and the replay driver jumps it to the
next arrival when the GPU is idle.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic milliseconds and a way to let time pass."""

    def now_ms(self) -> float:
        """Current time in milliseconds (monotonic, arbitrary origin)."""
        ...

    def sleep_ms(self, duration_ms: float) -> None:
        """Let ``duration_ms`` pass."""
        ...


class MonotonicClock:
    """The machine's monotonic clock."""

    def now_ms(self) -> float:
        """Current monotonic time in ms."""
        return time.monotonic() * 1000.0

    def sleep_ms(self, duration_ms: float) -> None:
        """Sleep for real."""
        if duration_ms > 0:
            time.sleep(duration_ms / 1000.0)


class VirtualClock:
    """Simulated time: ``sleep_ms`` advances it instantly."""

    def __init__(self, start_ms: float = 0.0):
        self._now_ms = float(start_ms)
        self._lock = threading.Lock()

    def now_ms(self) -> float:
        """Current virtual time in ms."""
        return self._now_ms

    def sleep_ms(self, duration_ms: float) -> None:
        """Advance virtual time by ``duration_ms``."""
        if duration_ms > 0:
            with self._lock:
                self._now_ms += duration_ms

    def advance_to(self, when_ms: float) -> None:
        """Jump forward to ``when_ms`` (never backwards)."""
        with self._lock:
            self._now_ms = max(self._now_ms, float(when_ms))
