"""Extender latency through real HTTP to the cheroot server.

Simulated cluster: 1,000 nodes x 8 GPUs with 8,000 placed pods; each cycle sends
500 candidate node names (nodeCacheCapable) to /filter, the survivors to
/prioritize, and binds to the best node, like kube-scheduler. Prints one JSON
object and writes benchmarks/results/extender_latency.json.

The extender runs in its own (forked) process, as in production, and this
process is the scheduler; ``--in-process`` serves from a thread of this process
instead, where the client's and the server's threads hand the GIL to each other
on every request. Either way most of a cycle is thread and process wake-ups, not
decisions, so on a shared 2-core VM the figures move a lot from run to run (the
separate process gave 185-450 cycles/s over 19 runs of the same code within 20
minutes; ``state_build_seconds``, pure computation, moves with them): compare
runs taken back to back. The load generator stays out of the measurement as far
as it can: the pods and candidate lists are drawn before the clock starts (same
random sequence as when they were drawn per cycle), and by default requests go
over one keep-alive HTTP/1.1 socket with a minimal client (``--client raw``), because the standard
library's ``http.client`` spends about 0.2 ms per request of its own on this
machine (header parsing through ``email``), where kube-scheduler's Go client
spends a few microseconds. ``--client http.client`` measures with it instead.
Each cycle still encodes its requests and decodes the answers.

    .venv/bin/python benchmarks/extender_latency.py [--cycles N] [--client raw|http.client]
        [--in-process]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import time
from collections.abc import Callable

import _common

from extender.config import ConfigHolder, ExtenderConfig, load_config
from extender.core import GpuSpec, NodeSpec
from extender.routes import create_app
from extender.server import start_background
from extender.sim_cluster import SimSource

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


class RawClient:
    """Minimal keep-alive HTTP/1.1 POST client: fixed headers out, Content-Length body in."""

    def __init__(self, port: int, timeout_seconds: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_seconds)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def post(self, path: str, data: bytes) -> tuple[int, bytes]:
        """Send one request and read its answer (status, body)."""
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(data)}\r\n\r\n").encode()
        self.sock.sendall(head + data)
        status = int(self.reader.readline().split(b" ", 2)[1])
        length = 0
        while (line := self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, self.reader.read(length)

    def close(self) -> None:
        """Close the connection."""
        self.reader.close()
        self.sock.close()


def stdlib_client(port: int) -> tuple[Callable[[str, bytes], tuple[int, bytes]],
                                     Callable[[], None]]:
    """``http.client`` as (post, close)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def post(path: str, data: bytes) -> tuple[int, bytes]:
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    return post, conn.close


def workload(rng: random.Random, names: list[str], count: int) -> list[tuple[dict, list[str]]]:
    """``count`` training pods with their candidate names (draw order as per cycle)."""
    out = []
    for c in range(count):
        pod = {"metadata": {"name": f"new-{c}", "namespace": "bench", "uid": f"new-{c}",
                            "resourceVersion": "1", "annotations": {
                                "tandem.io/gpu-util": str(rng.uniform(10, 50)),
                                "tandem.io/gpu-mem-mib": str(rng.randrange(1000, 8000))}},
               "spec": {"containers": [{"name": "c", "resources": {
                   "limits": {"tandem.io/gpu": "1"}}}]}}
        out.append((pod, rng.sample(names, CANDIDATES)))
    return out


Serving = tuple[int, float, Callable[[], None]]
"""(port, state build seconds, stop) of a started extender."""


def serve_in_child(cfg: ExtenderConfig, source: SimSource) -> Serving:
    """Fork a process that builds the extender over ``source`` and serves it.

    Returns (port, state build seconds, stop). The child serves until ``stop`` closes
    the pipe it waits on, then stops its server and exits.
    """
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the extender
        code = 1
        try:
            os.close(ready_r)
            os.close(hold_w)
            start = time.perf_counter()
            app = create_app(ConfigHolder(cfg), source)
            build = time.perf_counter() - start
            server = start_background(app, cfg.server, port=0)
            os.write(ready_w, f"{server.port} {build}\n".encode())
            os.read(hold_r, 1)  # returns when the parent closes its end
            server.stop()
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(hold_r)
    with os.fdopen(ready_r) as ready:
        port, build = ready.readline().split()

    def stop() -> None:
        os.close(hold_w)
        os.waitpid(pid, 0)
    return int(port), float(build), stop


def serve_in_thread(cfg: ExtenderConfig, source: SimSource) -> Serving:
    """The extender in a thread of this process: (port, state build seconds, stop)."""
    start = time.perf_counter()
    app = create_app(ConfigHolder(cfg), source)
    build = time.perf_counter() - start
    server = start_background(app, cfg.server, port=0)
    return server.port, build, server.stop


def pct(values: list[float], q: float) -> float:
    """Percentile q (0..100) in milliseconds, nearest-rank."""
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--client", choices=("raw", "http.client"), default="raw",
                        help="HTTP client of the load generator (module doc)")
    parser.add_argument("--in-process", action="store_true",
                        help="serve from a thread of the benchmark process (module doc)")
    _common.add_out_option(parser, "extender_latency")
    opts = parser.parse_args()
    rng = random.Random(42)
    cfg = load_config(None, environ={"TANDEM__LOGGING__LEVEL": "warning"})
    source = cluster(rng)
    names = [n.name for n in source.nodes]
    jobs = workload(rng, names, opts.warmup + opts.cycles)
    for pod, _ in jobs:  # the pods exist before the scheduler sees them
        source.create_pod(pod)
    port, build_seconds, stop = (serve_in_thread if opts.in_process else serve_in_child)(
        cfg, source)
    if opts.client == "raw":
        raw = RawClient(port)
        send, close = raw.post, raw.close
    else:
        send, close = stdlib_client(port)
    lat: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}

    def post(path: str, body: dict) -> tuple[float, object]:
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        status, payload = send(path, data)
        elapsed = time.perf_counter() - t0
        assert status == 200, (path, status, payload[:200])
        return elapsed, json.loads(payload)

    bound = 0
    cycle_start = None
    for c, (pod, cand) in enumerate(jobs):
        if c == opts.warmup:
            cycle_start = time.perf_counter()
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
    close()
    stop()
    doc = {
        "benchmark": "extender_latency",
        "cluster": {"nodes": NODES, "gpus_per_node": GPUS, "placed_pods": NODES * GPUS,
                    "candidates_per_call": CANDIDATES},
        "cycles": opts.cycles, "binds_succeeded": bound, "client": opts.client,
        "server": "thread of the benchmark process" if opts.in_process else "own process",
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
