"""A running utilisation estimate weighted by observed time, and when it is trusted."""

from __future__ import annotations

import math
from dataclasses import dataclass

INDEPENDENT_SECONDS = 60.0
"""Seconds of 1 Hz samples counted as one independent sample in the safety margin."""
MAX_NAMESPACES = 8
MAX_NAMESPACE_CHARS = 63


@dataclass
class Estimate:
    """A running estimate of one key's utilisation, weighted by observed time.

    Each sample weighs the seconds since the pod's previous report on that GPU, so
    the estimate is the time-weighted mean utilisation whatever the reporting
    cadence: the plain time-weighted mean of the first ``horizon`` seconds, then an
    exponentially weighted one with that time constant (it follows a model whose
    behaviour drifts, and a short phase moves it by its share of the time only).
    """

    mean: float = 0.0
    var: float = 0.0
    count: int = 0
    updated_at: float = 0.0
    reference: str = ""
    """The last ``tandem.io/model`` reference seen for this key (for people and export)."""
    used_at: float = 0.0
    """Wall-clock seconds of the last sample or lookup (eviction drops the oldest first)."""
    synced: int = 0
    """Samples of ``count`` the persisted document already holds (merges add only the rest)."""
    seconds: float = 0.0
    """Observed time the samples cover (after each pod's warm-up)."""
    synced_seconds: float = 0.0
    pods: int = 0
    """Pods (per GPU) that contributed a sample."""
    namespaces: tuple[str, ...] = ()
    """Namespaces of those pods (sorted, at most :data:`MAX_NAMESPACES`): an estimate taught
    by one namespace only sets predictions in that namespace (:meth:`serves`)."""

    def add_namespace(self, namespace: str) -> None:
        """Record that a pod of ``namespace`` contributed."""
        if namespace and namespace not in self.namespaces \
                and len(self.namespaces) < MAX_NAMESPACES:
            self.namespaces = tuple(sorted((*self.namespaces, namespace)))

    def serves(self, namespace: str | None) -> bool:
        """Whether a pod of ``namespace`` may be predicted from this estimate: it learned from
        that namespace, or was confirmed by at least two (None: no tenant check, simulator;
        no namespace recorded: an entry persisted before namespaces were)."""
        return namespace is None or len(self.namespaces) != 1 or namespace in self.namespaces

    def add(self, value: float, seconds: float, horizon: float, now: float) -> float:
        """Fold in one sample covering ``seconds``; returns how far the mean moved (points)."""
        if seconds <= 0:
            return 0.0
        weight = seconds / (min(self.seconds, horizon) + seconds)
        delta = value - self.mean
        self.mean += weight * delta
        self.var = (1 - weight) * (self.var + weight * delta * delta)
        self.count += 1
        self.seconds += seconds
        self.updated_at = self.used_at = now
        return abs(weight * delta)

    def merge(self, other: Estimate) -> None:
        """Pool ``other`` (the same model learned under another key) into this one."""
        n = self.seconds + other.seconds
        if n <= 0:
            return
        mean = (self.mean * self.seconds + other.mean * other.seconds) / n
        self.var = (self.seconds * (self.var + (self.mean - mean) ** 2)
                    + other.seconds * (other.var + (other.mean - mean) ** 2)) / n
        self.mean, self.seconds = mean, n
        self.count += other.count
        self.pods += other.pods
        for ns in other.namespaces:
            self.add_namespace(ns)
        self.updated_at = max(self.updated_at, other.updated_at)
        self.used_at = max(self.used_at, other.used_at)
        self.reference = self.reference or other.reference

    def merged_with_persisted(self, persisted: Estimate) -> Estimate:
        """``persisted`` (what another replica wrote) plus this replica's unsynced samples."""
        out = Estimate(persisted.mean, persisted.var, persisted.count, persisted.updated_at,
                       persisted.reference, max(self.used_at, persisted.used_at),
                       seconds=persisted.seconds, pods=persisted.pods,
                       namespaces=persisted.namespaces)
        for ns in self.namespaces:
            out.add_namespace(ns)
        fresh = self.seconds - self.synced_seconds
        if fresh > 0:
            out.merge(Estimate(self.mean, self.var, max(0, self.count - self.synced),
                               self.updated_at, self.reference, seconds=fresh))
        out.synced, out.synced_seconds = out.count, out.seconds
        return out

    @property
    def stddev(self) -> float:
        """Spread of the samples around the estimate (percentage points)."""
        return math.sqrt(max(self.var, 0.0))

    def upper(self, margin: float) -> float:
        """The mean plus ``margin`` standard errors, counting one independent sample per
        :data:`INDEPENDENT_SECONDS` (1 Hz samples of one job are strongly correlated)."""
        n = max(1.0, self.seconds / INDEPENDENT_SECONDS)
        return min(100.0, self.mean + margin * self.stddev / math.sqrt(n))


@dataclass(frozen=True)
class Trust:
    """When an estimate may replace a prediction, and how it is used."""

    min_samples: int = 5
    min_seconds: float = 120.0
    min_pods: int = 1
    warmup_seconds: float = 60.0
    horizon_seconds: float = 600.0
    spread_margin: float = 1.0

    def trusted(self, est: Estimate) -> bool:
        """Enough samples, observed time and pods."""
        return est.count >= self.min_samples and est.seconds >= self.min_seconds \
            and est.pods >= self.min_pods
