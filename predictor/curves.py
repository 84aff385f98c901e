"""Interference curves: the one curve type, its config form, its fit and its file.

A curve gives the *cost* of a GPU type's cumulative utilisation ``u`` (percent):
the relative JCT increase of co-located jobs, ``slowdown - 1`` (Horus TPDS'21
§3.2, Eq. 9, Fig. 4: 1x-1.5x JCT below full use, 1.5x-3x above). With
``x = u / 100``::

    f(x) = intercept + slope * x                                            x <= 1
    f(x) = intercept + slope + over_slope*(x-1) + over_quadratic*(x-1)^2   x > 1

linear up to full use, quadratic beyond, continuous at 100%. The extender scores
with it (``extender.core.cost``), its config loads it (``cost.curves``,
``cost.default_curve``, ``cost.curves_file``), and ``tandem predictor fit-curves``
fits and writes it, all in this one form, so fitted numbers go into the config
unchanged.

Config form of one curve (every key optional; defaults are the Horus-shaped
default curve)::

    {intercept: 0.0, slope: 0.5, over_slope: 0.5, over_quadratic: 1.0}

Curves file written by :func:`save_curves` (YAML, ``format: tandem.interference-curves/v2``);
``curves`` is exactly the ``cost.curves`` mapping::

    format: tandem.interference-curves/v2
    data_digest: <sha256>
    simulated: false
    fitted_at: '2026-01-01T00:00:00+00:00'
    fit: {<gpu product>: {r2_below: 0.8, r2_above: 0.7, n_below: 40, n_above: 25,
                          domain_percent: [12.0, 260.0]}}
    curves: {<gpu product>: {intercept: 0.01, slope: 0.4, over_slope: 0.45,
                             over_quadratic: 0.9}}

YAML, not JSON: PyYAML reads ``5e-05`` (no dot) as a string, and the file must
load through the same YAML reader as the config; ``yaml.safe_dump`` writes floats
that read back bit for bit.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

CURVES_FORMAT = "tandem.interference-curves/v2"
CURVE_KEYS = ("intercept", "slope", "over_slope", "over_quadratic")


class CurveFitError(ValueError):
    """Too few or invalid points to fit a regime."""


class CurveFileError(ValueError):
    """A curves file cannot be used; ``problems`` lists every one with its path."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class InterferenceCurve:
    """Cost (relative JCT increase) of a GPU type's cumulative utilisation (module doc)."""

    slope: float = 0.5
    """Cost added from 0 to 100% utilisation, linear in x; >= 0. Default 0.5 (~1.5x JCT)."""
    over_slope: float = 0.5
    """Linear growth per 100 points above 100%; >= 0."""
    over_quadratic: float = 1.0
    """Quadratic growth above 100%; >= 0. Default gives cost 2.0 (3x JCT) at 200%."""
    intercept: float = 0.0
    """Cost at 0% (a fit's slowdown there minus 1, near 0); > -1. Default 0."""

    def __call__(self, util_percent: float) -> float:
        """Cost at one cumulative utilisation (scalar form of :func:`curve_costs`)."""
        x = util_percent / 100.0
        if x <= 1.0:
            return self.intercept + self.slope * x
        over = x - 1.0
        # the intercept is added last, in the same order as the vectorised form
        return self.intercept + (self.slope + self.over_slope * over
                                 + self.over_quadratic * over * over)

    def slowdown(self, util_percent: float) -> float:
        """Predicted JCT slowdown factor of co-located jobs: ``1 + cost``."""
        return 1.0 + self(util_percent)

    def coefficients(self) -> tuple[float, float, float, float]:
        """One row of :func:`curve_costs`'s coefficient array."""
        return (self.slope, self.over_slope, self.over_quadratic, self.intercept)

    def to_config(self) -> dict[str, float]:
        """The config form (``cost.curves.<type>``)."""
        return {key: float(getattr(self, key)) for key in CURVE_KEYS}


def coefficient_table(curves: Sequence[InterferenceCurve]) -> np.ndarray:
    """A ``(len(curves), 4)`` array of :meth:`InterferenceCurve.coefficients` rows."""
    return np.array([c.coefficients() for c in curves], dtype=np.float64).reshape(-1, 4)


def curve_costs(util_percent: np.ndarray, coeffs: np.ndarray) -> np.ndarray:
    """Vectorised curve: one (slope, over_slope, over_quadratic[, intercept]) row per GPU.

    Without the intercept column the intercept is 0.
    """
    x = util_percent / 100.0
    over = np.maximum(x - 1.0, 0.0)
    cost = coeffs[:, 0] * np.minimum(x, 1.0) + coeffs[:, 1] * over + coeffs[:, 2] * over * over
    return cost if coeffs.shape[1] < 4 else coeffs[:, 3] + cost


def _number_problem(value: Any, key: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {type(value).__name__}"
    if not math.isfinite(value):
        return f"must be finite (got {value!r})"
    if key == "intercept":
        return None if value > -1 else f"must be > -1 (got {value!r})"
    return None if value >= 0 else f"must be >= 0 (got {value!r})"


def parse_curve(raw: Any, path: str, problems: list[str]) -> InterferenceCurve:
    """Validate one curve's config form, appending ``path.key: message`` problems."""
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: must be a mapping with keys from {', '.join(CURVE_KEYS)}")
        return InterferenceCurve()
    values: dict[str, float] = {}
    for key, value in raw.items():
        if key not in CURVE_KEYS:
            problems.append(f"{path}.{key}: unknown key (valid: {', '.join(CURVE_KEYS)})")
            continue
        problem = _number_problem(value, key)
        if problem:
            problems.append(f"{path}.{key}: {problem}")
        else:
            values[key] = float(value)
    return InterferenceCurve(**values)


def parse_curves(raw: Any, path: str, problems: list[str]) -> dict[str, InterferenceCurve]:
    """Validate a ``GPU type -> curve`` mapping (``cost.curves``); keys kept as written."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: must be a mapping of GPU type to curve")
        return {}
    return {str(k): parse_curve(v, f"{path}.{k}", problems) for k, v in raw.items()}


@dataclass(frozen=True)
class CurveFit:
    """A fitted curve for one GPU type and how well it fits its points."""

    gpu_type: str
    curve: InterferenceCurve
    r2_below: float
    r2_above: float
    n_below: int
    n_above: int
    domain_percent: tuple[float, float]

    def slowdown(self, util_percent: float) -> float:
        """The fitted JCT slowdown at ``util_percent``."""
        return self.curve.slowdown(util_percent)

    def report(self) -> dict[str, Any]:
        """Fit quality, as the curves file's ``fit`` entry."""
        return {"r2_below": self.r2_below, "r2_above": self.r2_above, "n_below": self.n_below,
                "n_above": self.n_above, "domain_percent": list(self.domain_percent)}


def _r2(y: np.ndarray, fitted: np.ndarray) -> float:
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    ss_res = float(np.sum((y - fitted) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


def _fit_below(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) by least squares with slope >= 0 (a curve must not fall)."""
    slope, intercept = np.polyfit(x, y, 1)
    if slope < 0:
        return float(y.mean()), 0.0
    return float(intercept), float(slope)


def _fit_above(d: np.ndarray, resid: np.ndarray) -> tuple[float, float]:
    """(over_slope, over_quadratic) >= 0 by non-negative least squares on ``resid``."""
    from scipy.optimize import nnls  # lazy: the extender imports this module, not the fit

    if d.size >= 3:
        (linear, quadratic), _ = nnls(np.stack([d, d * d], axis=1), resid)
        return float(linear), float(quadratic)
    (linear,), _ = nnls(d[:, None], resid)
    return float(linear), 0.0


def fit_curve(gpu_type: str, util_percent: Iterable[float], slowdown: Iterable[float]) -> CurveFit:
    """Fit both regimes for one GPU type; CurveFitError names the regime lacking points.

    Below 100%: least squares line. Above: least squares on the residual above the
    line's value at 100%, so the curve is continuous there; with fewer than 3
    points above, ``over_quadratic`` is 0. Slopes are kept >= 0, as the config
    requires, so every fit loads.
    """
    u = np.asarray(list(util_percent), dtype=float)
    y = np.asarray(list(slowdown), dtype=float)
    if u.shape != y.shape or not (np.all(np.isfinite(u)) and np.all(np.isfinite(y))):
        raise CurveFitError(f"{gpu_type}: points must be finite pairs")
    x, cost = u / 100.0, y - 1.0  # fitted directly in the config's units
    lo = x <= 1.0
    if lo.sum() < 2 or np.ptp(x[lo]) == 0:
        raise CurveFitError(
            f"{gpu_type}: need >= 2 distinct points at <= 100% "
            f"cumulative utilisation, have {int(lo.sum())}"
        )
    intercept, slope = _fit_below(x[lo], cost[lo])
    hi = ~lo
    if hi.sum() == 0:
        raise CurveFitError(
            f"{gpu_type}: need points above 100% cumulative utilisation "
            "(over-committed combinations), have 0"
        )
    d = x[hi] - 1.0
    over_slope, over_quadratic = _fit_above(d, cost[hi] - (intercept + slope))
    curve = InterferenceCurve(slope, over_slope, over_quadratic, intercept)
    return CurveFit(
        gpu_type, curve,
        _r2(cost[lo], intercept + slope * x[lo]),
        _r2(cost[hi], np.array([curve(v) for v in u[hi]])),
        int(lo.sum()), int(hi.sum()), (float(u.min()), float(u.max())),
    )


def fit_curves(rows: Iterable[Mapping[str, Any]]) -> dict[str, CurveFit]:
    """One fit per ``gpu_product`` from ok colocated rows (slowdown present)."""
    points: dict[str, tuple[list[float], list[float]]] = {}
    for r in rows:
        if r.get("status") != "ok" or r.get("slowdown") is None:
            continue
        u = r.get("cumulative_isolated_util_percent")
        if u is None or not math.isfinite(float(u)):
            continue
        xs, ys = points.setdefault(str(r["gpu_product"]), ([], []))
        xs.append(float(u))
        ys.append(float(r["slowdown"]))
    if not points:
        raise CurveFitError("no ok co-location rows with a slowdown")
    return {gpu: fit_curve(gpu, xs, ys) for gpu, (xs, ys) in sorted(points.items())}


def save_curves(path: Path, fits: Mapping[str, CurveFit], data_digest: str,
                simulated: bool = False) -> Path:
    """Write the curves file (format in the module docstring); ``path`` must be .yaml/.yml."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise ValueError(f"{path}: the curves file is YAML; name it *.yaml")
    payload = {
        "format": CURVES_FORMAT,
        "data_digest": data_digest,
        "simulated": simulated,
        "fitted_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "fit": {gpu: f.report() for gpu, f in sorted(fits.items())},
        "curves": {gpu: f.curve.to_config() for gpu, f in sorted(fits.items())},
    }
    header = ("# Interference curves fitted by `tandem predictor fit-curves`. Point the extender\n"
              "# at this file with `cost.curves_file`, or copy the `curves` entries into\n"
              "# `cost.curves` of its config unchanged (docs/training.md).\n")
    # a wide line keeps each curve on one line, so entries can be copied into cost.curves
    path.write_text(header + yaml.safe_dump(payload, sort_keys=False, default_flow_style=None,
                                            width=1000), encoding="utf-8")
    return path


@dataclass(frozen=True)
class CurvesFile:
    """A loaded curves file: the curves and whether they came from simulated data."""

    curves: dict[str, InterferenceCurve]
    simulated: bool
    data_digest: str


def load_curves(path: Path) -> CurvesFile:
    """Read and validate a curves file; CurveFileError lists every problem with its path."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as stream:  # YAML errors then name the file
            raw = yaml.safe_load(stream)
    except OSError as exc:
        raise CurveFileError([f"{path}: cannot read: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise CurveFileError([f"{path}: not valid YAML: {exc}"]) from None
    if not isinstance(raw, Mapping) or raw.get("format") != CURVES_FORMAT:
        raise CurveFileError([f"{path}: not a {CURVES_FORMAT} file "
                              "(write it with `tandem predictor fit-curves`)"])
    problems: list[str] = []
    simulated = raw.get("simulated", False)
    if not isinstance(simulated, bool):
        problems.append(f"{path}: simulated: must be true or false")
    if "curves" not in raw:
        problems.append(f"{path}: curves: required")
    curves = parse_curves(raw.get("curves"), f"{path}: curves", problems)
    if problems:
        raise CurveFileError(problems)
    return CurvesFile(curves, bool(simulated), str(raw.get("data_digest", "")))


# ---- online refits (extender/learning/curves.py) --------------------------------------------
def fit_partial(util_percent: Sequence[float], slowdown: Sequence[float],
                prior: InterferenceCurve) -> InterferenceCurve:
    """Fit the regimes the points cover; keep ``prior``'s coefficients for the others.

    Online points rarely cover both regimes (a cap on co-located utilisation keeps
    most GPUs below 100%). Below 100%: a least squares line when the points spread,
    else the slope through ``prior``'s intercept (one level, one unknown). Above:
    non-negative least squares on the residual over the line at 100%, as
    :func:`fit_curve`, when there is a point there. Coefficients stay in range.
    """
    u = np.asarray(util_percent, dtype=float)
    y = np.asarray(slowdown, dtype=float)
    if u.shape != y.shape or u.size == 0 or not (np.all(np.isfinite(u))
                                                  and np.all(np.isfinite(y))):
        raise CurveFitError("points must be finite pairs, at least one")
    x, cost = u / 100.0, y - 1.0
    lo = x <= 1.0
    intercept, slope = prior.intercept, prior.slope
    if lo.sum() >= 2 and np.ptp(x[lo]) > 1e-9:
        intercept, slope = _fit_below(x[lo], cost[lo])
    elif lo.any() and float(np.mean(x[lo])) > 1e-9:
        slope = max(0.0, float(np.mean(cost[lo]) - intercept) / float(np.mean(x[lo])))
    over_slope, over_quadratic = prior.over_slope, prior.over_quadratic
    hi = ~lo
    if hi.any():
        over_slope, over_quadratic = _fit_above(x[hi] - 1.0, cost[hi] - (intercept + slope))
    return InterferenceCurve(slope, over_slope, over_quadratic, max(intercept, -0.99))


def bounded_step(current: InterferenceCurve, target: InterferenceCurve, max_step: float,
                 floor: float = 0.05) -> InterferenceCurve:
    """``target`` with each coefficient moved at most ``max_step`` (relative) from ``current``.

    The step is relative to ``max(|coefficient|, floor)`` so a coefficient at 0 can
    still move (by ``max_step * floor``); results stay in the config's ranges.
    """
    moved = {}
    for key in CURVE_KEYS:
        now, want = getattr(current, key), getattr(target, key)
        room = max_step * max(abs(now), floor)
        moved[key] = min(max(want, now - room), now + room)
    moved["intercept"] = max(moved["intercept"], -0.99)
    for key in ("slope", "over_slope", "over_quadratic"):
        moved[key] = max(moved[key], 0.0)
    return InterferenceCurve(**moved)


def curve_r2(curve: InterferenceCurve, util_percent: Sequence[float],
             slowdown: Sequence[float]) -> float:
    """R^2 of ``curve``'s slowdown against observed slowdowns.

    When the observations do not vary, 1.0 if the curve hits them, else 0.0.
    """
    u = np.asarray(util_percent, dtype=float)
    y = np.asarray(slowdown, dtype=float)
    fitted = np.array([curve.slowdown(v) for v in u])
    if float(np.ptp(y)) == 0.0:
        return 1.0 if float(np.max(np.abs(y - fitted))) < 1e-6 else 0.0
    return _r2(y, fitted)
