"""Extender latency through real HTTP, on a simulated and a (fake) Kubernetes cluster.

1,000 nodes x 8 GPUs with 8,000 placed pods; each cycle sends 500 candidate node
names (nodeCacheCapable) to /filter, the survivors to /prioritize, and binds to
the best node, like kube-scheduler. Three extenders are measured in one run,
interleaved, ``--repeats`` times each:

- ``sim``: tandem over its ``sim:`` cluster source (no API server);
- ``kube``: tandem over its ``kube`` source, talking real HTTP to
  ``lab/fakes/kube_api.py`` in a process of its own: lists and watches through the
  official ``kubernetes`` client, bindings and events through tandem's lean client
  built from that client's configuration (``extender/cluster/kube_http.py``);
- ``trivial``: ``trivial_extender.py`` (Flask on cheroot, GPU memory check only,
  bind through the same client and fake API), the baseline a p99 is compared to.

Prints one JSON object (per mode: p50/p99/mean per verb over all repeats, cycles/s
per repeat and their median) and writes benchmarks/results/extender_latency.json.

Each extender runs in its own (forked) process, as in production, and this
process is the scheduler; ``--in-process`` serves ``sim`` from a thread of this
process instead, where the client's and the server's threads hand the GIL to each other
on every request. Either way most of a cycle is thread and process wake-ups, not
decisions, so on a shared 2-core VM the figures move a lot from run to run (the
separate process gave 185-450 cycles/s over 19 runs of the same code within 20
minutes; ``state_build_seconds``, pure computation, moves with them): compare
modes of the same run, which is why they are interleaved. The load generator stays out of the
measurement as far as it can: the pods and candidate lists are drawn before the clock starts
(same random sequence as when they were drawn per cycle), and by default requests go
over one keep-alive HTTP/1.1 socket with a minimal client (``--client raw``), because the standard
library's ``http.client`` spends about 0.2 ms per request of its own on this
machine (header parsing through ``email``), where kube-scheduler's Go client
spends a few microseconds. ``--client http.client`` measures with it instead.
Each cycle still encodes its requests and decodes the answers.

kube-scheduler's own pattern (``scheduler_pattern.py``) runs after the cycles on the
``kube`` and ``trivial`` servers and on a floor server that does no work: one bind at
a time, bursts of ``--concurrency`` binds while scheduling goes on, and the pipelined
loop (binds handed to ``--concurrency`` binders). Its ratios (burst bind p50 against
one bind's, pods/s against the trivial extender's and the floor's) come from servers
measured in the same repeat; each server's burst/single ratio is also divided by the
floor's, which is what queueing ``--concurrency`` requests on this machine's cores
costs whatever the server does.

    .venv/bin/python benchmarks/extender_latency.py [--cycles N] [--repeats N]
        [--modes sim,kube,trivial] [--client raw|http.client] [--in-process]
        [--pattern-pods N] [--pattern-single N] [--concurrency N] [--threads N]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import time
import traceback
from collections.abc import Callable

import _common
from kubernetes import client

from benchmarks import scheduler_pattern, trivial_extender
from benchmarks.scheduler_pattern import RawClient, pattern_summary
from extender.cluster.kube import KubeSource
from extender.cluster.sim import SimSource
from extender.config.loader import ConfigHolder, load_config
from extender.config.sections import ExtenderConfig, StateConfig
from extender.core import GpuSpec, NodeSpec
from extender.state.signing import PlacementSigner
from extender.transport.server import start_background
from extender.wiring import create_app
from lab.fakes import kube_api as fake_kube_api

NODES, GPUS, CANDIDATES = 1000, 8, 500
GPU_PRODUCT, GPU_MIB = "NVIDIA-A100-SXM4-40GB", 40960
MODES = ("sim", "kube", "trivial")
GOALS = {"kube_bind_p50_ms": 2.0, "kube_cycles_per_second": 100.0, "p99_vs_trivial": 2.0}
"""Issue goals: kube bind p50 and cycle rate, and every verb's p99 at most 2x trivial's."""
CONTAINER = {"name": "train", "image": "registry.example/train:1",
             "resources": {"limits": {"tandem.io/gpu": "1"}}}


SIGNING_KEY = "extender-latency-benchmark-key"
"""Placement signing key of the benchmark's extenders (placed pods are signed with it)."""


def placed_pods(rng: random.Random) -> list[dict]:
    """One placed training pod per GPU of the 1,000 x 8 A100-40GB cluster (signed placements)."""
    signer = PlacementSigner(SIGNING_KEY.encode())
    pods = []
    for i in range(NODES):
        for g in range(GPUS):
            pods.append({"metadata": {"name": f"placed-{i}-{g}", "namespace": "bench",
                                      "uid": f"placed-{i}-{g}", "annotations": signer.sign(
                                          f"placed-{i}-{g}", f"node-{i:04d}", {
                                          "tandem.io/gpu-index": str(g),
                                          "tandem.io/predicted-gpu-util": str(rng.uniform(10, 70)),
                                          "tandem.io/predicted-gpu-mem-mib":
                                              str(rng.randrange(2000, 30000))})},
                         "spec": {"nodeName": f"node-{i:04d}", "containers": [CONTAINER]},
                         "status": {"phase": "Running"}})
    return pods


def node_names() -> list[str]:
    """The cluster's node names."""
    return [f"node-{i:04d}" for i in range(NODES)]


def sim_source(placed: list[dict], jobs: list[tuple[dict, list[str]]]) -> SimSource:
    """The cluster as a ``sim:`` source, with the jobs' pods created."""
    nodes = [NodeSpec(name, tuple(GpuSpec(g, f"GPU-{i}-{g}", GPU_PRODUCT, GPU_MIB)
                                  for g in range(GPUS))) for i, name in enumerate(node_names())]
    source = SimSource(nodes, placed)
    for pod, _ in jobs:  # the pods exist before the scheduler sees them
        source.create_pod(pod)
    return source


def fake_api(placed: list[dict], jobs: list[tuple[dict, list[str]]]) -> fake_kube_api.FakeKubeApi:
    """The cluster behind a fake API server: GFD-labelled nodes, placed pods with their
    placement records, and pending pods."""
    labels = {"nvidia.com/gpu.count": str(GPUS), "nvidia.com/gpu.product": GPU_PRODUCT,
              "nvidia.com/gpu.memory": str(GPU_MIB)}
    nodes = [{"metadata": {"name": name, "labels": labels}} for name in node_names()]
    pending = [{**pod, "status": {"phase": "Pending"}} for pod, _ in jobs]
    api = fake_kube_api.FakeKubeApi(nodes, placed + pending, record=False)
    # Their placement records too, as bind left them: without them a starting extender
    # writes every one back (from the signatures) while it is being measured.
    scheduler_pattern.seed_records(api, placed)
    return api


def kube_client(port: int) -> client.CoreV1Api:
    """The official client on the fake API server (built after fork: pools are per process)."""
    return client.CoreV1Api(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")))


def stdlib_client(port: int) -> tuple[Callable[[str, bytes], tuple[int, bytes]],
                                     Callable[[], None]]:
    """``http.client`` as (post, close)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def post(path: str, data: bytes) -> tuple[int, bytes]:
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    return post, conn.close


def workload(rng: random.Random, names: list[str], count: int, prefix: str = "new",
             ) -> list[tuple[dict, list[str]]]:
    """``count`` training pods with their candidate names (draw order as per cycle)."""
    out = []
    for c in range(count):
        pod = {"metadata": {"name": f"{prefix}-{c}", "namespace": "bench", "uid": f"{prefix}-{c}",
                            "resourceVersion": "1", "annotations": {
                                "tandem.io/gpu-util": str(rng.uniform(10, 50)),
                                "tandem.io/gpu-mem-mib": str(rng.randrange(1000, 8000))}},
               "spec": {"containers": [{"name": "c", "resources": {
                   "limits": {"tandem.io/gpu": "1"}}}]}}
        out.append((pod, rng.sample(names, CANDIDATES)))
    return out


Serving = tuple[int, float, Callable[[], None]]
SERVER_PIDS: dict[int, int] = {}
"""Port -> process id of each server ``serve_in_child`` started (scheduler_pattern.py reads
the servers' CPU time)."""
"""(port, build seconds, stop) of a started server."""
Starter = Callable[[], tuple[int, Callable[[], None]]]
"""Builds and starts a server in the calling process: (port, stop)."""


def serve_in_child(start: Starter) -> Serving:
    """Fork a process that runs ``start`` and serves until ``stop`` closes its pipe.

    Returns (port, build seconds, stop); build seconds is how long ``start`` took
    (for tandem: building the state, over HTTP from the API server in ``kube`` mode).
    """
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the server
        code = 1
        try:
            os.close(ready_r)
            os.close(hold_w)
            begin = time.perf_counter()
            port, stop = start()
            os.write(ready_w, f"{port} {time.perf_counter() - begin}\n".encode())
            os.read(hold_r, 1)  # returns when the parent closes its end
            stop()
            code = 0
        except BaseException:
            traceback.print_exc()  # os._exit below would swallow it
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(hold_r)
    with os.fdopen(ready_r) as ready:
        port, build = ready.readline().split()
    SERVER_PIDS[int(port)] = pid

    def stop() -> None:
        os.close(hold_w)
        os.waitpid(pid, 0)
        SERVER_PIDS.pop(int(port), None)
    return int(port), float(build), stop


def tandem_starter(cfg: ExtenderConfig, source_factory: Callable[[], object]) -> Starter:
    """Start tandem's app (over the source the factory builds) on its cheroot server."""
    def start() -> tuple[int, Callable[[], None]]:
        source = source_factory()
        app = create_app(ConfigHolder(cfg), source)
        server = start_background(app, cfg.server, port=0)

        def stop() -> None:
            server.stop()
            source.stop()
        return server.port, stop
    return start


def pct(values: list[float], q: float) -> float:
    """Percentile q (0..100) in milliseconds, nearest-rank."""
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3)


def run_cycles(port: int, jobs: list[tuple[dict, list[str]]], warmup: int, client_kind: str,
               ) -> tuple[dict[str, list[float]], float, int]:
    """Filter, prioritize, bind per job: (latencies per verb, cycles/s, binds succeeded)."""
    if client_kind == "raw":
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
        if c == warmup:
            cycle_start = time.perf_counter()
        t_f, filtered = post("/filter", {"Pod": pod, "NodeNames": cand})
        passed = filtered["NodeNames"]
        t_p, ranked = post("/prioritize", {"Pod": pod, "NodeNames": passed})
        best = max(ranked, key=lambda h: h["Score"])["Host"]
        t_b, result = post("/bind", {"PodName": pod["metadata"]["name"], "PodNamespace": "bench",
                                     "PodUID": pod["metadata"]["uid"], "Node": best})
        bound += c >= warmup and result["Error"] == ""
        if c >= warmup:
            lat["filter"].append(t_f)
            lat["prioritize"].append(t_p)
            lat["bind"].append(t_b)
    elapsed = time.perf_counter() - (cycle_start or time.perf_counter())
    close()
    return lat, (len(jobs) - warmup) / elapsed, bound


def run_mode(mode: str, cfg: ExtenderConfig, placed: list[dict],
             jobs: list[tuple[dict, list[str]]], opts: argparse.Namespace,
             pattern_jobs: list[tuple[dict, list[str]]] = (),  # type: ignore[assignment]
             ) -> tuple[dict[str, list[float]], float, int, float, dict | None]:
    """One measured run of one extender: (latencies, cycles/s, binds, build seconds, and
    kube-scheduler's pattern on the same server when ``pattern_jobs`` are given)."""
    stops = []
    if mode == "sim":
        source = sim_source(placed, jobs)
        starter = tandem_starter(cfg, lambda: source)
        if opts.in_process:
            begin = time.perf_counter()
            port, stop = starter()
            serving = (port, time.perf_counter() - begin, stop)
        else:
            serving = serve_in_child(starter)
    else:
        api = fake_api(placed, [*jobs, *pattern_jobs])
        api_port, _, api_stop = serve_in_child(lambda: (api.start(), api.stop))
        stops.append(api_stop)
        if mode == "kube":
            serving = serve_in_child(tandem_starter(cfg, lambda: KubeSource(kube_client(api_port))))
        else:
            serving = serve_in_child(lambda: trivial_extender.serve(
                trivial_extender.create_trivial_app(kube_client(api_port)), cfg.server.threads))
    port, build, stop = serving
    stops.insert(0, stop)
    pattern = None
    try:
        lat, rate, bound = run_cycles(port, jobs, opts.warmup, opts.client)
        if pattern_jobs:
            pattern = scheduler_pattern.measure(lambda: RawClient(port), list(pattern_jobs),
                                                opts.concurrency, opts.pattern_single)
    finally:
        for stop in stops:
            stop()
    return lat, rate, bound, build, pattern


def run_floor(cfg: ExtenderConfig, pattern_jobs: list[tuple[dict, list[str]]],
              opts: argparse.Namespace) -> dict:
    """kube-scheduler's pattern against the floor server (scheduler_pattern.serve_floor)."""
    port, _, stop = serve_in_child(lambda: scheduler_pattern.serve_floor(cfg.server.threads))
    try:
        return scheduler_pattern.measure(lambda: RawClient(port), pattern_jobs,
                                         opts.concurrency, opts.pattern_single)
    finally:
        stop()


def summary(runs: list[tuple[dict[str, list[float]], float, int, float]]) -> dict:
    """Per verb percentiles over all repeats, cycles/s per repeat and their median."""
    verbs = runs[0][0].keys()
    pooled = {verb: [x for run in runs for x in run[0][verb]] for verb in verbs}
    return {
        "latency_ms": {verb: {"p50": pct(v, 50), "p99": pct(v, 99),
                              "mean": round(1000 * statistics.fmean(v), 3)}
                       for verb, v in pooled.items()},
        "cycles_per_second": round(statistics.median(run[1] for run in runs), 1),
        "cycles_per_second_runs": [round(run[1], 1) for run in runs],
        "binds_succeeded": [run[2] for run in runs],
        "state_build_seconds": [round(run[3], 3) for run in runs],
    }


def checks(modes: dict[str, dict]) -> dict:
    """The issue's goals against this run (only for the modes measured)."""
    out: dict[str, object] = {}
    if "kube" in modes:
        kube = modes["kube"]
        out["kube_bind_p50_ms"] = kube["latency_ms"]["bind"]["p50"]
        out["kube_cycles_per_second"] = kube["cycles_per_second"]
        out["kube_bind_p50_ok"] = out["kube_bind_p50_ms"] <= GOALS["kube_bind_p50_ms"]
        out["kube_cycles_ok"] = out["kube_cycles_per_second"] >= GOALS["kube_cycles_per_second"]
    if "trivial" in modes:
        base = modes["trivial"]["latency_ms"]
        for mode in ("sim", "kube"):
            if mode in modes:
                ratios = {verb: round(v["p99"] / base[verb]["p99"], 2)
                          for verb, v in modes[mode]["latency_ms"].items()}
                out[f"{mode}_p99_vs_trivial"] = ratios
                out[f"{mode}_p99_vs_trivial_ok"] = max(ratios.values()) <= GOALS["p99_vs_trivial"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated subset of sim,kube,trivial (module doc)")
    parser.add_argument("--client", choices=("raw", "http.client"), default="raw",
                        help="HTTP client of the load generator (module doc)")
    parser.add_argument("--in-process", action="store_true",
                        help="serve sim from a thread of the benchmark process (module doc)")
    parser.add_argument("--pattern-pods", type=int, default=416,
                        help="pods per repeat for kube-scheduler's pattern on kube and trivial "
                             "and the floor server (scheduler_pattern.py); 0: off")
    parser.add_argument("--pattern-single", type=int, default=96,
                        help="of those, pods scheduled and bound one at a time")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="binds in flight at once in the pattern")
    parser.add_argument("--threads", type=int, default=None,
                        help="server threads of every extender (default: server.threads)")
    _common.add_out_option(parser, "extender_latency")
    opts = parser.parse_args()
    modes = [m for m in opts.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes must be a non-empty subset of {','.join(MODES)}")
    load_before = [round(x, 2) for x in os.getloadavg()]
    os.environ[StateConfig.signing_key_env] = SIGNING_KEY  # the forked extenders inherit it
    rng = random.Random(42)
    # The loopback API server has no kubelet to admit pods, so no device plugin hands GPUs
    # over: the env hand-off (the device-plugin gate would hold each node after a bind).
    overrides = {"TANDEM__LOGGING__LEVEL": "warning", "TANDEM__HANDOFF__MODE": "env"}
    if opts.threads is not None:
        overrides["TANDEM__SERVER__THREADS"] = str(opts.threads)
    cfg = load_config(None, environ=overrides)
    placed = placed_pods(rng)
    jobs = workload(rng, node_names(), opts.warmup + opts.cycles)
    pattern_jobs = workload(rng, node_names(), opts.pattern_pods, "pat")
    runs: dict[str, list] = {mode: [] for mode in modes}
    patterns: list[dict[str, dict]] = []
    for _ in range(opts.repeats):  # interleaved: load from elsewhere hits every mode alike
        pattern: dict[str, dict] = {}
        for mode in modes:
            with_pattern = pattern_jobs if mode != "sim" else []
            run = run_mode(mode, cfg, placed, jobs, opts, with_pattern)
            runs[mode].append(run[:4])
            if run[4] is not None:
                pattern[mode] = run[4]
        if pattern_jobs:
            pattern["floor"] = run_floor(cfg, pattern_jobs, opts)
            patterns.append(pattern)
    results = {mode: summary(r) for mode, r in runs.items()}
    doc = {
        "benchmark": "extender_latency",
        "cluster": {"nodes": NODES, "gpus_per_node": GPUS, "placed_pods": NODES * GPUS,
                    "candidates_per_call": CANDIDATES},
        "cycles": opts.cycles, "repeats": opts.repeats, "client": opts.client,
        "server_threads": cfg.server.threads,
        "server": "own process per extender and for the fake API server"
                  + ("; sim in a thread of the benchmark process" if opts.in_process else ""),
        "modes": results,
        "goals": {**GOALS, "sim_p99_ms_per_verb": 3.0, "sim_cycles_per_second": 300},
        "checks": checks(results),
        "scheduler_pattern": pattern_summary(patterns, opts) if patterns else None,
        "load_average_1_5_15_at_start": load_before,
        **_common.context(("numpy", "flask", "cheroot", "kubernetes", "urllib3")),
    }
    _common.write_result(doc, opts.out)


if __name__ == "__main__":
    main()
