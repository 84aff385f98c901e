"""Extender latency through real HTTP to the cheroot server.

Simulated cluster: 1,000 nodes x 8 GPUs with 8,000 placed pods; each cycle sends
500 candidate node names (nodeCacheCapable) to /filter, the survivors to
/prioritize, and binds to the best node, like kube-scheduler. Prints one JSON
object and writes benchmarks/results/extender_latency.json.

    .venv/bin/python benchmarks/extender_latency.py [--cycles N]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import time

import _common

from extender.config import ConfigHolder, load_config
from extender.core import GpuSpec, NodeSpec
from extender.routes import create_app
from extender.server import start_background
from extender.sim import SimSource

NODES, GPUS, CANDIDATES = 1000, 8, 500


def cluster(rng: random.Random) -> SimSource:
    """1,000 x 8 A100-40GB with one placed training pod per GPU."""
    nodes = [NodeSpec(f"node-{i:04d}", tuple(
        GpuSpec(g, f"GPU-{i}-{g}", "NVIDIA-A100-SXM4-40GB", 40960) for g in range(GPUS)))
        for i in range(NODES)]
    pods = []
    for i in range(NODES):
        for g in range(GPUS):
            pods.append({"metadata": {"name": f"placed-{i}-{g}", "namespace": "bench",
                                      "uid": f"placed-{i}-{g}", "annotations": {
                                          "tandem.io/gpu-index": str(g),
                                          "tandem.io/predicted-gpu-util": str(rng.uniform(10, 70)),
                                          "tandem.io/predicted-gpu-mem-mib":
                                              str(rng.randrange(2000, 30000))}},
                         "spec": {"nodeName": f"node-{i:04d}"}, "status": {"phase": "Running"}})
    return SimSource(nodes, pods)


def pct(values: list[float], q: float) -> float:
    """Percentile q (0..100) in milliseconds, nearest-rank."""
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=30)
    _common.add_out_option(parser, "extender_latency")
    opts = parser.parse_args()
    rng = random.Random(42)
    cfg = load_config(None, environ={"TANDEM__LOGGING__LEVEL": "warning"})
    source = cluster(rng)
    build_start = time.perf_counter()
    app = create_app(ConfigHolder(cfg), source)
    build_seconds = time.perf_counter() - build_start
    server = start_background(app, cfg.server, port=0)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    names = [n.name for n in source.nodes]
    lat: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}

    def post(path: str, body: dict) -> tuple[float, object]:
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        payload = resp.read()
        elapsed = time.perf_counter() - t0
        assert resp.status == 200, (path, resp.status, payload[:200])
        return elapsed, json.loads(payload)

    bound = 0
    total = opts.warmup + opts.cycles
    cycle_start = None
    for c in range(total):
        if c == opts.warmup:
            cycle_start = time.perf_counter()
        pod = {"metadata": {"name": f"new-{c}", "namespace": "bench", "uid": f"new-{c}",
                            "resourceVersion": "1", "annotations": {
                                "tandem.io/gpu-util": str(rng.uniform(10, 50)),
                                "tandem.io/gpu-mem-mib": str(rng.randrange(1000, 8000))}},
               "spec": {"containers": [{"name": "c", "resources": {
                   "limits": {"tandem.io/gpu": "1"}}}]}}
        source.create_pod(pod)
        cand = rng.sample(names, CANDIDATES)
        t_f, filtered = post("/filter", {"Pod": pod, "NodeNames": cand})
        passed = filtered["NodeNames"]
        t_p, ranked = post("/prioritize", {"Pod": pod, "NodeNames": passed})
        best = max(ranked, key=lambda h: h["Score"])["Host"]
        t_b, result = post("/bind", {"PodName": pod["metadata"]["name"], "PodNamespace": "bench",
                                     "PodUID": pod["metadata"]["uid"], "Node": best})
        bound += result["Error"] == ""
        if c >= opts.warmup:
            lat["filter"].append(t_f)
            lat["prioritize"].append(t_p)
            lat["bind"].append(t_b)
    elapsed = time.perf_counter() - (cycle_start or time.perf_counter())
    server.stop()
    doc = {
        "benchmark": "extender_latency",
        "cluster": {"nodes": NODES, "gpus_per_node": GPUS, "placed_pods": NODES * GPUS,
                    "candidates_per_call": CANDIDATES},
        "cycles": opts.cycles, "binds_succeeded": bound - 0,
        "latency_ms": {verb: {"p50": pct(v, 50), "p99": pct(v, 99),
                              "mean": round(1000 * statistics.fmean(v), 3)}
                       for verb, v in lat.items()},
        "cycles_per_second": round(opts.cycles / elapsed, 1),
        "goals": {"p99_ms_per_verb": 3.0, "cycles_per_second": 300},
        "state_build_seconds": round(build_seconds, 3),
        **_common.context(("numpy", "flask", "cheroot")),
    }
    _common.write_result(doc, opts.out)


if __name__ == "__main__":
    main()
