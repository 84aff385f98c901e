"""The scheduler-pattern ratios of benchmarks/extender_latency.py (#28): tandem's burst
waiting is reported beside the floor's and the trivial extender's, and normalised by the
floor's (what queueing on the machine's cores costs whatever the server does)."""

from __future__ import annotations

from bench_modules import load

pattern = load("scheduler_pattern")


def run(single_ms: float, burst_ms: float, pods_per_second: float) -> dict:
    return {"single": {"bind_ms": {"p50": single_ms}, "pods_per_second": pods_per_second},
            "burst": {"bind_ms": {"p50": burst_ms}},
            "pipeline": {"pods_per_second": pods_per_second}}


def test_burst_ratios_are_normalised_by_the_floor_of_the_same_run():
    out = pattern.checks({"kube": run(2.0, 26.0, 150), "trivial": run(1.0, 15.0, 250),
                          "floor": run(0.2, 2.6, 500)}, pattern.PATTERN_GOALS)
    assert out["kube_burst_bind_p50_vs_single"] == 13.0
    assert out["floor_burst_bind_p50_vs_single"] == 13.0
    assert out["kube_burst_bind_p50_vs_single_over_floors"] == 1.0
    assert out["trivial_burst_bind_p50_vs_single_over_floors"] == 1.15
    assert out["kube_burst_bind_p50_vs_floor_burst"] == 10.0
    assert out["trivial_burst_bind_p50_vs_floor_burst"] == 5.77
    assert out["kube_burst_bind_ok"] is False and out["kube_burst_bind_ok_over_floors"] is True
    assert out["kube_pipeline_pods_per_second_vs_trivial"] == 0.6


def test_without_the_floor_no_normalised_ratio_is_claimed():
    out = pattern.checks({"kube": run(2.0, 26.0, 150)}, pattern.PATTERN_GOALS)
    assert not [k for k in out if "floor" in k]
    assert out["kube_burst_bind_ok"] is False
