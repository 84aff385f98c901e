"""The scheduler-pattern ratios of benchmarks/extender_latency.py (#28): tandem's burst
waiting is reported beside the floor's and the trivial extender's, and normalised by the
floor's (what queueing on the machine's cores costs whatever the server does); and
record_burst.py, concurrent binds sharing nodes."""

from __future__ import annotations

import importlib
import time
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
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    fake_kube_api = importlib.import_module("lab.fakes.kube_api")
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


def test_the_two_bind_orders_compared_write_in_their_order(monkeypatch):
    """scheduler_pattern.py's before and after: record then Binding on the scheduler's path,
    against the Binding alone with the record written after it."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    from kubernetes import client

    from extender.core import Placement, PodRef, Workload

    fake_kube_api = importlib.import_module("lab.fakes.kube_api")
    pods = [{"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}"},
             "spec": {"containers": []}, "status": {"phase": "Pending"}} for i in range(2)]
    api = fake_kube_api.FakeKubeApi([{"metadata": {"name": "n"}}], pods)
    api.start()
    try:
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
        order = {}
        for i, (name, cls) in enumerate(pattern.ORDERS.items()):
            source = cls(core, background_events=False)
            source.records.load_all()
            api.requests.clear()
            source.bind(PodRef("ml", f"p{i}", f"u{i}"), "n", {},
                        Placement(f"u{i}", f"ml/p{i}", "n", (0,), 10.0, 100.0,
                                  Workload.TRAINING))
            source.stop()  # writes what is queued
            order[name] = [r.path.rsplit("/", 1)[-1] for r in api.requests]
    finally:
        api.stop()
    assert order == {"record-first": ["configmaps", "binding"],
                     "binding-first": ["binding", "tandem-placements-n"]}


def test_paired_ratios_carry_an_interval():
    def run(before: float, after: float) -> dict:
        def one(ms: float) -> dict:
            return {"single": {"bind_ms": {"p50": ms, "p90": ms}},
                    "burst": {"bind_ms": {"p50": ms, "p90": ms}},
                    "pipeline": {"pods_per_second": 1000 / ms}}
        return {"record-first": one(before), "binding-first": one(after)}
    out = pattern.paired([run(10, 5), run(20, 10), run(8, 4)])
    assert out["burst_bind_p50"] == {"ratios": [0.5, 0.5, 0.5], "mean": 0.5,
                                     "interval_95": [0.5, 0.5]}
    assert out["pipeline_pods_per_second"]["mean"] == 2.0


def test_snapshot_contention_pairs_each_repeat_of_the_two_checkouts():
    contention = load("snapshot_contention")

    def phases(bind_p50: float) -> dict:
        verbs = {"bind": {"p50_ms": bind_p50, "p99_ms": 2 * bind_p50}}
        return {"idle": verbs, "busy": verbs}
    out = contention.paired_ratios({"branch": [phases(2.0), phases(3.0)],
                                    "against": [phases(4.0), phases(3.0)]})
    assert out["busy_bind_p50"]["ratios"] == [0.5, 1.0]
    assert out["busy_bind_p50"]["mean"] == 0.75
    low, high = out["busy_bind_p50"]["interval_95"]
    assert low < 0.75 < high


def test_median_interval_takes_the_binomial_order_statistics():
    out = pattern.median_interval([float(v) for v in range(10, 0, -1)])
    assert out["median"] == 5.5
    assert out["interval_95"] == [2.0, 9.0]  # 2nd and 9th of 10: 97.9% coverage
    assert pattern.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])["interval_95"] is None  # 93.8%
    assert pattern.median_interval([float(v) for v in range(6)])["interval_95"] == [0.0, 5.0]


def test_latency_pass_ratios_and_the_write_wait_in_the_burst():
    def repeat(scale: float) -> dict:
        return {"tandem": run(10.0, 30.0 * scale, 60), "trivial": run(8.0, 16.0, 100),
                "floor": run(5.0, 8.0, 300)}
    checks = pattern.latency_checks([repeat(s) for s in (1.0, 1.0, 0.5, 1.0, 1.0, 1.0)])
    assert checks["tandem_burst_bind_p50_vs_single"]["median"] == 3.0
    assert checks["tandem_burst_bind_p50_vs_single"]["interval_95"] == [1.5, 3.0]
    assert checks["trivial_burst_bind_p50_vs_single"]["median"] == 2.0
    assert checks["tandem_pipeline_pods_per_second_vs_trivial"]["median"] == 0.6
    assert checks["tandem_burst_bind_ok"] is False and checks["tandem_pipeline_ok"] is True

    def bind_ms(burst: dict) -> dict:
        return {n: {"burst": {"p50": v}} for n, v in burst.items()}
    passes = [{"api_write_latency_ms": 0.0,
               "bind_ms_median_of_repeats": bind_ms({"tandem": 40, "trivial": 30, "floor": 9})},
              {"api_write_latency_ms": 5.0,
               "bind_ms_median_of_repeats": bind_ms({"tandem": 45, "trivial": 70, "floor": 14})}]
    assert pattern.write_wait_in_burst(passes) == {
        "5ms": {"tandem": 1.0, "trivial": 8.0, "floor": 1.0}}


def test_floor_bind_waits_its_write_and_filter_does_not():
    port, stop = pattern.serve_floor(4, bind_seconds=0.5)
    try:
        client = pattern.RawClient(port)
        t0 = time.perf_counter()
        pattern._call(client, "/filter", {"Pod": {}, "NodeNames": ["a"]})
        filtered = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert pattern._bind(client, {"metadata": {"name": "p", "namespace": "n", "uid": "u"}},
                             "a")[1]
        bound = time.perf_counter() - t0
        client.close()
    finally:
        stop()
    assert bound >= 0.5 and filtered < 0.5


def test_burst_windows_sum_each_process_cpu_and_its_cores_busy():
    """benchmarks/process_cpu.py: per window ms of wall and CPU by process, cores busy as
    CPU over wall (the extender's one interpreter shows as about 1 core)."""
    cpu = load("process_cpu")
    windows = cpu.Windows(cpu.CpuMeter({}))
    windows.add(0.040, {"scheduler": 1.0, "extender": 5.0}, {"scheduler": 1.004, "extender": 5.038})
    windows.add(0.060, {"scheduler": 2.0, "extender": 6.0}, {"scheduler": 2.006, "extender": 6.058})
    out = windows.summary()
    assert out["windows"] == 2 and out["wall_ms"] == 50.0
    assert out["cpu_ms"] == {"scheduler": 5.0, "extender": 48.0}
    assert out["cores_busy"] == {"scheduler": 0.1, "extender": 0.96, "all": 1.06}
    assert cpu.Windows(cpu.CpuMeter({})).summary() == {}


def test_the_meter_reads_this_process_and_a_named_one():
    import os

    cpu = load("process_cpu")
    meter = cpu.CpuMeter({"extender": os.getpid()})
    before = meter.read()
    deadline = time.thread_time() + 0.05
    while time.thread_time() < deadline:  # CPU, counted by both readings of this process
        pass
    after = meter.read()
    assert after["scheduler"] - before["scheduler"] >= 0.04
    assert after["extender"] >= before["extender"]  # clock ticks: coarser, never backwards


def test_cpu_by_process_takes_medians_over_the_repeats():
    def server(extender_ms: float) -> dict:
        window = {"wall_ms": 40.0, "cpu_ms": {"scheduler": 4.0, "extender": extender_ms},
                  "cores_busy": {"scheduler": 0.1, "extender": extender_ms / 40.0,
                                 "all": 0.1 + extender_ms / 40.0}}
        per_pod = {"cpu_ms_per_pod": {"scheduler": 1.0, "extender": extender_ms / 10}}
        return {"single": per_pod, "pipeline": per_pod, "burst": {"in_bursts": window}}
    runs = [{name: server(ms) for name in pattern.SERVERS} for ms in (36.0, 40.0, 20.0)]
    out = pattern.cpu_by_process(runs)
    assert out["tandem"]["burst_cpu_ms"] == {"scheduler": 4.0, "extender": 36.0}
    assert out["tandem"]["burst_cores_busy"]["extender"] == 0.9
    assert out["trivial"]["pipeline_cpu_ms_per_pod"]["extender"] == 3.6


class _Counting:
    """A client that answers every verb at once and counts the paths it was sent."""

    def __init__(self, seen: list[str]):
        self.seen = seen

    def post(self, path: str, data: bytes) -> tuple[int, bytes]:
        self.seen.append(path)
        if path == "/filter":
            return 200, b'{"NodeNames": ["n1"], "FailedNodes": {}, "Error": ""}'
        if path == "/prioritize":
            return 200, b'[{"Host": "n1", "Score": 0}]'
        return 200, b'{"Error": ""}'

    def close(self) -> None:
        pass


def test_burst_filters_set_how_many_filters_run_beside_each_burst():
    jobs = [({"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"}}, ["n1"])
            for i in range(8)]
    for filters, expected in ((None, 2), (0, 0), (3, 3)):
        seen: list[str] = []
        out = pattern.burst(lambda seen=seen: _Counting(seen), jobs, 4, filters=filters)
        assert out["binds_ok"] == 8
        # two bursts of 4: each scheduled (filter + prioritize) and bound; the filters sent
        # beside the first burst are of the second's pods, none beside the last
        assert seen.count("/bind") == 8 and seen.count("/prioritize") == 8
        assert seen.count("/filter") == 8 + expected
