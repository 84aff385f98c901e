"""The scheduler-pattern ratios of benchmarks/extender_latency.py (#28): tandem's burst
waiting is reported beside the floor's and the trivial extender's, and normalised by the
floor's (what queueing on the machine's cores costs whatever the server does); and
record_burst.py, concurrent binds sharing nodes."""

from __future__ import annotations

from pathlib import Path

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


def test_record_burst_binds_every_pod_and_counts_record_writes(monkeypatch):
    """benchmarks/record_burst.py on the loopback API server: every bind lands, with its
    entry in its node's record, and a fully spread burst takes one write per bind."""
    load("_common")  # the benchmark's own first import, found beside it when run as a script
    # ... and the repository root, which _common puts first when it runs as a script
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    fake_kube_api = load("fake_kube_api")
    record_burst = load("record_burst")
    api = fake_kube_api.FakeKubeApi([{"metadata": {"name": f"node-{i}"}} for i in range(4)],
                                    record_burst.pods([1, 4], 2, 4), record=False)
    port = api.start()
    try:
        out = record_burst.measure(port, [1, 4], 2, 4)
    finally:
        api.stop()
    assert [out[s]["binds"] for s in (1, 4)] == [8, 8]
    assert out[4]["record_writes_per_bind"] == 1.0
    assert 0 < out[1]["record_writes_per_bind"] <= 1.0
    assert all(api.pod("bench", f"p{s}-{b}-{i}")["spec"]["nodeName"] == f"node-{i % s}"
               for s in (1, 4) for b in range(2) for i in range(4))
    record = api.configmaps[("tandem-system", "tandem-placements-node-0")]["data"]
    assert {f"u1-{b}-{i}" for b in range(2) for i in range(4)} <= set(record)
