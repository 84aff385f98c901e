"""Prometheus metrics of the extender (prefix ``tandem_``, base units).

Per-GPU utilisation is read from the cluster state at scrape time by a custom
collector, so the hot path never touches a per-GPU gauge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class GpuCollector(Collector):
    """Predicted (reserved) and observed utilisation per GPU, as ratios 0..1+."""

    def __init__(self, rows: Callable[[], list[tuple[str, Any, float, float | None]]],
                 synced: Callable[[], bool]):
        self._rows = rows
        self._synced = synced

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Build the families from the current state."""
        labels = ["node", "gpu_index", "gpu_uuid", "gpu_type"]
        predicted = GaugeMetricFamily(
            "tandem_gpu_predicted_utilization_ratio",
            "Sum of reserved predicted utilisation on the GPU (1 = 100%)", labels=labels)
        observed = GaugeMetricFamily(
            "tandem_gpu_observed_utilization_ratio",
            "Utilisation the node agent measured (fresh reports only)", labels=labels)
        for node, gpu, pred, obs in self._rows():
            values = [node, str(gpu.index), gpu.uuid, gpu.gpu_type]
            predicted.add_metric(values, pred / 100.0)
            if obs is not None:
                observed.add_metric(values, obs / 100.0)
        synced = GaugeMetricFamily("tandem_extender_state_synced",
                                   "1 when the cluster state has synced")
        synced.add_metric([], 1.0 if self._synced() else 0.0)
        yield predicted
        yield observed
        yield synced


class LearningCollector(Collector):
    """Each GPU type's learned interference curve: fit quality, points, last refit."""

    def __init__(self, rows: Callable[[], list[dict[str, Any]]]):
        self._rows = rows

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One gauge per property, labelled by GPU type; only types with a learned curve."""
        r2 = GaugeMetricFamily("tandem_learning_curve_r2",
                               "R^2 of the learned interference curve over its inlier points",
                               labels=["gpu_type"])
        points = GaugeMetricFamily("tandem_learning_curve_points",
                                   "Inlier co-located points of the last curve refit",
                                   labels=["gpu_type"])
        refit = GaugeMetricFamily("tandem_learning_curve_last_refit_timestamp_seconds",
                                  "Unix time of the last curve refit", labels=["gpu_type"])
        coeff = GaugeMetricFamily("tandem_learning_curve_coefficient",
                                  "Coefficients of the learned curve (cost.curves form)",
                                  labels=["gpu_type", "coefficient"])
        held = GaugeMetricFamily("tandem_learning_curve_points_held",
                                 "Co-located points held for the next refit",
                                 labels=["gpu_type"])
        for row in self._rows():
            gpu_type = row["gpu_type"]
            held.add_metric([gpu_type], float(row["points_held"]))
            if row["curve"] is None:
                continue
            r2.add_metric([gpu_type], float(row["r2"]))
            points.add_metric([gpu_type], float(row["points"]))
            refit.add_metric([gpu_type], float(row["refitted_at"]))
            for name, value in row["curve"].items():
                coeff.add_metric([gpu_type, name], float(value))
        yield from (r2, points, refit, coeff, held)


class LearnerCollector(Collector):
    """The utilisation learner: samples taken and refused, estimates, persistence."""

    def __init__(self, stats: Callable[[], dict[str, Any]]):
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Families from :meth:`extender.learning.learner.Learner.stats`, read at scrape time."""
        s = self._stats()
        accepted = CounterMetricFamily("tandem_learning_observations_accepted",
                                       "Utilisation samples the learner took from agent reports")
        accepted.add_metric([], float(s["accepted"]))
        rejected = CounterMetricFamily(
            "tandem_learning_observations_rejected",
            "Reported pod processes that gave no sample, by reason", labels=["reason"])
        for reason, n in sorted(s["rejected"].items()):
            rejected.add_metric([reason], float(n))
        estimates = GaugeMetricFamily(
            "tandem_learning_estimates",
            "Utilisation estimates by state: trusted (used in resolution), learning "
            "(fewer than learning.min_observations samples), colocated", labels=["state"])
        for state, n in sorted(s["estimates"].items()):
            estimates.add_metric([state], float(n))
        change = GaugeMetricFamily(
            "tandem_learning_last_update_mean_abs_change_percent",
            "Mean absolute change of the estimates the last agent report moved (points)")
        change.add_metric([], float(s["last_change_percent"]))
        writes = CounterMetricFamily("tandem_learning_persist_writes",
                                     "Successful writes of the learning ConfigMap")
        writes.add_metric([], float(s["persist_writes"]))
        failures = CounterMetricFamily("tandem_learning_persist_failures",
                                       "Failed writes of the learning ConfigMap")
        failures.add_metric([], float(s["persist_failures"]))
        conflicts = CounterMetricFamily(
            "tandem_learning_persist_conflicts",
            "Writes of the learning ConfigMap refused because another replica wrote first "
            "(merged and retried)")
        conflicts.add_metric([], float(s.get("persist_conflicts", 0)))
        evicted = CounterMetricFamily(
            "tandem_learning_evicted",
            "Estimates evicted (least recently used first) to keep the learning document "
            "within its size")
        evicted.add_metric([], float(s.get("evicted", 0)))
        yield from (accepted, rejected, estimates, change, writes, failures, conflicts, evicted)
        if "pairs" in s:  # pairwise interference (extender.learning.interference)
            pairs = GaugeMetricFamily(
                "tandem_learning_interference_pairs",
                "Pairwise interference kept: directed pairs seen, pairs that cannot share, "
                "pairs the measured matrix (learning.pair_prior) lists, group samples kept "
                "(a model beside a set of others), pairs solved from them, pairs refused "
                "because their measured progress lost to taking turns",
                labels=["kind"])
            pairs.add_metric(["seen"], float(s["pairs"]["pairs"]))
            pairs.add_metric(["cannot_share"], float(s["pairs"]["cannot_share"]))
            pairs.add_metric(["prior"], float(s["pairs"].get("prior_pairs", 0)))
            pairs.add_metric(["groups"], float(s["pairs"].get("groups", 0)))
            pairs.add_metric(["inferred"], float(s["pairs"].get("inferred_pairs", 0)))
            pairs.add_metric(["refused_losing"], float(s["pairs"].get("losing", 0)))
            progress = CounterMetricFamily("tandem_learning_interference_progress_samples",
                                           "Progress samples (step time beside one other pod "
                                           "over its step time alone) taken")
            progress.add_metric([], float(s["pairs"].get("progress_samples", 0)))
            yield progress
            samples = CounterMetricFamily("tandem_learning_interference_samples",
                                          "Pair and group slowdown samples taken from shared "
                                          "GPUs")
            samples.add_metric([], float(s["pairs"]["samples"]))
            yield from (pairs, samples)
        if s["persist_age_seconds"] is not None:  # absent until something was persisted
            age = GaugeMetricFamily("tandem_learning_persist_age_seconds",
                                    "Seconds since the learning ConfigMap was last written "
                                    "(or reloaded)")
            age.add_metric([], float(s["persist_age_seconds"]))
            yield age


class Metrics:
    """Request counters, latency histograms and decision counters on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter("tandem_extender_requests", "Requests by verb and HTTP code",
                                ["verb", "code"], registry=self.registry)
        self.latency = Histogram("tandem_extender_request_duration_seconds",
                                 "Request latency by verb", ["verb"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.decisions = Counter("tandem_extender_decisions",
                                 "Node decisions by verb, outcome and reason",
                                 ["verb", "outcome", "reason"], registry=self.registry)
        self.reload_failures = Counter("tandem_extender_config_reload_failures",
                                       "Config reloads rejected by validation",
                                       registry=self.registry)
        self.untrusted_placements = Counter(
            "tandem_extender_untrusted_placements",
            "Bound pods whose recorded placement did not verify or differed from the one held",
            ["problem"], registry=self.registry)

    def watch_state(self, rows: Callable[[], list[tuple[str, Any, float, float | None]]],
                    synced: Callable[[], bool]) -> None:
        """Register the per-GPU collector over a state."""
        self.registry.register(GpuCollector(rows, synced))

    def watch_learning(self, rows: Callable[[], list[dict[str, Any]]],
                       stats: Callable[[], dict[str, Any]] | None = None) -> None:
        """Register the learned-curve collector (rows as ``/v1/state`` shows them) and,
        given ``stats`` (:meth:`extender.learning.learner.Learner.stats`), the learner's."""
        self.registry.register(LearningCollector(rows))
        if stats is not None:
            self.registry.register(LearnerCollector(stats))
