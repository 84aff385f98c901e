"""Horus interference cost (TPDS'21 Eq. 7-10), vectorised over candidate GPUs.

    cost = w_mem * C_mem + w_util * C_util                      (Eq. 7)
    C_mem = (used_mib + job_mib) / capacity_mib                  (Eq. 8)
    C_util = f_type(u),  u = current_util + job_util  [percent]  (Eq. 9, 10)

``f_type`` is the GPU type's interference curve, fitted against JCT slowdown
(Horus Fig. 4: below 100% cumulative utilisation co-located jobs slow down
1x-1.5x, above it 1.5x-3x): linear up to full use and quadratic beyond it,
continuous at 100%. The curve type, its config form, its vectorised form and its
fit live once, in :mod:`predictor.curves`; ``tandem predictor fit-curves`` writes
exactly what ``cost.curves`` and ``cost.curves_file`` load.

**Current utilisation.** Per GPU, with ``R`` the sum of reserved predictions,
``O`` a fresh observed load and ``S`` the reservations placed *after* that
observation was taken::

    current = max(R, O + S)          (observation fresh)
    current = R                      (observation stale or missing)

and likewise for memory. Reservations cover jobs that were just placed but whose
load NVML does not show yet (start-up takes tens of seconds); the observation
covers jobs whose prediction is too low and foreign processes. Adding ``R`` and
``O`` would count every running reserved job twice. But a job bound after the
agent's sample cannot be in it, so it adds to the observation: with the older
rule ``max(R, O)`` a GPU whose observed load exceeded its reservations absorbed
newly reserved pods for free (``max(R + r, O) < O + r``), and the simulator saw
most of its OOM events from exactly that. ``S`` is kept per GPU by
:class:`extender.core.table.GpuTable` and reset by every observation. An
observation is fresh for ``staleness_seconds`` after it was taken.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from extender.core.packing import PackingPolicy
from extender.core.pairs import PairModel
from predictor.curves import InterferenceCurve, coefficient_table, curve_costs

__all__ = [  # the curve type and its vectorised form live in predictor.curves
    "CostPolicy", "InterferenceCurve", "colocation_gain", "curve_coefficients", "curve_costs",
    "effective_load", "horus_cost", "predicted_slowdown", "scores_from_costs",
]


MAX_PODS_RANGE = (1, 1024)
"""Accepted ``limits.max_pods_per_gpu`` (and sweep values): the co-location limit."""


@dataclass(frozen=True)
class CostPolicy:
    """Weights, curves and hard limits that decisions depend on (from config)."""

    w_mem: float = 1.0
    """Weight of the memory term; Horus sets all weights equal."""
    w_util: float = 1.0
    """Weight of the utilisation (interference) term."""
    curves: Mapping[str, InterferenceCurve] = field(default_factory=dict)
    """Curve per canonical GPU type (``NVIDIA-A100-SXM4-40GB``); others use ``default_curve``."""
    default_curve: InterferenceCurve = InterferenceCurve()
    max_pods_per_gpu: int = 8
    """Co-location limit: most pods sharing one GPU (in ``MAX_PODS_RANGE``)."""
    staleness_seconds: float = 10.0
    """An agent observation older than this is ignored."""
    min_best_effort_slack_percent: float = 10.0
    """A serving GPU takes a best-effort session only if its SLO sessions leave more than
    this share of the duty cycle idle (0..100)."""
    min_colocation_gain_percent: float | None = None
    """Throughput rule for training co-location (``extender.core.rules``): a GPU that
    already runs training jobs takes another only if its predicted combined progress
    rate grows by more than this many percent. None = off (Horus: utilisation is only
    ranked). The extender's shipped config turns it on."""
    max_colocated_util_percent: float | None = None
    """Cap on a shared GPU's cumulative predicted utilisation (percent, > 0): a GPU that
    already runs training jobs takes another only up to this total. None = no cap."""
    max_share_score: int | None = None
    """Lucid-style share score (:mod:`extender.core.share_score`): where progress is not
    measured, a GPU running training pods takes another only while their scores sum to
    at most this. None = off."""
    pairs: PairModel | None = None
    """Learned pairwise interference (:mod:`extender.core.pairs`); None = the curve only."""
    packing: PackingPolicy = PackingPolicy()
    """The packing score (:mod:`extender.core.packing`), used where the workload's shapes
    are known (``DecisionContext.packing``)."""

    def curve_for(self, gpu_type: str) -> InterferenceCurve:
        """The curve configured for ``gpu_type``, else the default."""
        return self.curves.get(gpu_type, self.default_curve)

    def with_curves(self, learned: Mapping[str, InterferenceCurve]) -> CostPolicy:
        """This policy with ``learned`` curves in place of the configured ones of their types.

        The extender passes what it learned online (``extender.learning.learner``) this way,
        so decisions stay pure functions of the policy.
        """
        if not learned:
            return self
        return replace(self, curves={**self.curves, **learned})

    def with_pairs(self, pairs: PairModel | None) -> CostPolicy:
        """This policy deciding with the learned pairwise interference ``pairs``."""
        return self if pairs is None or not pairs.types else replace(self, pairs=pairs)


def curve_coefficients(policy: CostPolicy, type_names: list[str]) -> np.ndarray:
    """A ``(types, 4)`` array of :meth:`InterferenceCurve.coefficients` rows per type id."""
    return coefficient_table([policy.curve_for(t) for t in type_names] or [policy.default_curve])


def effective_load(
    reserved: np.ndarray, observed: np.ndarray, observed_at: np.ndarray,
    now_seconds: float, staleness_seconds: float, since: np.ndarray | None = None,
) -> np.ndarray:
    """``max(reserved, observed + since)`` where the observation is fresh, else ``reserved``.

    ``since``: reservations placed after the observation (module doc); None = none.
    """
    fresh = (now_seconds - observed_at) <= staleness_seconds
    seen = observed if since is None else observed + since
    return np.where(fresh & ~np.isnan(observed), np.maximum(reserved, seen), reserved)


def _rows(values: np.ndarray, picked: np.ndarray | None, size: int) -> np.ndarray:
    """``values`` (one entry per GPU, or one broadcast entry) at the ``picked`` GPUs."""
    return values if picked is None or len(values) != size else values[picked]


def predicted_slowdown(util_percent: np.ndarray, jobs: np.ndarray,
                       coeffs: np.ndarray) -> np.ndarray:
    """JCT slowdown the curves predict for ``jobs`` sharing a GPU: ``1 + f(u)``, 1 when alone.

    The curves are shaped as relative JCT increase (Horus Fig. 4: cost 0.5 at 100%
    is a 1.5x JCT), so the cost itself is the predicted extra time. ``util_percent``
    and ``jobs`` have one entry per GPU; ``coeffs`` one row per GPU or one for all.
    The curve is evaluated only where GPUs are shared.
    """
    shared = jobs >= 2
    if shared.all():
        return 1.0 + curve_costs(util_percent, coeffs)
    slowdown = np.ones(shared.shape)
    if shared.any():
        picked = np.flatnonzero(shared)
        slowdown[picked] = 1.0 + curve_costs(util_percent[picked],
                                             _rows(coeffs, picked, shared.size))
    return slowdown


def colocation_gain(util_now: np.ndarray, job_util: np.ndarray, jobs_now: np.ndarray,
                    coeffs: np.ndarray, width_now: np.ndarray | None = None) -> np.ndarray:
    """Predicted relative change of a GPU's progress rate if one more pod joins.

    Pods that each run ``s`` times slower progress at ``1 / s`` per GPU. A pod already
    here that spans ``w`` GPUs moves at the pace of its slowest GPU, so slowing it here
    stalls all ``w``: the rate before is ``W / s``, ``W`` the summed GPU counts of the
    pods here (``width_now``; None = one each). The newcomer counts 1: each of its GPUs
    answers for its own share. Running one after another keeps each at full speed.
    Returns ``rate_after / rate_before - 1`` (``inf`` on an idle GPU). Arrays have one
    entry per GPU; ``job_util`` and ``coeffs`` may have one for all.
    """
    width = jobs_now if width_now is None else width_now
    busy = jobs_now > 0
    picked = None if busy.all() else np.flatnonzero(busy)  # idle GPUs: inf, nothing to compute
    util, job, jobs, held, curve = (_rows(values, picked, busy.size)
                                    for values in (util_now, job_util, jobs_now, width, coeffs))
    before = held / predicted_slowdown(util, jobs, curve)
    after = (held + 1) / predicted_slowdown(util + job, jobs + 1, curve)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate_change = after / before - 1.0
    if picked is None:
        return rate_change
    gain = np.full(busy.shape, np.inf)
    gain[picked] = rate_change
    return gain


def horus_cost(
    policy: CostPolicy, used_mib: np.ndarray, job_mib: np.ndarray, capacity_mib: np.ndarray,
    util_percent: np.ndarray, job_util: np.ndarray, coeffs: np.ndarray,
) -> np.ndarray:
    """Eq. 7 per GPU, given current load, the job's demand and per-GPU curve coefficients."""
    c_mem = (used_mib + job_mib) / np.maximum(capacity_mib, 1.0)
    c_util = curve_costs(util_percent + job_util, coeffs)
    return policy.w_mem * c_mem + policy.w_util * c_util


def scores_from_costs(costs: np.ndarray, max_score: int = 10, *,
                      best_alone: bool = False) -> list[int]:
    """Min-max map node costs onto integers 0..max_score (lowest cost = max_score).

    Relative to the candidates of this call, like kube-scheduler's default score
    normalisation: the extender's preference is the ordering, and the full 0..10
    range makes it visible beside the in-tree plugins. Equal costs all get the max.
    ``best_alone``: only the cheapest nodes get ``max_score``, the others at most one
    less, so a small but real difference still decides (the packing score: the tightest
    node among many nearly as tight ones is the point).
    """
    if costs.size == 0:
        return []
    best, worst = float(costs.min()), float(costs.max())
    if not math.isfinite(worst) or worst - best <= 1e-12:
        return [max_score] * int(costs.size)
    fraction = np.clip((worst - costs) / (worst - best), 0.0, 1.0)
    if not best_alone:
        return np.rint(fraction * max_score).astype(np.int64).tolist()  # tolist: Python ints
    top = costs <= best + 1e-12
    return np.where(top, max_score, np.floor(fraction * (max_score - 1))).astype(
        np.int64).tolist()
