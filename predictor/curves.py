"""Interference curves: JCT slowdown vs cumulative isolated GPU utilisation, per GPU type.

Horus (Section 3.2, Eq. 9) fits one function below 100% cumulative utilisation
and another above it. Here, per GPU product, from ok rows of ``colocated.csv``
(x = ``cumulative_isolated_util_percent``, y = ``slowdown``):

- below (x <= 100): ``f-(x) = intercept + slope*x`` (least squares);
- above (x > 100):  ``f+(x) = f-(100) + linear*(x-100) + quadratic*(x-100)^2``,
  least squares on the residual above ``f-(100)``, so the curve is continuous at
  100% by construction. With fewer than 3 points above, ``quadratic`` is 0.

JSON written by ``save_curves`` (``format: tandem.interference-curves/v1``)::

    {"format": "tandem.interference-curves/v1", "data_digest": "<sha256>",
     "simulated": false, "fitted_at": "...", "curves": {"<gpu product>": {
        "below": {"intercept": 1.0, "slope": 0.004, "r2": 0.8, "n_points": 40},
        "above": {"at_100": 1.4, "linear": 0.01, "quadratic": 5e-05, "r2": 0.7,
                  "n_points": 25},
        "domain_percent": [12.0, 260.0],
        "points": [[0, 1.0], [10, 1.04], ...]}}}

``simulated`` is true when any co-location row came from the ``sim:`` backend.
``points`` samples the curve every 10% from 0 to 300% (and the domain's end) for
consumers that use the shared piecewise-linear helper; the coefficients are exact.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CURVES_FORMAT = "tandem.interference-curves/v1"


class CurveFitError(ValueError):
    """Too few or invalid points to fit a regime."""


@dataclass(frozen=True)
class InterferenceCurve:
    """Slowdown as a function of cumulative utilisation for one GPU type."""

    gpu_type: str
    intercept: float
    slope: float
    linear: float
    quadratic: float
    r2_below: float
    r2_above: float
    n_below: int
    n_above: int
    domain_percent: tuple[float, float]

    def __call__(self, util_percent: float) -> float:
        below = self.intercept + self.slope * min(util_percent, 100.0)
        if util_percent <= 100.0:
            return below
        d = util_percent - 100.0
        return below + self.linear * d + self.quadratic * d * d

    def points(self, step_percent: float = 10.0, max_percent: float = 300.0) -> list[list[float]]:
        """Sampled ``[[util, slowdown], ...]`` for the piecewise-linear helper."""
        xs = list(np.arange(0.0, max_percent + 1e-9, step_percent))
        return [[round(float(x), 6), round(self(float(x)), 6)] for x in xs]

    def to_json(self) -> dict[str, Any]:
        """The per-GPU object of the curves JSON."""
        return {
            "below": {
                "intercept": self.intercept,
                "slope": self.slope,
                "r2": self.r2_below,
                "n_points": self.n_below,
            },
            "above": {
                "at_100": self(100.0),
                "linear": self.linear,
                "quadratic": self.quadratic,
                "r2": self.r2_above,
                "n_points": self.n_above,
            },
            "domain_percent": list(self.domain_percent),
            "points": self.points(),
        }

    @classmethod
    def from_json(cls, gpu_type: str, obj: Mapping[str, Any]) -> InterferenceCurve:
        """Inverse of ``to_json`` (``points`` are derived, not read)."""
        b, a = obj["below"], obj["above"]
        lo, hi = obj["domain_percent"]
        return cls(
            gpu_type,
            float(b["intercept"]),
            float(b["slope"]),
            float(a["linear"]),
            float(a["quadratic"]),
            float(b["r2"]),
            float(a["r2"]),
            int(b["n_points"]),
            int(a["n_points"]),
            (float(lo), float(hi)),
        )


def _r2(y: np.ndarray, fitted: np.ndarray) -> float:
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    ss_res = float(np.sum((y - fitted) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


def fit_curve(
    gpu_type: str, util_percent: Iterable[float], slowdown: Iterable[float]
) -> InterferenceCurve:
    """Fit both regimes for one GPU type; CurveFitError names the regime lacking points."""
    x = np.asarray(list(util_percent), dtype=float)
    y = np.asarray(list(slowdown), dtype=float)
    if x.shape != y.shape or not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise CurveFitError(f"{gpu_type}: points must be finite pairs")
    lo = x <= 100.0
    if lo.sum() < 2 or np.ptp(x[lo]) == 0:
        raise CurveFitError(
            f"{gpu_type}: need >= 2 distinct points at <= 100% "
            f"cumulative utilisation, have {int(lo.sum())}"
        )
    slope, intercept = np.polyfit(x[lo], y[lo], 1)
    r2_below = _r2(y[lo], intercept + slope * x[lo])
    hi = ~lo
    if hi.sum() == 0:
        raise CurveFitError(
            f"{gpu_type}: need points above 100% cumulative utilisation "
            "(over-committed combinations), have 0"
        )
    d = x[hi] - 100.0
    resid = y[hi] - (intercept + slope * 100.0)
    if hi.sum() >= 3:
        A = np.stack([d, d * d], axis=1)
        (linear, quadratic), *_ = np.linalg.lstsq(A, resid, rcond=None)
    else:
        linear, quadratic = float(np.dot(d, resid) / np.dot(d, d)), 0.0
    r2_above = _r2(y[hi], intercept + slope * 100.0 + linear * d + quadratic * d * d)
    return InterferenceCurve(
        gpu_type,
        float(intercept),
        float(slope),
        float(linear),
        float(quadratic),
        r2_below,
        r2_above,
        int(lo.sum()),
        int(hi.sum()),
        (float(x.min()), float(x.max())),
    )


def fit_curves(rows: Iterable[Mapping[str, Any]]) -> dict[str, InterferenceCurve]:
    """One curve per ``gpu_product`` from ok colocated rows (slowdown present)."""
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


def save_curves(
    path: Path,
    curves: Mapping[str, InterferenceCurve],
    data_digest: str,
    simulated: bool = False,
) -> Path:
    """Write the curves JSON (format in the module docstring)."""
    payload = {
        "format": CURVES_FORMAT,
        "data_digest": data_digest,
        "simulated": simulated,
        "fitted_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "curves": {gpu: c.to_json() for gpu, c in sorted(curves.items())},
    }
    Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return Path(path)


def load_curves(path: Path) -> dict[str, InterferenceCurve]:
    """Read a curves JSON; ValueError when the format tag is not ours."""
    payload = json.loads(Path(path).read_text(encoding="utf-8"))
    if payload.get("format") != CURVES_FORMAT:
        raise ValueError(f"{path}: not a {CURVES_FORMAT} file")
    return {gpu: InterferenceCurve.from_json(gpu, obj) for gpu, obj in payload["curves"].items()}
