"""Pairwise interference in decisions: who slows whom, as learned (pure, no I/O).

The curve of summed utilisation gives two co-located jobs the same slowdown;
measured co-location is asymmetric (a language model may run 3.5x slower beside
a ResNet that runs only 1.25x slower beside it). :class:`PairModel` holds what
the extender learned per GPU type (:mod:`extender.learning.interference`) and
answers, for a job of model ``a`` beside one of model ``b``, how many times
slower ``a`` runs and where that figure comes from:

- ``pair:<n>``: the pair was seen ``n`` times; the mean of its log slowdowns,
  shrunk toward the profile (or the curve) with the weight of ``prior_weight``
  samples;
- ``matrix``: a measured matrix given as the prior (``learning.pair_prior``) lists
  the pair: its log slowdown ``x`` calibrated to this GPU type as ``alpha + beta x``,
  the line fitted to the pairs seen here (the matrix may come from another GPU type,
  and what agents show of a slowdown need not equal it); a GPU type the matrix does
  not list takes the mean over the types it does (:attr:`PairModel.default`);
- ``group:<n>``: the pair was never seen alone together, the matrix does not list
  it, but it was part of ``n`` samples from GPUs shared by three or more jobs: its
  extra slowdown solved from them by the rule below
  (:mod:`extender.learning.interference`);
- ``profile``: both models were seen with others: ``exp(mu + sens[a] + aggr[b])``,
  ``a``'s sensitivity and ``b``'s aggressiveness;
- ``features``: on a GPU type with pairs measured from progress, a pair with a model never
  measured there: the mean of the type's measured log slowdowns (:attr:`TypePairs.unseen`;
  what the completion gives a job without features), not the curve of summed utilisation,
  which reads the measured GPUs' pairs as far milder than they run;
- ``curve``: none of these: the GPU type's curve, ``1 + f(u_a + u_b)``.

Models are named by their ``tandem.io/model`` reference. A job's slowdown on a
GPU with several others is ``1 + sum over them of (s[a][b] - 1)`` (the
simulator's truth uses the same rule).

**Cost.** For a training pod on a GPU of a type the model knows, where the pod
and every training pod already there name a model, Horus's utilisation term
moves by ``loss - loss_curve``: ``loss`` is the progress the GPU gives up,
``(1 - 1/s_new) + sum over the jobs there of (1/s_before - 1/s_after)``, and
``loss_curve`` the same with every figure the curve's. The curve is the prior:
figures equal to its own cost what it does, so GPUs judged by pairs and GPUs
judged by the curve compare on one scale (``extender.core.pair_cost``). The memory
term is unchanged. The co-location throughput rule reads the same figures (rate
after / rate before) where the newcomer's figures were measured. Elsewhere
decisions are Horus's, so a cluster with nothing learned decides exactly as before.

**Exploration.** A pair never seen is judged by the matrix, its profile or the
curve; when its figure comes from there, its loss is lowered by ``explore_bonus`` (at most
that, never below zero), so an untried pair wins over a known one only when
their predicted losses are within ``explore_bonus``: a choice made for
exploration costs at most ``explore_bonus`` of predicted progress more than the
greedy one (``tests/extender/learning/test_pairs.py`` checks the bound). Pairs known not to fit
together (``cannot_share``) are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

CURVE = "curve"
PROFILE = "profile"
MATRIX = "matrix"
GROUP = "group"
PAIR = "pair"
PROGRESS = "progress"
COMPLETED = "completed"
FEATURES = "features"
UNTRIED = (CURVE, PROFILE, MATRIX, COMPLETED, FEATURES)
"""Sources of a figure for a pair never seen on this GPU type."""


@dataclass(frozen=True)
class TypePairs:
    """One GPU type's learned interference."""

    pairs: Mapping[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    """(a, b) -> (mean log slowdown of a beside b, samples)."""
    mu: float = 0.0
    sens: Mapping[str, float] = field(default_factory=dict)
    aggr: Mapping[str, float] = field(default_factory=dict)
    cannot: frozenset[frozenset[str]] = frozenset()
    prior: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(a, b) -> log slowdown of a beside b in the measured matrix (``learning.pair_prior``)."""
    calibration: tuple[float, float] = (0.0, 1.0)
    """``(alpha, beta)``: the matrix's log slowdown ``x`` reads ``alpha + beta x`` here."""
    inferred: Mapping[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    """(a, b) -> (log slowdown solved from GPUs shared by three or more, samples it was in),
    for pairs not seen alone together."""
    progress: Mapping[tuple[str, str], tuple[float, float, str]] = field(default_factory=dict)
    """(a, b) -> (log slowdown, its variance, source) learned from the jobs' progress
    (:mod:`extender.learning.progress_pairs`): ``progress:<n>``, ``completed`` or
    ``features``; where given, it is the figure."""
    losing: frozenset[frozenset[str]] = frozenset()
    """Pairs whose measured progress was worse than taking turns: refused."""
    prior_var: float | None = None
    """The variance of a ``prior`` figure where the matrix was measured on this very GPU
    type (a profiling campaign of its pairs): both ways listed, a pair is then judged as
    measured (:meth:`PairModel.can_share`); None: another type's matrix, or none."""
    unseen: float | None = None
    """The log slowdown of a pair with a model never measured here, where ``progress`` holds
    measured pairs (:func:`unseen_figure`); None: the curve's."""


@dataclass(frozen=True)
class PairModel:
    """What decisions know of pairwise interference (module docstring)."""

    types: Mapping[str, TypePairs] = field(default_factory=dict)
    prior_weight: float = 0.5
    explore_bonus: float = 0.0
    default: TypePairs | None = None
    """What a GPU type not in ``types`` takes: the matrix's pairs pooled over the types it
    lists (None: such a type is the curve's)."""

    def knows(self, gpu_type: str) -> bool:
        """True when decisions on ``gpu_type`` use pair figures."""
        return self._type(gpu_type) is not None

    def _type(self, gpu_type: str) -> TypePairs | None:
        return self.types.get(gpu_type) or self.default

    def has_figures(self, gpu_type: str) -> bool:
        """True when something beyond refusals is known on ``gpu_type`` (pairs seen, a
        matrix, progress, group solves, profiles); with only pairs seen not to fit, the
        curve judges its GPUs and only the refusals stand."""
        t = self._type(gpu_type)
        return t is not None and bool(t.pairs or t.prior or t.progress or t.inferred
                                      or t.sens or t.aggr)

    def figure(self, gpu_type: str, a: str, b: str, curve: float) -> tuple[float, str]:
        """``(slowdown of a beside b, source)``; ``curve`` is the curve's figure for the pair."""
        t = self._type(gpu_type)
        if t is None:
            return max(curve, 1.0), CURVE
        learned = t.progress.get((a, b))
        if learned is not None:
            return max(1.0, math.exp(learned[0])), learned[2]
        prior, source = math.log(max(curve, 1.0)), CURVE
        measured = t.prior.get((a, b))
        if measured is not None:
            alpha, beta = t.calibration
            prior, source = alpha + beta * measured, MATRIX
        elif a in t.sens and b in t.aggr:
            prior, source = t.mu + t.sens[a] + t.aggr[b], PROFILE
        inferred = t.inferred.get((a, b))
        if inferred is not None:  # solved toward the figure above (never seen as a pair)
            prior, source = inferred[0], f"{GROUP}:{inferred[1]}"
        seen = t.pairs.get((a, b))
        if seen is not None and seen[1] > 0:
            mean, n = seen
            value = (n * mean + self.prior_weight * prior) / (n + self.prior_weight)
            return max(1.0, math.exp(value)), f"{PAIR}:{n}"
        if source == CURVE and t.unseen is not None:
            return max(1.0, math.exp(t.unseen)), FEATURES
        return max(1.0, math.exp(prior)), source

    def can_share(self, gpu_type: str, a: str, b: str, learned: bool = True) -> bool:
        """False when ``a`` and ``b`` were seen not to fit together on ``gpu_type``, or
        (``learned``) their progress was measured worse than taking turns, or, both ways
        measured (from progress, or in a matrix measured on this type), even their
        optimistic figures (:data:`EXPLORE_Z` standard deviations up) do not beat
        ``1 + SHARE_MARGIN`` (:func:`shares`). Figures only completed from other pairs
        refuse nothing: the curve, which would share them, is the prior. ``learned``
        False: the memory rule alone (a pod whose progress is not measured)."""
        t = self._type(gpu_type)
        if t is None:
            return True
        pair = frozenset((a, b))
        if pair in t.cannot:
            return False
        if not learned:
            return True
        if pair in t.losing:
            return False
        ab, ba = _own(t, a, b), _own(t, b, a)
        if ab is None or ba is None:
            return True  # uncertain figures refuse nothing the curve (the prior) would share
        return shares(ab, ba, z=-EXPLORE_Z)


def _measured(source: str) -> bool:
    return source.partition(":")[0] == PROGRESS


def _own(t: TypePairs, a: str, b: str) -> tuple[float, float] | None:
    """``a`` beside ``b`` as measured on this GPU type: its progress samples' figure, else
    the matrix's where it was measured on this type (:attr:`TypePairs.prior_var`)."""
    f = t.progress.get((a, b))
    if f is not None and _measured(f[2]):
        return f[0], f[1]
    listed = t.prior.get((a, b)) if t.prior_var is not None else None
    return None if listed is None else (listed, t.prior_var)  # type: ignore[return-value]


MIN_UNSEEN_PAIRS = 3
"""Directed pairs measured on a GPU type before a pair never measured there reads their mean."""


def unseen_figure(progress: Mapping[tuple[str, str], tuple[float, float, str]]) -> float | None:
    """The mean log slowdown of the pairs measured from progress in ``progress`` (one GPU
    type's figures), None with fewer than :data:`MIN_UNSEEN_PAIRS`: what a pair with a model
    never measured there reads (:attr:`TypePairs.unseen`)."""
    logs = [log for log, _var, source in progress.values() if _measured(source)]
    return sum(logs) / len(logs) if len(logs) >= MIN_UNSEEN_PAIRS else None


SHARE_MARGIN = 0.02
SHARE_Z = 0.5
"""Two jobs share a GPU where their combined normalised progress beats ``1 + SHARE_MARGIN``
by ``SHARE_Z`` standard deviations (:func:`shares`)."""
EXPLORE_Z = 1.0
"""Placements are optimistic by this many standard deviations (an untried pair is tried
while its figures might beat the margin, then judged by what was measured)."""


def combined(ab: tuple[float, float], ba: tuple[float, float]) -> tuple[float, float]:
    """``1/s_ab + 1/s_ba`` from the two (log slowdown, variance) figures, and its standard
    deviation (the delta method)."""
    ra, rb = math.exp(-ab[0]), math.exp(-ba[0])
    return ra + rb, math.sqrt(ra * ra * ab[1] + rb * rb * ba[1])


def shares(ab: tuple[float, float], ba: tuple[float, float], margin: float = SHARE_MARGIN,
           z: float = SHARE_Z) -> bool:
    """True where the pair's combined normalised progress beats ``1 + margin`` by ``z``
    standard deviations (taking turns is worth 1)."""
    value, sd = combined(ab, ba)
    return value - z * sd > 1.0 + margin


@dataclass(frozen=True)
class GpuVerdict:
    """One shared GPU judged for a newcomer by the pair figures."""

    loss: float
    """Progress the GPU gives up (see module docstring), exploration bonus applied."""
    gain: float
    """Relative change of the GPU's progress rate (``after / before - 1``)."""
    fits: bool
    source: str
    """Where the newcomer's figure came from (the weakest source among its pairs)."""


_RANK = {CURVE: 0, PROFILE: 1, FEATURES: 1, MATRIX: 2, COMPLETED: 2, GROUP: 3, PAIR: 4,
         PROGRESS: 4}


def _rank(source: str) -> int:
    """How direct a source is (``pair:<n>`` most): the weakest names a GPU's figure."""
    return _RANK.get(source.partition(":")[0], len(_RANK))


def _slowdowns(model: PairModel, gpu_type: str, models: Sequence[str],
               curve: Callable[[int, int], float]) -> tuple[list[float], list[str]]:
    slows, sources = [], []
    for i, a in enumerate(models):
        extra, worst = 0.0, None
        for j, b in enumerate(models):
            if i != j:
                value, source = model.figure(gpu_type, a, b, curve(i, j))
                extra += value - 1.0
                if worst is None or _rank(source) < _rank(worst):
                    worst = source
        slows.append(1.0 + extra)
        sources.append(worst or CURVE)
    return slows, sources


def judge_gpu(model: PairModel, gpu_type: str, newcomer: str, here: Sequence[str],
              widths: Sequence[int], curve: Callable[[int, int], float]) -> GpuVerdict:
    """The newcomer (index ``len(here)`` for ``curve``) beside the jobs ``here``.

    ``widths``: each job's GPU count (a job spanning ``w`` GPUs stalls all of them,
    as in the curve's rule); ``curve(i, j)``: the curve's figure for the pair."""
    fits = all(model.can_share(gpu_type, newcomer, m) for m in here)
    before, _ = _slowdowns(model, gpu_type, here, curve)
    after, sources = _slowdowns(model, gpu_type, [*here, newcomer], curve)
    rate_before = sum(w / s for w, s in zip(widths, before, strict=True))
    rate_after = sum(w / s for w, s in zip(widths, after, strict=False)) + 1.0 / after[-1]
    loss = (1.0 - 1.0 / after[-1]) + sum(
        w * (1.0 / b - 1.0 / a) for w, b, a in zip(widths, before, after, strict=False))
    source = sources[-1]
    if source in UNTRIED:  # untried: bounded optimism (module docstring)
        loss = max(0.0, loss - model.explore_bonus)
    gain = rate_after / rate_before - 1.0 if rate_before > 0 else math.inf
    return GpuVerdict(loss, gain, fits, source)
