"""The predictor's bias, learned from what was observed, for keys not observed yet.

Every resolution that asks the predictor records its answer per learning key
(model, batch size, workload, GPU type, GPU count). Where a key also has a trusted
alone estimate, ``observed / predicted`` says how wrong the prior was there. Those
ratios, in logarithms, are pooled in three levels, each shrunk toward the level
above by its own uncertainty (a positive-part James-Stein factor
``mean^2 / (mean^2 + se^2)``, so a scattered or thin level moves little):

- global: the mean over models (each model's ratios averaged first), applied only
  once :data:`MIN_MODELS` models are observed, shrunk toward no correction;
- per GPU type: the type's offset from the global bias, once :data:`MIN_MODELS`
  models are observed on it (a prior that is off on one GPU type);
- per model: the model's own offset from the two above, from its estimates on other
  GPU types and GPU counts, shrunk by the spread one model's ratio shows across them.

The correction is ``exp(sum of levels)``, bounded to [1/:data:`MAX_FACTOR`,
:data:`MAX_FACTOR`]; smaller than :data:`MIN_CHANGE` it is not applied. Resolution
uses it only for a key with no trusted estimate of its own (``prior-corrected:<n>``,
``n`` the estimates it rests on). Estimates that do not serve a pod's namespace
(taught by one other namespace) are left out of that pod's correction. Predictions
are kept in memory: after a restart the correction rests on the predictions made
since (every pod's resolution records its own).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from extender.learning.document import Key
from extender.learning.estimate import Estimate

MIN_MODELS = 3
"""Observed models a global or GPU-type correction needs."""
MAX_FACTOR = 3.0
"""Largest correction either way (a factor of the prediction)."""
MIN_CHANGE = 0.02
"""Corrections within about 2% of the prediction are not applied."""
MIN_UTIL = 1.0
"""Predictions (and estimates) below this many points give no ratio (the log explodes)."""
CEILING = 85.0
"""Estimates at or above this (phases and noise keep a saturated GPU's mean under 100) say
only that the ratio is at least theirs: such a model counts at the level the others set
when that is more, and gives no lower GPU-type or model offset."""
REBUILD_SECONDS = 30.0
"""Most often the pooled levels are recomputed (when new samples arrived)."""
MODEL_LOG_SD = 0.25
"""Spread of one model's log ratio across GPU types assumed until two of them are seen."""
MAX_TABLES = 64


def _shrunk(values: list[float]) -> float:
    """The mean of ``values`` shrunk toward 0 by its standard error (module docstring)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return 0.0
    se2 = sum((v - mean) ** 2 for v in values) / (n - 1) / n
    return mean * mean * mean / (mean * mean + se2) if mean else 0.0


@dataclass
class _Levels:
    """The pooled log corrections for one namespace."""

    global_log: float = 0.0
    by_type: dict[str, float] = field(default_factory=dict)
    by_model: dict[tuple[str, int, str], float] = field(default_factory=dict)
    estimates: int = 0


def pooled(pairs: Iterable[tuple[Key, float, float]]) -> _Levels:
    """The three levels from ``(key, observed, predicted)`` pairs."""
    rows = [(k, math.log(max(obs, MIN_UTIL) / pred), obs >= CEILING) for k, obs, pred in pairs
            if pred >= MIN_UTIL]
    levels = _Levels(estimates=len(rows))
    by_model: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    censored: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for k, r, at_ceiling in rows:
        (censored if at_ceiling else by_model)[k[:3]].append(r)
    means = {m: sum(v) / len(v) for m, v in by_model.items()}
    if len(means) >= MIN_MODELS:  # a lower bound under the level counts as the level
        floor = _shrunk(list(means.values()))
        bounds = {m: max(floor, sum(v) / len(v)) for m, v in censored.items() if m not in means}
    else:  # too few below the ceiling: the lower bounds themselves (an under-correction)
        bounds = {m: sum(v) / len(v) for m, v in censored.items() if m not in means}
    if len(means) + len(bounds) >= MIN_MODELS:
        levels.global_log = _shrunk([*means.values(), *bounds.values()])
    ratios = [(k, r) for k, r, at_ceiling in rows
              if not at_ceiling or k[:3] not in means and r > levels.global_log]
    per_type: dict[str, dict[tuple[str, int, str], list[float]]] = defaultdict(
        lambda: defaultdict(list))
    for k, r in ratios:
        per_type[k[3]][k[:3]].append(r - levels.global_log)
    for gpu_type, models in per_type.items():
        if len(models) >= MIN_MODELS:
            levels.by_type[gpu_type] = _shrunk([sum(v) / len(v) for v in models.values()])
    residuals: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for k, r in ratios:
        residuals[k[:3]].append(r - levels.global_log - levels.by_type.get(k[3], 0.0))
    spread = [(r - sum(v) / len(v)) ** 2 for v in residuals.values() if len(v) > 1 for r in v]
    dof = sum(len(v) - 1 for v in residuals.values() if len(v) > 1)
    var = sum(spread) / dof if dof else MODEL_LOG_SD ** 2
    for model, v in residuals.items():
        mean = sum(v) / len(v)
        levels.by_model[model] = mean * mean * mean / (mean * mean + var / len(v)) \
            if mean else 0.0
    return levels


class PriorBias:
    """Records predictions and answers corrected ones (module docstring); thread-safe.

    ``trusted``: the trusted alone estimates by key (the store's); ``version``: a number
    that changes whenever a sample arrives; ``clock``: wall-clock seconds."""

    def __init__(self, trusted: Callable[[], list[tuple[Key, Estimate]]],
                 version: Callable[[], int], clock: Callable[[], float],
                 max_entries: int = 2000):
        self._trusted, self._version, self._clock = trusted, version, clock
        self._max = 2 * max_entries
        self._predicted: OrderedDict[Key, float] = OrderedDict()
        self._tables: dict[str | None, _Levels] = {}
        self._built: tuple[float, int] = (-math.inf, -1)
        self._lock = threading.Lock()

    def note(self, key: Key, predicted: float) -> None:
        """The predictor answered ``predicted`` for ``key``."""
        with self._lock:
            self._predicted[key] = predicted
            self._predicted.move_to_end(key)
            while len(self._predicted) > self._max:
                self._predicted.popitem(last=False)

    def corrected(self, key: Key, predicted: float, namespace: str | None = None,
                  ) -> tuple[float, int] | None:
        """Records ``predicted`` for ``key`` and returns ``(corrected util, estimates)``, or
        None when no correction applies."""
        self.note(key, predicted)
        if predicted < MIN_UTIL:
            return None
        levels = self._levels(namespace)
        log_c = levels.global_log + levels.by_type.get(key[3], 0.0) \
            + levels.by_model.get(key[:3], 0.0)
        log_c = max(-math.log(MAX_FACTOR), min(math.log(MAX_FACTOR), log_c))
        if abs(log_c) < MIN_CHANGE:
            return None
        return round(min(100.0, predicted * math.exp(log_c)), 2), levels.estimates

    def _levels(self, namespace: str | None) -> _Levels:
        now, version = self._clock(), self._version()
        with self._lock:
            stale = version != self._built[1] and now - self._built[0] >= REBUILD_SECONDS
            if stale or len(self._tables) > MAX_TABLES:
                self._tables.clear()
                self._built = (now, version)
            found = self._tables.get(namespace)
            if found is not None:
                return found
            predicted = dict(self._predicted)
        pairs = [(k, e.mean, predicted[k]) for k, e in self._trusted()
                 if k in predicted and e.serves(namespace)]
        levels = pooled(pairs)
        with self._lock:
            self._tables[namespace] = levels
        return levels
