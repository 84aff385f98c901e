"""How co-located jobs slow each other down in the simulated world (not a decision).

Two models, both functions of a GPU's *cumulative true* utilisation
``x = sum(util) / 100`` and applied only when two or more jobs share the GPU:

``curve`` (default): Horus TPDS'21 §3.2 / Fig. 4. Above 100% the JCT slowdown
is the paper's fitted quadratic ``a x^2 + b x + c`` (footnotes 3 and 4:
GTX 1080 ``1.32198, -0.00728, 6e-5``; RTX 2080 ``1.16664, -0.00302, 4e-5``).
Below 100% the paper reports an approximately linear relation (pairs under 50%
each: 1x-1.5x), modelled as the line from 1.0 at ``x = 0`` to the quadratic's
value at ``x = 1`` so the two pieces meet. The paper observed at most 2.4x-3.4x
slowdown (§1 contributions) and reports the 2080 as the milder card (§3.2), so
the slowdown is capped at 2.4 (2080) and 3.4 (1080); the quadratic would
otherwise give 5x at 200%, beyond anything measured.

``linear``: the assumption of the paper's own large-scale simulator (§6.2,
"interference overheads scale linearly w.r.t. the sum of the jobs GPU
Utilization"): the same line as below 100%, continued above it, same cap.

Unknown GPU types use the RTX 2080 coefficients (the testbed card, §5.1).

This is the simulated world's truth, not the extender's belief, so it reads no
configured curves. The shipped config gives these two cards the same function as
:class:`predictor.curves.InterferenceCurve` (``slope = a+b+c-1``, ``over_slope =
2a+b``, ``over_quadratic = a``; a test ties them). The arithmetic here stays in
the paper's form because replays must reproduce the recorded figures to the bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# (a, b, c, cap) per canonical type; see the module docstring for the sources.
PAPER_COEFFICIENTS: dict[str, tuple[float, float, float, float]] = {
    "NVIDIA-GeForce-GTX-1080": (1.32198, -0.00728, 6e-5, 3.4),
    "NVIDIA-GeForce-RTX-2080": (1.16664, -0.00302, 4e-5, 2.4),
}
DEFAULT_TYPE = "NVIDIA-GeForce-RTX-2080"
MODELS = ("curve", "linear")


class InterferenceError(ValueError):
    """Unknown interference model name."""


@dataclass(frozen=True)
class SlowdownModel:
    """Vectorised slowdown factor (>= 1) per GPU row."""

    name: str
    coeffs: np.ndarray
    """``(types, 4)`` rows of (a, b, c, cap), indexed by the table's type id."""

    @classmethod
    def for_types(cls, name: str, type_names: Sequence[str]) -> SlowdownModel:
        """The model ``name`` (``curve`` | ``linear``) for a table's GPU types."""
        if name not in MODELS:
            raise InterferenceError(
                f"unknown interference model {name!r} (valid: {', '.join(MODELS)})")
        rows = [PAPER_COEFFICIENTS.get(t, PAPER_COEFFICIENTS[DEFAULT_TYPE]) for t in type_names]
        return cls(name, np.array(rows or [PAPER_COEFFICIENTS[DEFAULT_TYPE]], dtype=np.float64))

    def slowdown(self, util_sum_percent: np.ndarray, jobs: np.ndarray,
                 type_ids: np.ndarray) -> np.ndarray:
        """Slowdown of every job on each given GPU (1.0 where it runs alone)."""
        c = self.coeffs[type_ids]
        x = util_sum_percent / 100.0
        at_one = c[:, 0] + c[:, 1] + c[:, 2]
        line = 1.0 + (at_one - 1.0) * x
        if self.name == "curve":
            quad = c[:, 0] * x * x + c[:, 1] * x + c[:, 2]
            value = np.where(x > 1.0, quad, line)
        else:
            value = line
        value = np.minimum(np.maximum(value, 1.0), c[:, 3])
        return np.where(jobs >= 2, value, 1.0)
