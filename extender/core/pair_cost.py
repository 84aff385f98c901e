"""Pairwise interference on candidate GPUs: the utilisation term and the throughput rule.

:func:`pair_terms` judges the rows where the pair figures apply (the policy has a
:class:`extender.core.pairs.PairModel` that knows the row's GPU type, the pod names
its model, and every training pod on the row names one); the other rows keep
Horus's terms (``nan`` in the returned arrays), so with nothing learned the
decision is the curve's exactly. See :mod:`extender.core.pairs` for the rules.

The figures correct Horus's utilisation term by the progress they say the GPU loses
beyond what the curve's own figures lose in the same formula: the pair formula's cost
itself sits on another scale than Horus's (two jobs at 40% each: 0.58 against 0.45), and
GPUs judged by pairs lost to GPUs judged by the curve whatever their figures said. Only
figures measured from the newcomer's progress re-judge the throughput rule: a figure
completed from other pairs refuses nothing the curve shares.

Learned figures judge only pods whose progress is measured: where the pod or a training
pod on the row names no progress counter (``tandem.io/progress``), the row keeps Horus's
terms and only pairs seen not to fit in memory are refused there. So does a row where
nothing is known of the pod's pairs (its figure there is the curve's): the curve's pair
figures in the pair formula are not Horus's cost, and mixing the two misjudged GPUs.
There, with ``limits.max_share_score`` set, :mod:`extender.core.share_score` may refuse too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from extender.core.cost import CostPolicy, curve_costs
from extender.core.pairs import CURVE, UNTRIED, PairModel, TypePairs, judge_gpu
from extender.core.reasons import Reason
from extender.core.share_score import share_refusals
from extender.core.table import GpuTable


@dataclass(frozen=True)
class PairTerms:
    """Per candidate row: the pair figures' correction of Horus's utilisation term and rule
    verdicts (nan: Horus)."""

    extra_util: np.ndarray
    """What the pair figures add to Horus's utilisation term (negative: they say the GPU
    loses less progress than the curve's figures do)."""
    gain: np.ndarray
    refused: np.ndarray
    """Rows whose residents include a model the pod was seen not to fit beside."""
    sources: dict[int, str]
    """Table row -> where the pod's interference figure came from (rows judged by pairs)."""


def _curve_pair(row_coeffs: np.ndarray, utils: list[float]) -> Callable[[int, int], float]:
    """The curve's slowdown of jobs ``i`` and ``j`` (of ``utils``) sharing a GPU alone: every
    pair's in one :func:`curve_costs` call (a row's judgement reads each pair up to four
    times; elementwise, so each figure is the one a call of its own gives)."""
    m = len(utils)
    costs = curve_costs(np.array([utils[i] + utils[j] for i in range(m) for j in range(m)]),
                        row_coeffs[None, :])
    table = [[1.0 + float(c) for c in costs[i * m:(i + 1) * m]] for i in range(m)]

    def pair(i: int, j: int) -> float:
        return table[i][j]
    return pair


def pair_terms(table: GpuTable, rows: np.ndarray, model_name: str | None, policy: CostPolicy,
               job_util: np.ndarray, coeffs: np.ndarray, *, progress: bool
               ) -> PairTerms | None:
    """The pair terms of a training pod of ``model_name`` on ``rows`` (None: none apply);
    ``progress``: the pod names a progress counter (module docstring).

    ``job_util`` and ``coeffs`` have one entry (row) per candidate row or one for all."""
    model: PairModel | None = policy.pairs
    size = rows.size
    # Where progress is not measured, a Lucid-style share score may refuse (share_score).
    shared = share_refusals(table, rows, policy.max_share_score, job_util, progress=progress)
    extra = np.full(size, np.nan)
    gain = np.full(size, np.nan)
    refused = np.zeros(size, dtype=bool) if shared is None else shared
    if model is None or not model_name or not model.types:
        return None if shared is None else PairTerms(extra, gain, refused, {})
    sources: dict[int, str] = {}
    names, type_id = table.type_names, table.type_id
    for i, r in enumerate(rows.tolist()):
        gpu_type = names[type_id[r]]
        if not model.knows(gpu_type):
            continue
        here = table.row_models.get(r, ())
        if any(not m for m, *_ in here):
            continue  # a pod without a model: the curve judges this GPU
        measured = progress and all(p for *_, p in here)
        if not measured or not model.has_figures(gpu_type):  # the curve judges, refusals stand
            refused[i] |= not all(model.can_share(gpu_type, model_name, m, learned=measured)
                                  for m, *_ in here)
            continue
        if not here:
            continue  # an idle GPU: Horus's term is the job alone, as the pair formula's
        u_job = float(job_util[i if job_util.size > 1 else 0])
        utils = [u for _, u, _, _ in here] + [u_job]
        models, widths = [m for m, *_ in here], [w for _, _, w, _ in here]
        curve = _curve_pair(coeffs[i if coeffs.shape[0] > 1 else 0], utils)
        row = judge_row(model, gpu_type, model_name, models, widths, curve)
        refused[i] |= not row.fits
        if row.source != CURVE:
            extra[i], gain[i], sources[r] = row.extra_util, row.gain, row.source
    if np.isnan(extra).all() and not refused.any():
        return None
    return PairTerms(extra, gain, refused, sources)


@dataclass(frozen=True)
class RowVerdict:
    """One GPU judged for a newcomer beside the pods there (:func:`judge_row`)."""

    extra_util: float
    """What the pair figures add to Horus's utilisation term (nan: the curve judges)."""
    gain: float
    """The throughput rule's gain, where the newcomer's figures were measured (else nan)."""
    fits: bool
    source: str
    loss: float
    """Progress the GPU gives up by the pair figures (:class:`extender.core.pairs.GpuVerdict`)."""


def judge_row(model: PairModel, gpu_type: str, model_name: str, models: list[str],
              widths: list[int], curve: Callable[[int, int], float]) -> RowVerdict:
    """A newcomer of ``model_name`` beside the training pods of ``models`` (each spanning
    ``widths`` GPUs) on a GPU of ``gpu_type``; ``curve(i, j)``: the curve's figure for a pair
    (the newcomer is index ``len(models)``). The one rule :func:`pair_terms` applies per row
    (and the offline decisions benchmark per pair)."""
    verdict = judge_gpu(model, gpu_type, model_name, models, widths, curve)
    if verdict.source == CURVE:  # nothing known of the pod's pairs here: Horus judges
        return RowVerdict(math.nan, math.nan, verdict.fits, CURVE, verdict.loss)
    # The curve is the prior: the figures move Horus's term by the progress they say
    # the GPU loses beyond what the curve's own figures lose in the same formula, so
    # GPUs judged by pairs and GPUs judged by the curve compare on one scale.
    prior = judge_gpu(_curve_only(gpu_type, model.explore_bonus), gpu_type, model_name,
                      models, widths, curve)
    measured = verdict.source.partition(":")[0] not in UNTRIED  # measured: its rule decides
    return RowVerdict(verdict.loss - prior.loss, verdict.gain if measured else math.nan,
                      verdict.fits, verdict.source, verdict.loss)


def _curve_only(gpu_type: str, explore_bonus: float) -> PairModel:
    """A model that knows ``gpu_type`` and no pair on it: every figure is the curve's, an
    untried one (so a GPU judged by the curve keeps the exploration bonus it had)."""
    return PairModel({gpu_type: TypePairs()}, explore_bonus=explore_bonus)


def pair_rule(code: np.ndarray, terms: PairTerms, policy: CostPolicy) -> np.ndarray:
    """``code`` with the co-location rule re-judged by the pair figures where they apply.

    A refused pair is ``COLOCATION_SLOWDOWN``; the throughput rule uses the pair gain
    in place of the curve's (only when no utilisation cap shares that reason)."""
    slow = Reason.COLOCATION_SLOWDOWN.code
    judged = ~np.isnan(terms.gain)
    out = code.copy()
    if policy.min_colocation_gain_percent is not None and policy.max_colocated_util_percent is None:
        out = np.where(judged & (out == slow), 0, out)
        worse = judged & (terms.gain <= policy.min_colocation_gain_percent / 100.0)
        out = np.where((out == 0) & worse, slow, out)
    return np.where((out == 0) & terms.refused, slow, out)


def pair_cost(cost: np.ndarray, terms: PairTerms, policy: CostPolicy) -> np.ndarray:
    """Horus's Eq. 7 with the pair figures' correction of its utilisation term where they
    apply (memory term unchanged)."""
    return cost + policy.w_util * np.nan_to_num(terms.extra_util)
