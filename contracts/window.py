"""The last N values of a measurement, kept in order, so a quantile read is one index.

The inference server reads several quantiles of its request path (the write reserve, the
executor-to-worker crossing, the answer's way back) on every request, over windows of
2,000 values; sorting the window for each read was about a fifth of a request's CPU at
the SLO trio's rates (``benchmarks/serving_path_cpu.py``). Here each new value is
inserted into a sorted copy and the oldest removed, by bisection.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque


class SortedWindow:
    """The last ``maxlen`` values, in arrival order and sorted. NaN is not kept (it has
    no place in an order). Not thread-safe: callers hold their own lock."""

    def __init__(self, maxlen: int):
        self._arrived: deque[float] = deque(maxlen=maxlen)
        self._sorted: list[float] = []

    def append(self, value: float) -> None:
        if value != value:  # NaN
            return
        if len(self._arrived) == self._arrived.maxlen:
            del self._sorted[bisect_left(self._sorted, self._arrived[0])]
        self._arrived.append(value)
        insort(self._sorted, value)

    def __len__(self) -> int:
        return len(self._sorted)

    def quantile(self, q: float) -> float:
        """The value at rank ``int(q * n)`` of the ``n`` held (the largest for q >= 1)."""
        ordered = self._sorted
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def largest(self) -> float:
        return self._sorted[-1]
