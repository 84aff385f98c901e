"""Prometheus metrics of the queue gate (prefix ``tandem_queue_``).

What an operator tuning the queue (``beta``, ``k``, ``starvation_seconds``) needs
to see: how many pods the gate holds, how many it let through, how the k-means
classes and their weights ``w_x = max(len, median_wait * len)`` stand, and how
long the oldest pod has waited. Gauges describe the last successful round; a
failed round (API unreachable) only counts as a failure and leaves them as they
were, so ``time() - tandem_queue_last_round_timestamp_seconds`` is the alert.

The gate in the extender process registers these on the extender's registry
(served at its ``/metrics``); ``tandem extender queue-gate`` serves its own with
``--metrics-port``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.queue.gate import RoundReport


class QueueMetrics:
    """Counters and gauges fed by :meth:`observe`, one call per gate round."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] | None = None):  # fmt: skip
        import time

        self.registry = registry if registry is not None else CollectorRegistry()
        self.clock = clock or time.time
        r = self.registry
        self.rounds = Counter("tandem_queue_rounds", "Gate rounds, by outcome (ok | failed).",
                              ["outcome"], registry=r)  # fmt: skip
        self.released = Counter("tandem_queue_released_pods",
                                "Pods whose scheduling gate the queue removed.", registry=r)
        self.conflicts = Counter(
            "tandem_queue_release_conflicts",
            "Release patches refused because the pod changed or went; retried next round.",
            registry=r)  # fmt: skip
        self.gated = Gauge("tandem_queue_gated_pods",
                           "GPU pods held by the gate at the last round.", registry=r)
        self.in_flight = Gauge(
            "tandem_queue_in_flight_pods",
            "Released pods not yet bound at the last round (they count against beta).",
            registry=r)  # fmt: skip
        self.oldest_wait = Gauge("tandem_queue_oldest_wait_seconds",
                                 "Waiting time of the oldest gated pod at the last round.",
                                 registry=r)  # fmt: skip
        self.last_round = Gauge("tandem_queue_last_round_timestamp_seconds",
                                "Unix time of the last successful round.", registry=r)
        self.class_pods = Gauge("tandem_queue_class_pods",
                                "Gated pods per k-means class at the last round.",
                                ["queue_class"], registry=r)  # fmt: skip
        self.class_wait = Gauge("tandem_queue_class_median_wait_seconds",
                                "Median waiting time per class at the last round.",
                                ["queue_class"], registry=r)  # fmt: skip
        self.class_weight = Gauge("tandem_queue_class_weight",
                                  "Class weight w_x = max(len, median_wait * len).",
                                  ["queue_class"], registry=r)  # fmt: skip
        for outcome in ("ok", "failed"):
            self.rounds.labels(outcome)  # export both series from the start

    def observe(self, report: RoundReport) -> None:
        """Record one round's report."""
        if report.error:
            self.rounds.labels("failed").inc()
            return
        self.rounds.labels("ok").inc()
        self.released.inc(len(report.released))
        self.conflicts.inc(len(report.conflicts))
        self.gated.set(report.gated)
        self.in_flight.set(report.in_flight)
        self.oldest_wait.set(report.oldest_wait_seconds)
        self.last_round.set(self.clock())
        # Classes are refitted: a class index of the last round may be gone now.
        for gauge in (self.class_pods, self.class_wait, self.class_weight):
            gauge.clear()
        for index, length, median_wait, weight in report.classes:
            self.class_pods.labels(str(index)).set(length)
            self.class_wait.labels(str(index)).set(median_wait)
            self.class_weight.labels(str(index)).set(weight)
