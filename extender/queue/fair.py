"""The pure weighted-fair queue of Horus (TPDS'21 §4.2.2); no clock, no I/O.

Per scheduling round (Algorithm 1):

1. Pending jobs are clustered into ``k`` classes by k-means under the L1
   distance (the paper's metric) over four features: number of tasks, predicted
   utilisation, GPUs per task and predicted memory. Under L1 the centre that
   minimises the distance is the coordinate-wise median, so the update step uses
   medians (k-medians). Features are scaled by their column maximum so that MiB
   do not drown task counts. Initialisation is deterministic (farthest point),
   classes are renumbered by centroid so labels are stable across refits.
2. Each class ``x`` gets weight ``w_x = max(len_x, median_wait_x * len_x)``.
3. ``beta`` jobs are released: first every *starving* job (waited at least
   ``starvation_seconds``, oldest first; Horus "allows reservation for starving
   jobs"), then the rest of the ``beta`` slots are apportioned ``w_x / sum(w) *
   beta`` by largest remainder, each class giving its longest-waiting jobs.

Refitting k-means on every round costs O(n k) per iteration; the queue refits
every ``refit_every_rounds`` rounds and assigns new arrivals to the nearest
centroid in between (the simulator replays tens of thousands of rounds).
Ties always break on (enqueue time, insertion order), so replays are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


class QueueError(ValueError):
    """Invalid queue configuration or item (``field`` names the culprit)."""

    def __init__(self, field_name: str, problem: str):
        self.field = field_name
        self.problem = problem
        super().__init__(f"{field_name}: {problem}")


K_RANGE = (1, 64)
"""Job classes: at least one; more than 64 classes of pending jobs explain nothing."""
BETA_RANGE = (1, 10_000)
"""Pods released per round, in flight included."""


@dataclass(frozen=True)
class QueueConfig:
    """Knobs of the weighted-fair queue (defaults from Horus §5.2 and §6.2): the one
    definition of their defaults and ranges (the ``queue:`` config section holds one)."""

    k: int = 3
    """Number of classes (>= 1). Horus-f uses 3 (three utilisation CDFs in Fig. 1a)."""
    beta: int = 15
    """Jobs released per round (>= 1). Horus testbed: 15."""
    starvation_seconds: float = 3600.0
    """A job waiting at least this long is released before weighted picks (> 0)."""
    refit_every_rounds: int = 1
    """Refit k-means every N rounds (>= 1); in between new items join the nearest class."""
    max_iterations: int = 25
    """Upper bound on k-means iterations per fit (>= 1)."""

    def __post_init__(self) -> None:
        checks = (
            ("k", K_RANGE[0] <= self.k <= K_RANGE[1]),
            ("beta", BETA_RANGE[0] <= self.beta <= BETA_RANGE[1]),
            ("starvation_seconds", math.isfinite(self.starvation_seconds)
             and self.starvation_seconds > 0),
            ("refit_every_rounds", self.refit_every_rounds >= 1),
            ("max_iterations", self.max_iterations >= 1),
        )
        for name, ok in checks:
            if not ok:
                raise QueueError(name, f"out of range: {getattr(self, name)!r}")


@dataclass(frozen=True)
class QueueItem:
    """One pending job (or pod) with the four clustering features."""

    key: str
    enqueued_at_seconds: float
    tasks: int = 1
    util_percent: float = 0.0
    gpus_per_task: int = 1
    mem_mib: float = 0.0

    @property
    def features(self) -> tuple[float, float, float, float]:
        """(tasks, util, GPUs per task, memory): Horus's clustering features."""
        return (float(self.tasks), self.util_percent, float(self.gpus_per_task), self.mem_mib)


@dataclass(frozen=True)
class Clustering:
    """Centroids in scaled feature space plus the per-column scale used."""

    centroids: np.ndarray
    scale: np.ndarray

    def assign(self, features: np.ndarray) -> np.ndarray:
        """Nearest centroid (L1) per row; ties go to the lower class index."""
        scaled = features / self.scale
        dist = np.abs(scaled[:, None, :] - self.centroids[None, :, :]).sum(axis=2)
        return np.argmin(dist, axis=1)


def cluster_l1(features: np.ndarray, k: int, max_iterations: int = 25) -> Clustering:
    """Deterministic k-medians (k-means under L1) of ``features`` (n x d) into <= k classes."""
    if features.ndim != 2 or features.shape[0] == 0:
        raise QueueError("features", "need a non-empty 2-D array")
    scale = np.max(np.abs(features), axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    x = features / scale
    # Farthest-point start from the smallest job: deterministic and spread out.
    first = int(np.lexsort((np.arange(len(x)), x.sum(axis=1)))[0])
    centres = [x[first]]
    nearest = np.abs(x - x[first]).sum(axis=1)
    while len(centres) < k and float(nearest.max()) > 0.0:
        nxt = int(np.argmax(nearest))
        centres.append(x[nxt])
        nearest = np.minimum(nearest, np.abs(x - x[nxt]).sum(axis=1))
    c = np.array(centres)
    labels = np.full(len(x), -1)
    for _ in range(max_iterations):
        new = np.argmin(np.abs(x[:, None, :] - c[None, :, :]).sum(axis=2), axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
        for j in range(len(c)):
            members = x[labels == j]
            if len(members):
                c[j] = np.median(members, axis=0)
    order = np.lexsort(c.T[::-1])  # renumber classes by centroid, lexicographically
    return Clustering(centroids=c[order], scale=scale)


def queue_weights(lengths: np.ndarray, median_waits_seconds: np.ndarray) -> np.ndarray:
    """Horus ``w_x = max(len, median_wait * len)`` per class (0 for empty classes)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return np.maximum(lengths, np.asarray(median_waits_seconds, dtype=np.float64) * lengths)


def apportion(weights: Sequence[float], lengths: Sequence[int], slots: int) -> list[int]:
    """Split ``slots`` by ``w_x / sum(w)`` (largest remainder), never above a class's length.

    Slots a short class cannot use go to the others in a further pass; ties in
    the remainder go to the lower class index.
    """
    w = [max(0.0, float(v)) for v in weights]
    cap = [max(0, int(n)) for n in lengths]
    counts = [0] * len(w)
    left = min(max(0, slots), sum(cap))
    while left > 0:
        open_ = [i for i in range(len(w)) if counts[i] < cap[i]]
        total = sum(w[i] for i in open_)
        if total <= 0:  # only zero-weight classes remain: share equally
            share = {i: 1.0 for i in open_}
            total = float(len(open_))
        else:
            share = {i: w[i] for i in open_}
        exact = {i: left * share[i] / total for i in open_}
        given = 0
        for i in open_:
            add = min(int(math.floor(exact[i])), cap[i] - counts[i])
            counts[i] += add
            given += add
        rest = left - given
        for i in sorted(open_, key=lambda i: (-(exact[i] - math.floor(exact[i])), i)):
            if rest == 0:
                break
            if counts[i] < cap[i]:
                counts[i] += 1
                rest -= 1
        if rest == left:  # nothing could be placed; cannot happen while left <= sum(cap)
            break
        left = rest
    return counts


@dataclass(frozen=True)
class ClassView:
    """One class as the last round saw it: size, median wait and weight."""

    index: int
    length: int
    median_wait_seconds: float
    weight: float


class FairQueue:
    """Pending jobs with Horus's weighted-fair selection (state: items and centroids)."""

    def __init__(self, config: QueueConfig | None = None):
        self.config = config or QueueConfig()
        self._keys: list[str | None] = []
        self._items: list[QueueItem | None] = []
        self._feat = np.zeros((0, 4))
        self._enq = np.zeros(0)
        self._label = np.zeros(0, dtype=np.int64)
        self._alive = np.zeros(0, dtype=bool)
        self._slot: dict[str, int] = {}
        self._clustering: Clustering | None = None
        self._rounds_since_fit = 0
        self.last_classes: tuple[ClassView, ...] = ()

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, key: object) -> bool:
        return key in self._slot

    def items(self) -> list[QueueItem]:
        """Pending items in insertion order."""
        return [self._items[i] for i in sorted(self._slot.values())]  # type: ignore[misc]

    def add(self, item: QueueItem) -> None:
        """Enqueue ``item``; a key already queued is replaced (its features may change)."""
        if not math.isfinite(item.enqueued_at_seconds):
            raise QueueError("enqueued_at_seconds", "must be finite")
        if item.key in self._slot:
            self.remove(item.key)
        slot = len(self._keys)
        self._keys.append(item.key)
        self._items.append(item)
        row = np.array([item.features], dtype=np.float64)
        self._feat = np.vstack([self._feat, row]) if len(self._feat) else row
        self._enq = np.append(self._enq, item.enqueued_at_seconds)
        label = int(self._clustering.assign(row)[0]) if self._clustering is not None else 0
        self._label = np.append(self._label, label)
        self._alive = np.append(self._alive, True)
        self._slot[item.key] = slot

    def extend(self, items: Iterable[QueueItem]) -> None:
        """Enqueue several items."""
        for item in items:
            self.add(item)

    def remove(self, key: str) -> QueueItem | None:
        """Dequeue ``key`` (released or gone); returns the item or None if absent."""
        slot = self._slot.pop(key, None)
        if slot is None:
            return None
        item = self._items[slot]
        self._alive[slot] = False
        self._keys[slot] = None
        self._items[slot] = None
        if len(self._keys) > 64 and len(self._slot) * 2 < len(self._keys):
            self._compact()
        return item

    def _compact(self) -> None:
        keep = np.flatnonzero(self._alive)
        self._keys = [self._keys[i] for i in keep]
        self._items = [self._items[i] for i in keep]
        self._feat, self._enq = self._feat[keep], self._enq[keep]
        self._label, self._alive = self._label[keep], self._alive[keep]
        self._slot = {k: i for i, k in enumerate(self._keys) if k is not None}

    def _refit(self, live: np.ndarray) -> None:
        self._clustering = cluster_l1(self._feat[live], self.config.k, self.config.max_iterations)
        self._label[live] = self._clustering.assign(self._feat[live])
        self._rounds_since_fit = 0

    def select(self, now_seconds: float, slots: int | None = None) -> list[QueueItem]:
        """The jobs to release this round, in release order (does not dequeue them)."""
        live = np.flatnonzero(self._alive)
        if live.size == 0:
            self.last_classes = ()
            return []
        if self._clustering is None or self._rounds_since_fit >= self.config.refit_every_rounds:
            self._refit(live)
        self._rounds_since_fit += 1
        budget = self.config.beta if slots is None else max(0, min(slots, self.config.beta))
        waits = np.maximum(0.0, now_seconds - self._enq[live])
        oldest_first = live[np.lexsort((live, self._enq[live]))]
        starving = oldest_first[(now_seconds - self._enq[oldest_first])
                                >= self.config.starvation_seconds][:budget]
        labels = self._label[live]
        k = int(self._clustering.centroids.shape[0]) if self._clustering is not None else 1
        lengths = np.bincount(labels, minlength=k)
        medians = np.array([float(np.median(waits[labels == j])) if lengths[j] else 0.0
                            for j in range(k)])
        weights = queue_weights(lengths, medians)
        self.last_classes = tuple(ClassView(j, int(lengths[j]), float(medians[j]),
                                            float(weights[j])) for j in range(k))
        taken = set(int(s) for s in starving)
        remaining_len = lengths.copy()
        for s in starving:
            remaining_len[self._label[s]] -= 1
        counts = apportion(weights, remaining_len.tolist(), budget - len(starving))
        picked = list(int(s) for s in starving)
        for j in range(k):
            if counts[j] == 0:
                continue
            members = [int(s) for s in oldest_first[self._label[oldest_first] == j]
                       if int(s) not in taken]
            picked.extend(members[: counts[j]])
        picked.sort(key=lambda s: (self._enq[s], s))
        return [self._items[s] for s in picked]  # type: ignore[misc]

    def class_of(self, key: str) -> int | None:
        """The class a queued key belongs to (None when absent)."""
        slot = self._slot.get(key)
        return None if slot is None else int(self._label[slot])
