"""Online refits of each GPU type's interference curve from co-located observations.

A *point* is one co-located GPU in one agent report: ``x`` the GPU's cumulative
isolated utilisation (the sum of its pods' alone estimates) and ``y`` the mean,
over those pods, of each pod's utilisation alone over its utilisation co-located
(a training job's utilisation tracks its progress rate, so the ratio is its
slowdown; docs/training.md). Points are kept per GPU type, at most
:data:`MAX_POINTS` (the oldest go first), and refitted with
:func:`predictor.curves.fit_partial` under guards:

- no refit before ``min_points`` points (after outliers are dropped);
- a point whose residual from a first fit exceeds ``outlier_mads`` scaled MADs
  is ignored;
- each coefficient moves at most ``max_step`` (relative) per refit, from the
  curve in force (the configured prior before the first refit);
- at most one refit per ``refit_interval_seconds``.

A GPU type's learned curve replaces its configured prior in the cost once it has
been refitted at least once (and ``learning.curves`` is on). Pure apart from the
lock: the extender's :class:`extender.learning.learner.Learner` feeds it and persists it.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from extender.core.cost import CostPolicy
from predictor.curves import (
    CurveFitError,
    InterferenceCurve,
    bounded_step,
    curve_r2,
    fit_partial,
    parse_curve,
)

MAX_POINTS = 400
"""Points kept per GPU type (bounds memory, refit time and the ConfigMap's size)."""
MIN_COLOCATED_UTIL = 1.0
"""A pod's co-located utilisation below this (percent) gives no point: it was not computing."""
SLOWDOWN_RANGE = (0.5, 10.0)
"""Slowdowns are clipped into this range, so one near-idle sample cannot dominate a fit."""
POINT_INTERVAL_SECONDS = 60.0
"""At most one point per GPU per this many seconds (1 Hz reports are not independent)."""
HOLDOUT_EVERY = 5
"""Every fifth point is held out of a refit; the refit is adopted only if it beats the
curve in force on them."""
ANCHOR_MARGIN = 20.0
"""Utilisation points past the highest observed one where the prior is pinned (_anchors)."""
MAX_TRACKED_GPUS = 100_000
MAD_SCALE = 1.4826  # a normal distribution's standard deviation is 1.4826 MADs
MIN_MAD = 0.01  # slowdown units: exact points would otherwise make every other point an outlier


@dataclass(frozen=True)
class CurveGuards:
    """When a refit may happen and how far it may move the curve."""

    min_points: int = 30
    max_step: float = 0.2
    outlier_mads: float = 3.5
    refit_interval_seconds: float = 300.0


@dataclass(frozen=True)
class LearnedCurve:
    """A GPU type's curve in force, how well it explains its points, and when it was fitted."""

    curve: InterferenceCurve
    r2: float
    points: int
    """Inlier points of the last refit."""
    outliers: int
    refitted_at: float
    """Wall-clock seconds of the last refit."""
    refits: int


def colocation_point(pods: list[tuple[float, float]]) -> tuple[float, float] | None:
    """``(cumulative isolated util, slowdown)`` of one shared GPU from its pods' (alone, co):
    the slowdown is the ratio of the sums (a mean of ratios lets the smallest pod's noise
    dominate).

    None when fewer than two pods or a pod was not computing (``MIN_COLOCATED_UTIL``).
    """
    if len(pods) < 2 or any(co < MIN_COLOCATED_UTIL or alone <= 0 for alone, co in pods):
        return None
    lo, hi = SLOWDOWN_RANGE
    total = sum(alone for alone, _ in pods)
    return total, min(max(total / sum(co for _, co in pods), lo), hi)  # ratio of sums


class CurveLearner:
    """Points and learned curves per GPU type; thread-safe."""

    def __init__(self, guards: CurveGuards, wall_clock: Callable[[], float]):
        self.guards = guards
        self.clock = wall_clock
        self._points: dict[str, deque[tuple[float, float]]] = {}
        self._learned: dict[str, LearnedCurve] = {}
        self._last_try: dict[str, float] = {}
        self._last_point: dict[Any, float] = {}
        self._lock = threading.Lock()
        self.rejected_refits = 0
        """Refits not adopted because they did not beat the curve in force on held-out points."""
        self.version = 0
        """Bumped on every change of a learned curve (policy caches key on it)."""
        self.dirty = False

    def add_point(self, gpu_type: str, util_percent: float, slowdown: float,
                  gpu: Any = None) -> bool:
        """Record one co-located point of ``gpu_type``; ``gpu`` (any key of the GPU) gives at
        most one point per :data:`POINT_INTERVAL_SECONDS`. True when recorded."""
        if not (math.isfinite(util_percent) and math.isfinite(slowdown)):
            return False
        now = self.clock()
        with self._lock:
            if gpu is not None:
                if now - self._last_point.get(gpu, -math.inf) < POINT_INTERVAL_SECONDS:
                    return False
                self._last_point[gpu] = now
                if len(self._last_point) > MAX_TRACKED_GPUS:
                    self._last_point.pop(next(iter(self._last_point)))
            points = self._points.setdefault(gpu_type, deque(maxlen=MAX_POINTS))
            points.append((round(util_percent, 3), round(slowdown, 4)))
            self.dirty = True
        return True

    def maybe_refit(self, gpu_type: str, prior: InterferenceCurve) -> bool:
        """Refit ``gpu_type`` if the guards allow; True when its curve changed."""
        g = self.guards
        now = self.clock()
        with self._lock:
            points = list(self._points.get(gpu_type, ()))
            if len(points) < g.min_points or \
                    now - self._last_try.get(gpu_type, -math.inf) < g.refit_interval_seconds:
                return False
            self._last_try[gpu_type] = now
            before = self._learned.get(gpu_type)
        current = before.curve if before is not None else prior
        train = [p for i, p in enumerate(points) if i % HOLDOUT_EVERY]
        held = [p for i, p in enumerate(points) if not i % HOLDOUT_EVERY]
        try:
            fitted = _robust_fit(train, current, prior, g.outlier_mads,
                                 g.min_points * (HOLDOUT_EVERY - 1) // HOLDOUT_EVERY)
        except CurveFitError:
            return False
        if fitted is None:
            return False
        target, inliers = fitted
        stepped = bounded_step(current, target, g.max_step)
        # rounded once here, so what /v1/state shows and the ConfigMap holds is what scores
        curve = InterferenceCurve(**{k: round(v, 6) for k, v in stepped.to_config().items()})
        if _held_out_error(curve, held) >= _held_out_error(current, held):
            with self._lock:
                self.rejected_refits += 1
            return False
        u, y = zip(*inliers, strict=True)
        learned = LearnedCurve(curve, round(curve_r2(curve, u, y), 4), len(inliers),
                               len(train) - len(inliers), now,
                               (before.refits if before is not None else 0) + 1)
        with self._lock:
            self._learned[gpu_type] = learned
            self.version += 1
            self.dirty = True
        return True

    def curves(self) -> dict[str, InterferenceCurve]:
        """The learned curve of each GPU type refitted at least once."""
        with self._lock:
            return {t: c.curve for t, c in self._learned.items()}

    def view(self) -> list[dict[str, Any]]:
        """Per GPU type: curve in force, R^2, points, outliers, last refit (``/v1/state``)."""
        with self._lock:
            types = sorted(set(self._points) | set(self._learned))
            return [_view_row(t, self._learned.get(t), len(self._points.get(t, ())))
                    for t in types]

    # ---- persistence -----------------------------------------------------------------
    def to_document(self) -> list[dict[str, Any]]:
        """The ``curves`` list of the learning document: each type's curve and points."""
        with self._lock:
            types = sorted(set(self._points) | set(self._learned))
            return [{**_view_row(t, self._learned.get(t), len(self._points.get(t, ()))),
                     "data": [list(p) for p in self._points.get(t, ())]} for t in types]

    def load_document(self, rows: Any, merge: bool = False) -> int:
        """Replace points and curves by a persisted ``curves`` list; ValueError when malformed.

        ``merge``: keep, per GPU type, the more recently refitted curve and the
        longer point list of the two (another replica's document into this one's)."""
        if not isinstance(rows, list):
            raise ValueError("learning document: curves must be a list")
        points: dict[str, deque[tuple[float, float]]] = {}
        learned: dict[str, LearnedCurve] = {}
        for i, row in enumerate(rows):
            gpu_type, pts, curve = _parse_row(row, f"curves[{i}]")
            points[gpu_type] = deque(pts, maxlen=MAX_POINTS)
            if curve is not None:
                learned[gpu_type] = curve
        with self._lock:
            if merge:
                for t, mine in self._points.items():
                    if len(mine) > len(points.get(t, ())):
                        points[t] = mine
                for t, curve in self._learned.items():
                    if t not in learned or curve.refitted_at > learned[t].refitted_at:
                        learned[t] = curve
            self._points, self._learned = points, learned
            self._last_try = {t: c.refitted_at for t, c in learned.items()}
            self.version += 1
            self.dirty = False
        return len(rows)


def _robust_fit(points: list[tuple[float, float]], current: InterferenceCurve,
                prior: InterferenceCurve, k: float, min_points: int,
                ) -> tuple[InterferenceCurve, list[tuple[float, float]]] | None:
    """Fit, drop points beyond ``k`` scaled MADs of the residuals, fit the inliers again
    with the prior pinned outside their range (:func:`_anchors`)."""
    u = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    first = fit_partial(u, y, current)
    resid = y - np.array([first.slowdown(v) for v in u])
    centre = float(np.median(resid))
    mad = max(float(np.median(np.abs(resid - centre))), MIN_MAD)
    keep = np.abs(resid - centre) <= k * MAD_SCALE * mad
    if int(keep.sum()) < min_points:
        return None
    inliers = [p for p, kept in zip(points, keep, strict=True) if kept]
    au, ay = _anchors(u[keep], prior)
    return fit_partial(np.concatenate([u[keep], au]), np.concatenate([y[keep], ay]),
                       current), inliers


def _anchors(u: np.ndarray, prior: InterferenceCurve) -> tuple[np.ndarray, np.ndarray]:
    """The prior's slowdown on a grid (every 10% up to 300%) outside the observed
    utilisations (more than :data:`ANCHOR_MARGIN` points beyond them), in the regimes
    (below or above 100%) the points cover, as many anchors as points: a fit then follows
    the points where they are and stays at the prior away from them (a line fitted on
    45-70% says little about 100%, a quadratic fitted on 100-120% nothing about 200%)."""
    lo, hi = float(u.min()) - ANCHOR_MARGIN, float(u.max()) + ANCHOR_MARGIN
    below, above = bool((u <= 100.0).any()), bool((u > 100.0).any())
    grid = [x for x in range(0, 301, 10) if (x < lo or x > hi)
            and (below if x <= 100 else above)]
    if not grid:
        return np.zeros(0), np.zeros(0)
    au = np.repeat(np.array(grid, dtype=float), max(1, len(u) // len(grid)))
    return au, np.array([prior.slowdown(float(x)) for x in au])


def _held_out_error(curve: InterferenceCurve, held: list[tuple[float, float]]) -> float:
    """Median absolute error of ``curve`` on the held-out points (robust to outliers)."""
    if not held:
        return 0.0
    return float(np.median([abs(curve.slowdown(u) - s) for u, s in held]))


def _view_row(gpu_type: str, learned: LearnedCurve | None, pending: int) -> dict[str, Any]:
    row: dict[str, Any] = {"gpu_type": gpu_type, "points_held": pending}
    if learned is None:
        return {**row, "curve": None, "r2": None, "points": 0, "outliers": 0,
                "refitted_at": None, "refits": 0}
    return {**row, "curve": learned.curve.to_config(),
            "r2": learned.r2, "points": learned.points, "outliers": learned.outliers,
            "refitted_at": round(learned.refitted_at, 3), "refits": learned.refits}


def _parse_row(row: Any, path: str) -> tuple[str, list[tuple[float, float]], LearnedCurve | None]:
    if not isinstance(row, Mapping) or not isinstance(row.get("gpu_type"), str):
        raise ValueError(f"learning document: {path}: needs a gpu_type")
    try:
        pts = [(float(u), float(s)) for u, s in row.get("data") or []]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"learning document: {path}.data: {exc!r}") from None
    if not all(math.isfinite(u) and math.isfinite(s) for u, s in pts):
        raise ValueError(f"learning document: {path}.data: points must be finite")
    if row.get("curve") is None:
        return row["gpu_type"], pts, None
    problems: list[str] = []
    curve = parse_curve(row["curve"], f"{path}.curve", problems)
    try:
        learned = LearnedCurve(curve, float(row["r2"]), int(row["points"]), int(row["outliers"]),
                               float(row["refitted_at"]), int(row["refits"]))
    except (KeyError, TypeError, ValueError) as exc:
        problems.append(f"{path}: {exc!r}")
    if problems:
        raise ValueError(f"learning document: {'; '.join(problems)}")
    return row["gpu_type"], pts, learned


class SharedGpuPoints:
    """Turns one report's shared GPUs into points (``ObservationStore.observe_gpu``'s hook)."""

    def __init__(self, curves: CurveLearner, trusted_alone: Callable[[Any], float | None]):
        self._curves = curves
        self._alone = trusted_alone
        self.touched: set[str] = set()

    def __call__(self, pods: list[tuple[Any, float]], gpu: Any = None) -> None:
        """One shared GPU (``gpu``: its key): ``(key, co-located utilisation)`` per pod, keys
        holding the GPU type at index 3."""
        alone = [self._alone(key) for key, _ in pods]
        if any(a is None for a in alone):
            return  # the GPU's cumulative isolated utilisation is not known yet
        found = colocation_point([(float(a or 0), co) for a, (_, co) in zip(alone, pods,
                                                                           strict=True)])
        if found is not None:
            gpu_type = pods[0][0][3]
            if self._curves.add_point(gpu_type, *found, gpu=gpu):
                self.touched.add(gpu_type)

    def refit(self, prior: Callable[[str], InterferenceCurve]) -> None:
        """Try a refit of each GPU type that got a point (the guards decide)."""
        for gpu_type in sorted(self.touched):
            self._curves.maybe_refit(gpu_type, prior(gpu_type))


class LearnedPolicy:
    """A cost policy with the learned curves overlaid, rebuilt only when something changed."""

    def __init__(self, curves: CurveLearner):
        self._curves = curves
        self._cache: tuple[CostPolicy, int, CostPolicy] | None = None

    def __call__(self, base: CostPolicy, on: bool) -> CostPolicy:
        """``base`` itself when off or nothing is learned, else ``base.with_curves(learned)``."""
        version = self._curves.version
        if not on or version == 0:
            return base
        cached = self._cache
        if cached is not None and cached[0] is base and cached[1] == version:
            return cached[2]
        policy = base.with_curves(self._curves.curves())
        self._cache = (base, version, policy)
        return policy
