"""What a refit of the pair learner costs on the report path, and a decision's read.

``PairLearner.model()`` runs at the end of each agent report that changed the
pairs: the per-model profile fit after every new sample, and the solve of the
group samples (GPUs shared by three or more) at most every
``GROUP_REFIT_SECONDS``. A decision reads the model built then
(``PairLearner.current()``). This times all three on synthetic learners at
``learning.pair_max_entries`` (4,000 pairs and 4,000 group samples) for 30, 200
and 1,000 models, median of ``--repeats``, and times the same solve by SciPy's
bounded least squares (``lsq_linear``, trust-region with LSMR: the general
solver) in the same run, checking both give the same pairs. Figures are
synthetic; only their sizes matter here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import _common
import numpy as np
from scipy.optimize import lsq_linear

import extender.learning.pair_fit as pairs_module
from extender.learning.interference import PairLearner

SIZES = ((30, 4000, 4000), (200, 4000, 4000), (1000, 4000, 4000))
"""(models, pairs added, group samples kept)."""


def _learner(models: int, pairs: int, groups: int, seed: int) -> PairLearner:
    rng = np.random.default_rng(seed)
    learner = PairLearner(max_entries=4000, group_refit_seconds=0.0)
    names = [f"registry.example.com/models/model-{i}" for i in range(models)]
    for _ in range(pairs):
        a, b = rng.choice(models, 2, replace=False)
        learner.add("NVIDIA-A100", names[a], names[b], 1.0 + float(rng.random()))
    while learner.stats()["groups"] < min(groups, learner.max_entries) \
            and learner.group_samples_total < 20 * groups:
        chosen = rng.choice(models, int(rng.integers(3, 5)), replace=False)
        learner.add_group("NVIDIA-A100", names[chosen[0]], [names[x] for x in chosen[1:]],
                          1.0 + 2.0 * float(rng.random()))
    return learner


def _time(learner: PairLearner, solve: bool) -> float:
    """Seconds of one ``model()`` after a change (``solve``: the groups' solve is due)."""
    learner.group_refit_seconds = 0.0 if solve else 1e12
    if solve:  # a group sample makes the solve due
        learner.add_group("NVIDIA-A100", "probe-a", ["probe-b", "probe-c"], 2.0)
    else:  # a pair sample: only the profile fit
        learner.add("NVIDIA-A100", "probe-a", "probe-b", 1.5)
    started = time.perf_counter()
    learner.model()
    return time.perf_counter() - started


def _read(learner: PairLearner) -> float:
    """Seconds of a decision's read (``current()``) after a sample the report has fitted."""
    learner.add("NVIDIA-A100", "probe-a", "probe-b", 1.5)
    learner.model()
    started = time.perf_counter()
    learner.current()
    return time.perf_counter() - started


def _general(a: Any, y: np.ndarray, upper: float | None = None) -> np.ndarray:
    if upper is None:
        return _ORIGINAL(a, y)
    return lsq_linear(a, y, bounds=(0.0, upper), method="trf", lsq_solver="lsmr",
                      tol=1e-10).x


_ORIGINAL = pairs_module.least_squares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    _common.add_out_option(parser, "pair_refit")
    args = parser.parse_args()
    rows = []
    for models, pairs, groups in SIZES:
        learner = _learner(models, pairs, groups, seed=models)
        fit = [_time(learner, solve=False) for _ in range(args.repeats)]
        both = [_time(learner, solve=True) for _ in range(args.repeats)]
        read = [_read(learner) for _ in range(args.repeats)]
        ours = learner.model().types["NVIDIA-A100"].inferred  # type: ignore[union-attr]
        pairs_module.least_squares = _general
        try:
            general = _time(learner, solve=True)
            theirs = learner.model().types["NVIDIA-A100"].inferred  # type: ignore[union-attr]
        finally:
            pairs_module.least_squares = _ORIGINAL
        gap = max(abs(ours[k][0] - theirs[k][0]) for k in ours)
        kept = learner.stats()
        rows.append({"models": models, "pairs": kept["pairs"],
                     "group_samples_kept": kept["groups"], "pairs_solved": len(ours),
                     "fit_ms_median": round(statistics.median(fit) * 1000, 1),
                     "fit_and_solve_ms_median": round(statistics.median(both) * 1000, 1),
                     "decision_read_us_median": round(statistics.median(read) * 1e6, 1),
                     "general_solver_fit_and_solve_ms": round(general * 1000, 1),
                     "general_over_ours": round(general / statistics.median(both), 1),
                     "largest_log_difference_from_general": round(gap, 4)})
    result = {"benchmark": "pair_refit", "repeats": args.repeats, "sizes": rows,
              **_common.context(("numpy", "scipy"))}
    _common.write_result(result, args.out)


if __name__ == "__main__":
    main()
