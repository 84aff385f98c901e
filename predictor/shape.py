"""One piecewise-linear function from sorted points, shared by every curve in tandem.

Interference-curve tables, measured batching-profile tables and score shapes all
use this helper (the idea of kube-scheduler's ``helper/shape_score.go``). Outside
the given points the value is held at the nearest end point, never extrapolated:
callers that need another rule (a batching table's largest batch, say) check the
domain themselves.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class ShapeError(ValueError):
    """The points do not describe a function: empty, unsorted or not finite."""

    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


def validate_points(points: Iterable[Sequence[float]], path: str = "points") -> list[str]:
    """Return every problem with ``points`` as ``path[i]: message`` strings (empty if valid)."""
    problems: list[str] = []
    rows = list(points)
    if not rows:
        return [f"{path}: at least one point is required"]
    previous_x: float | None = None
    for i, row in enumerate(rows):
        if len(row) != 2:
            problems.append(f"{path}[{i}]: expected [x, y], got {len(row)} values")
            continue
        try:
            x, y = float(row[0]), float(row[1])
        except (TypeError, ValueError):
            problems.append(f"{path}[{i}]: values must be numbers")
            continue
        if not (math.isfinite(x) and math.isfinite(y)):
            problems.append(f"{path}[{i}]: values must be finite")
            continue
        if previous_x is not None and x <= previous_x:
            problems.append(
                f"{path}[{i}]: x={x:g} is not greater than the previous x={previous_x:g}"
            )
        previous_x = x
    return problems


@dataclass(frozen=True)
class PiecewiseLinear:
    """A function through sorted (x, y) points, linear between them, flat outside."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def from_points(
        cls, points: Iterable[Sequence[float]], path: str = "points"
    ) -> PiecewiseLinear:
        """Build from [[x, y], ...]; raises ShapeError listing every problem."""
        rows = [tuple(r) for r in points]
        problems = validate_points(rows, path)
        if problems:
            raise ShapeError(problems)
        return cls(tuple(float(r[0]) for r in rows), tuple(float(r[1]) for r in rows))

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    @property
    def domain(self) -> tuple[float, float]:
        """The x range the points cover."""
        return self.xs[0], self.xs[-1]


def scale_to_score(value: float, worst: float, best: float, max_score: int = 10) -> int:
    """Map ``value`` linearly onto the integers 0..max_score, ``best`` -> max_score.

    Works for either orientation (best < worst for costs). Always returns a Python
    int, because Go's JSON decoder rejects 7.0 for an int64 field.
    """
    if worst == best:
        return max_score
    fraction = (value - worst) / (best - worst)
    fraction = min(1.0, max(0.0, fraction))
    return int(round(fraction * max_score))
