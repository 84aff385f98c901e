"""Prometheus view of the runtime, computed at scrape time (base units, ``tandem_`` prefix)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.inference.runtime.runtime import ServingRuntime


class RuntimeCollector(Collector):
    """Per-session goodput, SLO attainment, drops, batches, GPU time, quanta."""

    def __init__(self, runtime: ServingRuntime):
        self._runtime = runtime

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Build every family from one snapshot."""
        snap = self._runtime.snapshot()
        labels = ["session", "kind"]
        requests = CounterMetricFamily(
            "tandem_server_requests", "Finished requests by outcome.", labels=[*labels, "outcome"]
        )
        drops = CounterMetricFamily(
            "tandem_server_drops", "Dropped requests by reason.", labels=[*labels, "reason"]
        )
        batches = CounterMetricFamily(
            "tandem_server_batches", "Executed batches by size.", labels=[*labels, "batch_size"]
        )
        gpu = CounterMetricFamily("tandem_server_gpu_seconds", "GPU time used.", labels=labels)
        share = GaugeMetricFamily(
            "tandem_server_gpu_time_share_ratio",
            "Share of the GPU time used by all sessions.",
            labels=labels,
        )
        goodput = GaugeMetricFamily(
            "tandem_server_goodput_rps",
            "Requests served within SLO per second since registration.",
            labels=labels,
        )
        attainment = GaugeMetricFamily(
            "tandem_server_slo_attainment_ratio",
            "Served within SLO over finished requests.",
            labels=labels,
        )
        quantum = GaugeMetricFamily(
            "tandem_server_quantum_seconds",
            "Measured GPU time per quantum (mean, std).",
            labels=[*labels, "stat"],
        )
        queue = GaugeMetricFamily("tandem_server_queue_length", "Queued requests.", labels=labels)
        for s in snap["sessions"]:
            key = [s["name"], s["kind"]]
            requests.add_metric([*key, "good"], s["good"])
            requests.add_metric([*key, "late"], s["late"])
            requests.add_metric([*key, "dropped"], s["dropped"])
            for reason, count in s["drop_reasons"].items():
                drops.add_metric([*key, reason], count)
            for size, count in s["batch_sizes"].items():
                batches.add_metric([*key, size], count)
            gpu.add_metric(key, s["gpu_time_ms"] / 1000.0)
            share.add_metric(key, s["gpu_share"])
            goodput.add_metric(key, s["goodput_rps"])
            attainment.add_metric(key, s["slo_attainment"])
            queue.add_metric(key, s["queue"])
            if s["quantum_mean_ms"] is not None:
                quantum.add_metric([*key, "mean"], s["quantum_mean_ms"] / 1000.0)
                quantum.add_metric([*key, "std"], s["quantum_std_ms"] / 1000.0)
        yield from (requests, drops, batches, gpu, share, goodput, attainment, quantum, queue)
        yield from _held(snap["sessions"])
        # Unlabelled families take their one value in the constructor.
        yield GaugeMetricFamily(
            "tandem_server_quantum_target_seconds", "Chosen quantum Q.", snap["quantum_ms"] / 1000.0
        )
        if snap["duty_cycle_ms"] is not None:
            yield GaugeMetricFamily(
                "tandem_server_duty_cycle_seconds",
                "Planned duty cycle.",
                snap["duty_cycle_ms"] / 1000.0,
            )
            yield GaugeMetricFamily(
                "tandem_server_occupancy_ratio",
                "Planned GPU occupancy of the duty cycle.",
                snap["occupancy"],
            )
        yield CounterMetricFamily(
            "tandem_server_busy_seconds", "Executor busy time.", snap["busy_ms"] / 1000.0
        )
        yield CounterMetricFamily(
            "tandem_server_scheduler_seconds",
            "CPU time spent in scheduling decisions.",
            snap["scheduler_seconds"],
        )


def _held(sessions: list[dict]) -> Iterator[GaugeMetricFamily]:
    """Each SLO session's held rate, and whether it is scaled down (``holding.py``)."""
    held = GaugeMetricFamily(
        "tandem_server_held_rate_rps",
        "The rate an SLO session is held at now (below admitted: scaled down while serving).",
        labels=["session", "kind", "rate"],
    )
    scaled = GaugeMetricFamily(
        "tandem_server_scaled_down",
        "1 while an SLO session is scaled down because the host got busier.",
        labels=["session", "kind"],
    )
    for s in sessions:
        if s.get("held"):
            key = [s["name"], s["kind"]]
            held.add_metric([*key, "held"], s["held"]["rate_rps"])
            held.add_metric([*key, "admitted"], s["held"]["admitted_rps"])
            scaled.add_metric(key, 1.0 if s["held"]["scaled_down"] else 0.0)
    yield from (held, scaled)
