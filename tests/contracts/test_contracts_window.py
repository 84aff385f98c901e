"""contracts.window.SortedWindow: the quantiles of sorting the last N values, without it."""

from __future__ import annotations

import math
import random
from collections import deque

from contracts.window import SortedWindow


def test_quantiles_equal_sorting_the_window() -> None:
    rng = random.Random(0)
    window, plain = SortedWindow(50), deque(maxlen=50)
    for i in range(500):
        value = rng.choice([rng.expovariate(1.0), 1.0, 2.0, math.inf])  # repeats too
        window.append(value)
        plain.append(value)
        ordered = sorted(plain)
        assert len(window) == len(ordered)
        for q in (0.0, 0.5, 0.9, 0.99, 1.0):
            assert window.quantile(q) == ordered[min(len(ordered) - 1, int(q * len(ordered)))]
        assert window.largest() == ordered[-1], i


def test_nan_is_not_kept() -> None:
    window = SortedWindow(3)
    for value in (1.0, math.nan, 2.0):
        window.append(value)
    assert len(window) == 2 and window.quantile(0.99) == 2.0
