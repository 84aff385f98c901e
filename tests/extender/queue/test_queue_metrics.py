"""The queue gate's Prometheus metrics: one observe() per round report."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from extender.queue.gate import RoundReport
from extender.queue.metrics import QueueMetrics


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_round_sets_gauges_and_adds_to_counters() -> None:
    metrics = QueueMetrics(clock=lambda: 1234.5)
    r = metrics.registry
    report = RoundReport(gated=7, in_flight=1, released=("ml/a", "ml/b"), conflicts=("ml/c",),
                         classes=((0, 5, 30.0, 150.0), (1, 2, 4000.0, 8000.0)),
                         oldest_wait_seconds=4100.0)
    metrics.observe(report)
    metrics.observe(report)
    assert value(r, "tandem_queue_rounds_total", outcome="ok") == 2
    assert value(r, "tandem_queue_rounds_total", outcome="failed") == 0
    assert value(r, "tandem_queue_released_pods_total") == 4
    assert value(r, "tandem_queue_release_conflicts_total") == 2
    assert value(r, "tandem_queue_gated_pods") == 7
    assert value(r, "tandem_queue_in_flight_pods") == 1
    assert value(r, "tandem_queue_oldest_wait_seconds") == 4100.0
    assert value(r, "tandem_queue_last_round_timestamp_seconds") == 1234.5
    assert value(r, "tandem_queue_class_pods", queue_class="1") == 2
    assert value(r, "tandem_queue_class_median_wait_seconds", queue_class="1") == 4000.0
    assert value(r, "tandem_queue_class_weight", queue_class="0") == 150.0


def test_a_failed_round_is_counted_and_leaves_the_last_picture() -> None:
    now = [100.0]
    metrics = QueueMetrics(clock=lambda: now[0])
    r = metrics.registry
    metrics.observe(RoundReport(gated=3, classes=((0, 3, 10.0, 30.0),)))
    now[0] = 200.0
    metrics.observe(RoundReport(error="list pods: apiserver unreachable"))
    assert value(r, "tandem_queue_rounds_total", outcome="failed") == 1
    assert value(r, "tandem_queue_gated_pods") == 3
    # Staleness is the alert: the last successful round stays at 100.
    assert value(r, "tandem_queue_last_round_timestamp_seconds") == 100.0


def test_classes_of_an_earlier_round_disappear() -> None:
    metrics = QueueMetrics()
    r = metrics.registry
    metrics.observe(RoundReport(gated=4, classes=((0, 2, 1.0, 2.0), (1, 2, 1.0, 2.0))))
    metrics.observe(RoundReport(gated=1, classes=((0, 1, 1.0, 1.0),)))
    assert value(r, "tandem_queue_class_pods", queue_class="0") == 1
    assert value(r, "tandem_queue_class_pods", queue_class="1") is None
    metrics.observe(RoundReport())
    assert value(r, "tandem_queue_class_pods", queue_class="0") is None
    assert value(r, "tandem_queue_gated_pods") == 0
