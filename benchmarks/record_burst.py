"""Concurrent binds on few nodes: what the placement record costs them.

kube-scheduler binds a burst of pods at once (a goroutine each), and on a small
cluster several of them land on one node. Every bind's decision goes into its
node's placement record (a ConfigMap), written after the Binding in the background,
the entries of one node gathered into one write (``extender/cluster/record_writer.py``).
This program measures the bind path's API part (``KubeSource.bind``: the Binding; the
records are written after each burst, counted per spread) against the loopback API
server in a process of its own, in bursts of ``--concurrency`` binds spread over
1, 4 and ``--concurrency`` nodes, and reports per spread the bind p50/p90 and the
record writes per bind. The goal: binds that share nodes wait no longer than binds
that do not (p50 at most the fully spread burst's; the p90s are reported beside).
With a lock per node held across each write (one write per bind), binds on one node
queued behind each other's writes.

    .venv/bin/python benchmarks/record_burst.py [--bursts N] [--concurrency N]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import _common
from kubernetes import client

from benchmarks.extender_latency import serve_in_child
from extender.cluster.kube import KubeSource
from extender.core import Placement, PodRef, Workload
from lab.fakes import kube_api as fake_kube_api

GOAL = 1.0
"""Burst bind p50 on shared nodes at most this times the fully spread burst's."""


def pods(spreads: list[int], bursts: int, concurrency: int) -> list[dict]:
    """The pending pods every measured burst binds (one name per spread, burst, slot)."""
    return [{"metadata": {"name": f"p{s}-{b}-{i}", "namespace": "bench",
                          "uid": f"u{s}-{b}-{i}"},
             "spec": {"containers": []}, "status": {"phase": "Pending"}}
            for s in spreads for b in range(bursts) for i in range(concurrency)]


def bind_burst(source: KubeSource, spread: int, b: int, concurrency: int) -> list[float]:
    """``concurrency`` binds released at once, pod i to node ``i % spread``: latencies (s)."""
    gate = threading.Barrier(concurrency)
    took = [0.0] * concurrency

    def bind(i: int) -> None:
        name, uid, node = f"p{spread}-{b}-{i}", f"u{spread}-{b}-{i}", f"node-{i % spread}"
        placement = Placement(uid, f"bench/{name}", node, (i % 8,), 10.0, 1000.0,
                              Workload.TRAINING)
        gate.wait()
        t0 = time.perf_counter()
        source.bind(PodRef("bench", name, uid), node, {}, placement)
        took[i] = time.perf_counter() - t0
    threads = [threading.Thread(target=bind, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return took


def ms(values: list[float], q: float) -> float:
    """Percentile q of seconds, in milliseconds (nearest rank)."""
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3)


def measure(port: int, spreads: list[int], bursts: int, concurrency: int,
            source_class: type[KubeSource] = KubeSource) -> dict[int, dict]:
    """Bursts interleaved over the spreads (load from elsewhere hits each alike), through
    ``source_class`` (scheduler_pattern.py compares bind orders with it)."""
    api = client.CoreV1Api(client.ApiClient(client.Configuration(
        host=f"http://127.0.0.1:{port}")))
    source = source_class(api, background_events=False, records_namespace="tandem-system")
    source.records.load_all()
    writes = {s: 0 for s in spreads}
    real_put, current = source.records._put, [spreads[0]]

    def counted(*args: object) -> None:
        writes[current[0]] += 1
        real_put(*args)  # type: ignore[arg-type]
    source.records._put = counted  # type: ignore[method-assign]
    took: dict[int, list[float]] = {s: [] for s in spreads}
    per_burst: dict[int, list[float]] = {s: [] for s in spreads}
    for b in range(bursts):
        for s in spreads:
            current[0] = s
            got = bind_burst(source, s, b, concurrency)
            assert source.record_writer.flush(30), "records not written"  # counted for s
            took[s] += got
            per_burst[s].append(statistics.median(got))
    source.stop()
    return {s: {"nodes": s, "binds": len(took[s]),
                "bind_ms": {"p50": ms(took[s], 50), "p90": ms(took[s], 90)},
                "burst_p50_ms_per_burst": [round(1000 * v, 3) for v in per_burst[s]],
                "record_writes_per_bind": round(writes[s] / len(took[s]), 3)}
            for s in spreads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bursts", type=int, default=30, help="bursts per spread")
    parser.add_argument("--concurrency", type=int, default=16, help="binds per burst")
    _common.add_out_option(parser, "record_burst")
    opts = parser.parse_args()
    spreads = sorted({1, 4, opts.concurrency})
    load_before = [round(x, 2) for x in _common.load_average()]
    api = fake_kube_api.FakeKubeApi(
        [{"metadata": {"name": f"node-{i}"}} for i in range(opts.concurrency)],
        pods(spreads, opts.bursts, opts.concurrency), record=False)
    port, _, stop = serve_in_child(lambda: (api.start(), api.stop))
    try:
        results = measure(port, spreads, opts.bursts, opts.concurrency)
    finally:
        stop()
    spread = results[opts.concurrency]["bind_ms"]
    ratios = {f"{q}_{s}_nodes_vs_{opts.concurrency}_nodes":
              round(results[s]["bind_ms"][q] / spread[q], 2)
              for s in spreads if s != opts.concurrency for q in ("p50", "p90")}
    doc = {"benchmark": "record_burst", "concurrency": opts.concurrency,
           "bursts_per_spread": opts.bursts,
           "server": "the loopback API server (lab/fakes/kube_api.py) in a process of its own; "
                     "binds through KubeSource (the lean keep-alive client) in this one",
           "spreads": list(results.values()), "goal_vs_spread": GOAL,
           "checks": {**ratios, "ok": all(v <= GOAL for k, v in ratios.items()
                                           if k.startswith("p50"))},
           "load_average_1_5_15_at_start": load_before,
           **_common.context(("kubernetes", "urllib3"))}
    _common.write_result(doc, opts.out)


if __name__ == "__main__":
    main()
