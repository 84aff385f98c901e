"""Learning who slows whom: pairwise interference from shared GPUs (docs/interference.md).

A sample comes from a GPU that an agent report shows shared by exactly two
training pods this extender placed, each naming its model and each with its
own utilisation figure (a share of the GPU: :mod:`extender.learning.readings` sets
aside figures that are not), and no unattributed process. For each pod, with
``alone`` its model's trusted alone estimate on that GPU type
(:mod:`extender.learning.store`) and ``shared`` its figure now, the sample is
``log(alone / shared)`` for the directed pair (its model, the other's model):
how many times slower it appears to run beside the other. Until the model's
alone estimate is trusted, ``alone`` is the per-GPU utilisation bind placed the
pod with when that was the predictor's figure (never an owner's assertion nor the
cold-start whole-GPU figure): on a busy cluster most models are rarely seen alone
long enough to be trusted, and waiting for that left most pairs unlearned. A
model's prediction error shifts all its pairs by the same factor, which leaves
the order of its partners unchanged. The learner is not
told how utilisation follows slowdown (proportionally for compute-bound jobs,
less for memory-bound ones); it learns the figure that utilisation shows, which
ranks pairs the same way. Samples are clipped to [0, log 20].

A GPU shared by three or more such pods gives, for each pod, a *group* sample: its
extra slowdown ``alone / shared - 1`` beside that set of others, which by the rule
for three or more jobs (:mod:`extender.core.pairs`) is the sum of its pairs'
extras. On a busy cluster these are often most reports. Every ``GROUP_REFIT_SECONDS``
(when samples came in) the extras of the pairs they hold are solved together with
the pairs seen: least squares kept to extras in [0, 19], each pair pulled toward
the figure it had without them, firmly (``pair_fit.GROUP_RIDGE_MATRIX``) where that is
a measured matrix's and lightly (``pair_fit.GROUP_RIDGE``) where it is a profile or the median
of the pairs seen. A pair neither seen alone together nor listed by the matrix then
reads ``group:<n>``: a measurement of the pair itself, seen here or in the matrix,
beats one inferred from a crowd (with the matrix, the simulator showed no gain from
replacing its figures).

Per GPU type it keeps, bounded by ``learning.pair_max_entries`` (least recently
seen dropped):

- per directed pair, the count, mean and spread of the log samples (its
  uncertainty is the standard error, shown in ``/v1/state``);
- per model, sensitivity and aggressiveness: ``log s[a][b] ~ mu + sens[a] + aggr[b]``,
  a ridge fit (weight 1 toward 0) over the pairs seen, refitted when asked after a change;
- per model and set of others it shared a GPU with, the count and mean of its extra
  slowdown (group samples);
- pairs seen not to fit together (a start that failed out of memory beside the other).

A measured matrix (``learning.pair_prior``, :mod:`contracts.interferencefile`) is the
prior of the pairs it lists: a GPU type it lists takes its own table (its
``cannot_share`` pairs refused), any other the mean log slowdown over the types that
list the pair. Per GPU type the line ``log s_here = alpha + beta * log s_matrix`` is
fitted to the pairs seen here (ridge toward alpha 0, beta 1 with the weight of
``pair_fit.CALIBRATION_RIDGE`` pairs), so a matrix measured on another GPU type, or read
through a signal that shows slowdown less than fully, ranks pairs before they are
tried and is corrected as they are.

:meth:`PairLearner.model` builds a :class:`extender.core.pairs.PairModel` at the end of
each report; decisions read it through :meth:`PairLearner.current`. The GPU type's curve
stays the last fallback.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from contracts.interferencefile import PairTable
from extender.core import Placement
from extender.core.pairs import PairModel, TypePairs
from extender.core.snapshot import gpu_type_of
from extender.learning.completion import MATRIX_SAMPLES
from extender.learning.pair_document import PairKey, decode, decode_progress, encode
from extender.learning.pair_fit import (
    MAX_EXTRA,
    MAX_LOG,
    GroupKey,
    calibrate,
    fit_profiles,
    pooled_logs,
    prior_logs,
    solve_group_types,
)
from extender.learning.progress_pairs import DEFAULT_NOISE_VAR, ProgressPairs, progress_view
from extender.learning.progress_tracker import ProgressTracker, modelled_pod
from extender.state.reports import DecodedReport

MAX_TRACKED_PODS = 100_000
GROUP_REFIT_SECONDS = 60.0
PROGRESS_REFIT_SECONDS = 60.0
"""How often the progress estimates (a low-rank completion, about a second of CPU at 26
models, on the agents' report path) are refitted at most. At 600 s a model first measured
waited up to ten minutes before its figures reached decisions, while jobs arrived every
36 s in the simulator's testbed mixes: the learner captured none of the pair-oracle's gain
on tuning seeds where a minute captured some (docs/interference.md)."""
DOCUMENT_KEY = "pairs"


class PairLearner:
    """Directed pair statistics, per-model profiles and refused pairs (module docstring)."""

    def __init__(self, max_entries: int = 4000, explore_bonus: float = 0.05,
                 prior_weight: float = 0.5, warmup_seconds: float = 0.0,
                 clock: Callable[[], float] = time.time,
                 prior: Mapping[str, PairTable] | None = None,
                 groups: bool = True, group_refit_seconds: float = GROUP_REFIT_SECONDS,
                 progress_refit_seconds: float = PROGRESS_REFIT_SECONDS):
        self.max_entries = max_entries
        self.groups = groups
        """Take group samples (``learning.pair_groups``)."""
        self.group_refit_seconds = group_refit_seconds
        self.progress_refit_seconds = progress_refit_seconds
        self._prior = prior_logs(prior or {})
        """Listed GPU type -> ((a, b) -> log slowdown, cannot-share pairs)."""
        self._pooled = pooled_logs(self._prior)
        """(a, b) -> mean log slowdown over the listed types: for every other type."""
        self.warmup_seconds = warmup_seconds
        self.clock = clock
        self._first_seen: OrderedDict[tuple[str, str, int], float] = OrderedDict()
        """(pod uid, node, GPU index) -> when it was first reported there (warm-up)."""
        self.explore_bonus = explore_bonus
        self.prior_weight = prior_weight
        self._stats: OrderedDict[PairKey, list[float]] = OrderedDict()
        """key -> [count, mean, m2] of the log samples (Welford)."""
        self._groups: OrderedDict[GroupKey, list[float]] = OrderedDict()
        """key -> [count, mean] of the extra slowdown (group samples)."""
        self._group_version = 0
        """Bumped by every change to the group samples."""
        self._solved: tuple[float, int, dict[str, dict[tuple[str, str], tuple[float, int]]]] \
            | None = None
        """(when, group version, GPU type -> pairs solved from the group samples): solved
        again when the groups changed and ``group_refit_seconds`` passed."""
        self._cannot: set[tuple[str, frozenset[str]]] = set()
        self._lock = threading.Lock()
        self.version = 0
        """Bumped by every change to what is learned."""
        self._rebuilds = 0
        """Bumped by the changes decisions must see at once: a refusal, a load, a reset."""
        self.samples_total = 0
        self.group_samples_total = 0
        self.dirty = False
        self._cache: tuple[int, int, PairModel] | None = None
        """(version, rebuilds, the model built then)."""
        self.tracker = ProgressTracker({t: logs for t, (logs, _) in self._prior.items()},
                                       max_entries, progress_refit_seconds)
        """Progress samples and what they predict (:mod:`extender.learning.progress_tracker`)."""

    @property
    def progress(self) -> ProgressPairs:
        """The progress samples (:mod:`extender.learning.progress_pairs`)."""
        return self.tracker.pairs

    # ---- learning ------------------------------------------------------------------
    def add(self, gpu_type: str, a: str, b: str, slowdown: float) -> None:
        """One sample: ``a`` appeared ``slowdown`` times slower beside ``b``."""
        if not math.isfinite(slowdown) or slowdown <= 0:
            return
        x = min(MAX_LOG, max(0.0, math.log(slowdown)))
        key = (gpu_type, a, b)
        with self._lock:
            st = self._stats.pop(key, None) or [0.0, 0.0, 0.0]
            st[0] += 1
            delta = x - st[1]
            st[1] += delta / st[0]
            st[2] += delta * (x - st[1])
            self._stats[key] = st
            while len(self._stats) > self.max_entries:
                self._stats.popitem(last=False)
            self.version += 1
            self.samples_total += 1
            self.dirty = True

    def add_group(self, gpu_type: str, a: str, others: Sequence[str], slowdown: float) -> None:
        """One group sample: ``a`` appeared ``slowdown`` times slower beside all ``others``."""
        if not math.isfinite(slowdown) or slowdown <= 0 or len(others) < 2:
            return
        x = min(MAX_EXTRA, max(0.0, slowdown - 1.0))
        key = (gpu_type, a, tuple(sorted(others)))
        with self._lock:
            st = self._groups.pop(key, None) or [0.0, 0.0]
            st[0] += 1
            st[1] += (x - st[1]) / st[0]
            self._groups[key] = st
            while len(self._groups) > self.max_entries:
                self._groups.popitem(last=False)
            self._group_version += 1
            self.version += 1
            self.samples_total += 1
            self.group_samples_total += 1
            self.dirty = True

    def refuse(self, gpu_type: str, a: str, b: str) -> None:
        """``a`` failed to start beside ``b`` (out of memory): never pair them on this type."""
        with self._lock:
            entry = (gpu_type, frozenset((a, b)))
            if entry not in self._cannot:
                self._cannot.add(entry)
                self.version += 1
                self._rebuilds += 1
                self.dirty = True

    def observe(self, report: DecodedReport, placement_of: Callable[[str], Placement | None],
                alone: Callable[[str, int, str], float | None]) -> int:
        """Samples from the GPUs of ``report`` shared by two or more placed, modelled pods,
        all past their warm-up on the GPU (``learning.warmup_seconds``): pair samples
        where two share it, group samples where more do.

        ``alone(model, batch, gpu_type)``: the model's trusted alone utilisation, else None
        (then the utilisation the pod was placed with stands in, module docstring)."""
        taken = 0
        for gpu, procs in zip(report.gpus, report.processes, strict=False):
            pods: dict[str, float] = {}
            if any(not p.pod_uid or p.util_percent is None for p in procs):
                continue  # unattributed processes or no per-process figure: not a clean sample
            for p in procs:
                pods[str(p.pod_uid)] = pods.get(str(p.pod_uid), 0.0) + float(p.util_percent or 0)
            if len(pods) < 2 or (len(pods) > 2 and not self.groups):
                continue
            gpu_type = gpu_type_of(gpu.product)
            found = [modelled_pod(placement_of(uid), report.node, gpu.index) for uid in pods]
            warming = [self._warming(uid, report.node, gpu.index) for uid in pods]
            if any(f is None for f in found) or any(warming):
                continue  # a pod loading or compiling shows no steady utilisation yet
            models, slowdowns = [], []
            for modelled, shared in zip(found, pods.values(), strict=True):
                model, batch, placed = modelled  # type: ignore[misc]
                base = alone(model, batch, gpu_type) or placed
                models.append(model)
                slowdowns.append(base / shared if base > 0 and shared > 0 else 0.0)
            if not all(slowdowns):
                continue
            for i, (model, slowdown) in enumerate(zip(models, slowdowns, strict=True)):
                others = models[:i] + models[i + 1:]
                if len(others) == 1:
                    self.add(gpu_type, model, others[0], slowdown)
                else:
                    self.add_group(gpu_type, model, others, slowdown)
            taken += len(models)
        # Fit (and, when due, solve) here, on the report's path, so that decisions
        # (:meth:`current`) read a built model instead of building it.
        self.model()
        return taken

    def observe_progress(self, report: DecodedReport,
                         placement_of: Callable[[str], Placement | None]) -> int:
        """Progress samples from ``report`` (:meth:`ProgressTracker.observe`)."""
        taken = self.tracker.observe(report, placement_of, self.clock())
        if taken:
            with self._lock:
                self.version += 1
                self.dirty = True
            self.model()
        return taken

    def to_revert(self, report: DecodedReport, placement_of: Callable[[str], Placement | None],
                  window_s: float) -> list[str]:
        """The pods of ``report`` to move (``learning.revert_losing_seconds``,
        :meth:`ProgressTracker.to_revert`)."""
        return self.tracker.to_revert(report, placement_of, window_s,
                                      lambda uid, index: self._first(uid, report.node, index),
                                      self.clock())

    def _warming(self, uid: str, node: str, index: int) -> bool:
        """True during the pod's first ``warmup_seconds`` on this GPU (as the store rules)."""
        first = self._first(uid, node, index)  # before now: a first sighting is at age 0
        return self.clock() - first < self.warmup_seconds

    def _first(self, uid: str, node: str, index: int) -> float:
        """When the pod was first reported on this GPU (now, the first time asked)."""
        key = (uid, node, index)
        with self._lock:
            first = self._first_seen.pop(key, None)
            first = self.clock() if first is None else first
            self._first_seen[key] = first
            while len(self._first_seen) > MAX_TRACKED_PODS:
                self._first_seen.popitem(last=False)
        return first

    # ---- answers -------------------------------------------------------------------
    def current(self) -> PairModel | None:
        """What decisions use (None while nothing is learned): the model built after the
        last report (:meth:`observe` builds it), rebuilt here only when a refusal, a load
        or a reset came since, so that a decision never waits on a fit or a solve."""
        with self._lock:
            cached = self._cache
            if cached is not None and cached[1] == self._rebuilds:
                return cached[2]
        return self.model()

    def model(self) -> PairModel | None:
        """The model of everything learned so far (None while nothing is); cached per
        version, the group solve redone when due."""
        with self._lock:
            if not self._stats and not self._groups and not self._cannot and not self._prior \
                    and not self.tracker.samples_total:
                return None
            now = self.clock()
            solved = self._solved
            due = self._group_version != (solved[1] if solved else 0) and (
                solved is None or now - solved[0] >= self.group_refit_seconds)
            cached = self._cache
            if cached is not None and cached[0] == self.version and not due:
                return cached[2]
            stats = dict(self._stats)
            groups = dict(self._groups)
            group_version = self._group_version
            cannot = set(self._cannot)
            version, rebuilds = self.version, self._rebuilds
        types: dict[str, dict[tuple[str, str], tuple[float, int]]] = {}
        for (t, a, b), (n, mean, _m2) in stats.items():
            types.setdefault(t, {})[(a, b)] = (mean, int(n))
        for t, _pair in cannot:
            types.setdefault(t, {})
        for t in self._prior:
            types.setdefault(t, {})
        for t, _a, _others in groups:
            types.setdefault(t, {})
        fitted = {t: self._with_prior(t, fit_profiles(pairs, frozenset(
                      p for tt, p in cannot if tt == t))) for t, pairs in types.items()}
        if due:  # the costly part, at most once per group_refit_seconds
            inferred = solve_group_types(fitted, groups)
            with self._lock:
                self._solved = (now, group_version, inferred)
        else:
            inferred = solved[2] if solved else {}
        progress = self.tracker.estimates(now)
        if progress is not None:
            for t in {t for t, _a, _b in progress.figures}:
                fitted.setdefault(t, TypePairs())
        losing = self.tracker.losing() if progress is not None else frozenset()
        with_inferred = {t: replace(tp, inferred=inferred.get(t, {})) for t, tp in fitted.items()}
        built = PairModel({t: tp if progress is None else progress.type_pairs(t, tp, losing)
                           for t, tp in with_inferred.items()},
                          self.prior_weight, self.explore_bonus,
                          TypePairs(prior=self._pooled) if self._pooled else None)
        with self._lock:
            self._cache = (version, rebuilds, built)
        return built

    def _with_prior(self, gpu_type: str, fitted: TypePairs) -> TypePairs:
        """``fitted`` with the matrix's pairs for ``gpu_type`` and their calibration."""
        own = self._prior.get(gpu_type)
        logs, cannot = own or (self._pooled, frozenset())
        if not logs and not cannot:
            return fitted
        # a matrix measured on this very type: each figure as one measurement of the pair
        return replace(fitted, prior=logs, cannot=fitted.cannot | cannot,
                       calibration=calibrate(fitted.pairs, logs),
                       prior_var=DEFAULT_NOISE_VAR / MATRIX_SAMPLES if own else None)

    def view(self) -> list[dict[str, Any]]:
        """For ``/v1/state`` and ``tandem status``: per GPU type, pairs and profiles."""
        model = self.model()
        if model is None:
            return []
        with self._lock:
            stats = dict(self._stats)
            groups = list(self._groups)
        out = []
        for t, tp in sorted(model.types.items()):
            pairs = [{"model": a, "beside": b, "slowdown": round(math.exp(m), 3),
                      "samples": int(n), "log_stderr": round(_stderr(n, m2), 3)}
                     for (tt, a, b), (n, m, m2) in sorted(stats.items()) if tt == t]
            inferred = [{"model": a, "beside": b, "slowdown": round(math.exp(m), 3),
                         "group_samples": n} for (a, b), (m, n) in sorted(tp.inferred.items())]
            alpha, beta = tp.calibration
            out.append({"gpu_type": t, "pairs": pairs, "inferred": inferred,
                        "groups": sum(1 for tt, _a, _o in groups if tt == t),
                        "prior": {"pairs": len(tp.prior), "offset": round(alpha, 4),
                                  "scale": round(beta, 4)},
                        "profiles": {m: {"sensitivity": round(tp.sens.get(m, 0.0), 3),
                                         "aggressiveness": round(tp.aggr.get(m, 0.0), 3)}
                                     for m in sorted(set(tp.sens) | set(tp.aggr))},
                        "cannot_share": sorted(sorted(p) for p in tp.cannot),
                        "progress": progress_view(tp)})
        return out

    def stats(self) -> dict[str, int]:
        """Counts for metrics: samples taken, pairs kept, refused pairs."""
        with self._lock:
            return {"samples": self.samples_total, "group_samples": self.group_samples_total,
                    "pairs": len(self._stats), "groups": len(self._groups),
                    "inferred_pairs": sum(len(p) for p in (self._solved or (0, 0, {}))[2].values()),
                    "cannot_share": len(self._cannot),
                    "progress_samples": self.tracker.samples_total,
                    "losing": len(self.tracker.losing()),
                    "prior_pairs": sum(len(logs) for logs, _ in self._prior.values())}

    # ---- persistence ---------------------------------------------------------------
    def to_document(self, max_bytes: int | None = None) -> dict[str, Any]:
        """The persisted form (inside the learning document under ``pairs``); within
        ``max_bytes`` of JSON, the least recently seen group samples, then pairs, left out."""
        with self._lock:
            return encode(self._stats, self._groups, self._cannot, max_bytes,
                          progress=self.progress.stats)

    def load_document(self, doc: Any) -> int:
        """Replace what is learned by ``doc`` (as :meth:`to_document` wrote it); ValueError."""
        stats, groups, cannot = decode(doc, self.max_entries)
        progress = decode_progress(doc, self.max_entries)
        with self._lock:
            self._stats, self._groups, self._cannot = stats, groups, cannot
            self.tracker.load(progress)
            self._solved = None
            self._group_version += 1
            self.version += 1
            self._rebuilds += 1
        return len(stats) + len(groups) + len(progress)

    def reset(self) -> None:
        """Forget everything learned about pairs."""
        with self._lock:
            self._stats.clear()
            self._groups.clear()
            self._cannot.clear()
            self.tracker.clear()
            self._solved = None
            self._group_version += 1
            self.version += 1
            self._rebuilds += 1
            self.dirty = True


def _stderr(n: float, m2: float) -> float:
    """Standard error of a pair's mean log slowdown (0.1 per sample's spread until 2 seen)."""
    sd = math.sqrt(m2 / (n - 1)) if n >= 2 else 0.1
    return sd / math.sqrt(n)
