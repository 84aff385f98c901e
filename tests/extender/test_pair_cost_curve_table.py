"""A row's curve figures are computed in one call (extender.core.pair_cost._curve_pair): each
pair's figure is the one a call of its own gives, bit for bit, on both sides of full use."""

from __future__ import annotations

import numpy as np
import pytest

from extender.core.cost import curve_costs
from extender.core.pair_cost import _curve_pair


@pytest.mark.parametrize("coeffs", [np.array([0.4, 0.55, 0.9, 0.02]), np.array([0.5, 0.5, 1.0])])
def test_each_pairs_curve_figure_is_its_own_calls(coeffs: np.ndarray) -> None:
    rng = np.random.default_rng(3)
    for size in (1, 2, 4, 6):
        utils = [float(u) for u in rng.uniform(5.0, 160.0, size)]
        pair = _curve_pair(coeffs, utils)
        for i in range(size):
            for j in range(size):
                alone = 1.0 + float(curve_costs(np.array([utils[i] + utils[j]]),
                                                coeffs[None, :])[0])
                assert pair(i, j) == alone
