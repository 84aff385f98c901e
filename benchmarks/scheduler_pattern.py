"""kube-scheduler's call pattern against an extender, for extender_latency.py.

kube-scheduler runs one scheduling cycle at a time (filter, then prioritize) and
binds asynchronously: each bind runs in a goroutine of its own while the next
pods are filtered and scored, over a connection of its own when the others are
busy. Three measurements per extender, all on one server instance:

- ``single``: filter, prioritize, then bind, waiting for each (one connection);
- ``burst``: the binds of ``concurrency`` pods released at once (one connection
  each) while the scheduling loop goes on filtering and prioritizing the next
  pods; every bind's latency is kept;
- ``pipeline``: the scheduler's loop at full speed: filter and prioritize one pod
  after another, each bind handed to a pool of ``concurrency`` binders; pods per
  second counted until the last bind answered.

Run on its own (``main``), it measures tandem (the ``kube`` source: the Binding on the
scheduler's path, the placement record written after it), the trivial extender and the
floor on the cluster of ``extender_latency.py``, each behind a loopback API server of its
own, once per ``--api-latency-ms``: every write to the API server waits that long before
it is applied and answered (``lab/fakes/kube_api.py``; by default none, then
``REAL_WRITE_LATENCY_S``, what a real API server with etcd on SSD takes, cited there), and
the floor waits it once per bind. Without the wait a bind is pure CPU, and 16 of them queue
on a small machine's cores whatever the server does; with it, binds that overlap their waits
on the API server add about one wait to the burst, binds serialised on it about eight
(``write_wait_in_burst``). In each of ``--repeats`` repeats the three servers run one after
the other (the order reversed every other repeat), each on pods of its own; the ratios are
taken per repeat (tandem's pods/s over the trivial extender's: paired), then reported as
median and distribution-free 95% interval. Each mode also reports the CPU time of this
process (the scheduler), the extender's and its API server's (``process_cpu.py``): per pod,
and in the bursts' windows (release to last answer) by process (``cpu_by_process``), so a
run shows which of them the burst waited on::

    .venv/bin/python benchmarks/scheduler_pattern.py [--api-latency-ms 0 5] [--repeats 10]
        [--single 32] [--burst 64] [--concurrency 16] [--burst-filters 8]

``--compare-orders`` runs the comparison of the two orders of a bind's API writes instead
(``results/scheduler_pattern_orders.json``): ``record-first`` (the node's placement record,
then the Binding: two writes the scheduler waits for, the order before #40, kept here as
:class:`RecordFirstSource`) against ``binding-first`` (``extender/cluster/record_writer.py``),
beside the trivial extender and the floor, on an API server that answers at once.

``serve_floor`` is the floor: a cheroot server that parses each body and answers
what an extender must (every node passes, score 0, bound) with no work, so its
figures are what the three HTTP calls alone cost. On a machine with fewer cores
than binds in flight, the floor's own burst p50 is many times its single-bind p50:
:func:`checks` therefore also divides each server's burst/single ratio by the
floor's (``*_over_floors``: the waiting the server adds) and its burst p50 by the
floor's (``*_vs_floor_burst``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import random
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

try:  # run as a script: _common puts the repository root first on the path
    import _common
except ImportError:  # imported as benchmarks.scheduler_pattern (the root is on the path)
    from benchmarks import _common
from cheroot import wsgi

from contracts.httpserve import KEEP_ALIVE_CONNECTIONS
from extender.cluster.kube import KubeSource
from extender.cluster.records import NODE_ANNOTATION, RECORD_LABEL, encode_entry, record_name
from extender.cluster.source import placement_from_pod
from extender.errors import SourceError
from extender.transport.server import LISTEN_BACKLOG

_cpu = _common.sibling("process_cpu")  # each process's CPU time in a run
CpuMeter, Windows = _cpu.CpuMeter, _cpu.Windows

Job = tuple[dict, list[str]]
PATTERN_GOALS = {"burst_bind_p50_vs_single": 2.0, "pipeline_vs_trivial": 0.6}
"""Goals of kube-scheduler's pattern (scheduler_pattern.py): bind p50 with ``--concurrency``
binds at once at most 2x one bind's, and pods/s at least 0.6x the trivial extender's."""


class RawClient:
    """Minimal keep-alive HTTP/1.1 POST client: fixed headers out, Content-Length body in."""

    def __init__(self, port: int, timeout_seconds: float = 10.0):
        self.port, self.timeout, self.reconnects = port, timeout_seconds, 0
        self._connect()

    def _connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def post(self, path: str, data: bytes) -> tuple[int, bytes]:
        """Send one request and read its answer (status, body); reconnects after a
        ``Connection: close`` answer, as Go's client does."""
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(data)}\r\n\r\n").encode()
        self.sock.sendall(head + data)
        status = int(self.reader.readline().split(b" ", 2)[1])
        length, close = 0, False
        while (line := self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        body = self.reader.read(length)
        if close:
            self.reconnects += 1
            self.close()
            self._connect()
        return status, body

    def close(self) -> None:
        """Close the connection."""
        self.reader.close()
        self.sock.close()




class Client(Protocol):
    """A keep-alive HTTP client of the extender (``extender_latency.RawClient``)."""

    def post(self, path: str, data: bytes) -> tuple[int, bytes]: ...
    def close(self) -> None: ...


class Lazy:
    """A client that connects on its first request: like Go's, a new connection always
    carries a request at once (cheroot gives a fresh, silent connection a worker)."""

    def __init__(self, connect: Callable[[], Client]):
        self._connect, self._client = connect, None

    def post(self, path: str, data: bytes) -> tuple[int, bytes]:
        """Connect if needed, then send."""
        if self._client is None:
            self._client = self._connect()
        return self._client.post(path, data)

    def close(self) -> None:
        """Close the connection, if one was opened."""
        if self._client is not None:
            self._client.close()


def _call(client: Client, path: str, body: Any) -> tuple[float, Any]:
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    status, payload = client.post(path, data)
    elapsed = time.perf_counter() - t0
    assert status == 200, (path, status, payload[:200])
    return elapsed, json.loads(payload)


def _schedule(client: Client, job: Job) -> tuple[float, float, str]:
    """One scheduling cycle: (filter s, prioritize s, chosen node)."""
    pod, candidates = job
    t_f, filtered = _call(client, "/filter", {"Pod": pod, "NodeNames": candidates})
    passed = filtered["NodeNames"]
    t_p, ranked = _call(client, "/prioritize", {"Pod": pod, "NodeNames": passed})
    return t_f, t_p, max(ranked, key=lambda h: h["Score"])["Host"] if ranked else passed[0]


def _bind_body(pod: dict, node: str) -> dict:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node}


def _bind(client: Client, pod: dict, node: str) -> tuple[float, bool]:
    elapsed, result = _call(client, "/bind", _bind_body(pod, node))
    return elapsed, result.get("Error") == ""


def ms(values: list[float], q: float) -> float:
    """Percentile q of seconds, in milliseconds (nearest rank)."""
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3)


def _cpu_per_pod(meter: CpuMeter | None, before: dict[str, float] | None,
                 pods: int) -> dict[str, Any]:
    """``{"cpu_ms_per_pod": {process: ms}}`` since ``before`` (nothing without a meter)."""
    if meter is None or before is None or not pods:
        return {}
    after = meter.read()
    return {"cpu_ms_per_pod": {k: round(1000 * (after[k] - v) / pods, 3)
                               for k, v in before.items()}}


def single(connect: Callable[[], Client], jobs: list[Job],
           meter: CpuMeter | None = None) -> dict[str, Any]:
    """Each pod scheduled and bound before the next (the sequential cycle)."""
    cpu = meter.read() if meter is not None else None
    client = connect()
    binds, ok, start = [], 0, time.perf_counter()
    for job in jobs:
        _, _, node = _schedule(client, job)
        t_b, good = _bind(client, job[0], node)
        binds.append(t_b)
        ok += good
    elapsed = time.perf_counter() - start
    client.close()
    return {"bind_ms": {"p50": ms(binds, 50), "p90": ms(binds, 90)},
            "pods_per_second": round(len(jobs) / elapsed, 1), "binds_ok": ok,
            **_cpu_per_pod(meter, cpu, len(jobs))}


def burst(connect: Callable[[], Client], jobs: list[Job], concurrency: int,
          meter: CpuMeter | None = None, filters: int | None = None) -> dict[str, Any]:
    """Binds released ``concurrency`` at a time while scheduling continues (``filters`` of
    the next pods filtered meanwhile, by default half as many); with a meter, each
    process's CPU time in the windows from a burst's release to its last answer."""
    filters = concurrency // 2 if filters is None else filters
    windows = Windows(meter) if meter is not None else None
    main = connect()
    binders = [Lazy(connect) for _ in range(concurrency)]
    binds: list[float] = []
    ok = 0
    lock = threading.Lock()
    for start in range(0, len(jobs) - concurrency + 1, concurrency):
        group = jobs[start:start + concurrency]
        chosen = [_schedule(main, job)[2] for job in group]
        gate = threading.Barrier(concurrency + 1)

        def run(i: int, gate: threading.Barrier = gate, group: list[Job] = group,
                chosen: list[str] = chosen) -> None:
            nonlocal ok
            gate.wait()
            t_b, good = _bind(binders[i], group[i][0], chosen[i])
            with lock:
                binds.append(t_b)
                ok += good
        threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
        for t in threads:
            t.start()
        cpu = windows.meter.read() if windows is not None else {}
        released = time.perf_counter()
        gate.wait()
        # The scheduling loop goes on meanwhile: the next group's filter and prioritize.
        nxt = jobs[start + concurrency:start + 2 * concurrency]
        for job in nxt[:filters]:
            _call(main, "/filter", {"Pod": job[0], "NodeNames": job[1]})
        for t in threads:
            t.join()
        if windows is not None:
            windows.add(time.perf_counter() - released, cpu, windows.meter.read())
    for c in [main, *binders]:
        c.close()
    return {"concurrency": concurrency, "binds": len(binds), "binds_ok": ok,
            "bind_ms": {"p50": ms(binds, 50), "p90": ms(binds, 90), "p99": ms(binds, 99),
                        "mean": round(1000 * statistics.fmean(binds), 3)},
            **({"in_bursts": windows.summary()} if windows is not None else {})}


def pipeline(connect: Callable[[], Client], jobs: list[Job], concurrency: int,
             meter: CpuMeter | None = None) -> dict[str, Any]:
    """The scheduler's loop: schedule serially, bind asynchronously (``concurrency`` binders)."""
    cpu = meter.read() if meter is not None else None
    main = connect()
    work: queue.Queue[tuple[dict, str] | None] = queue.Queue(concurrency)
    binds: list[float] = []
    ok = 0
    lock = threading.Lock()

    def binder() -> None:
        nonlocal ok
        client = Lazy(connect)
        while (item := work.get()) is not None:
            t_b, good = _bind(client, *item)
            with lock:
                binds.append(t_b)
                ok += good
        client.close()
    threads = [threading.Thread(target=binder) for _ in range(concurrency)]
    for t in threads:
        t.start()
    cycles = []
    start = time.perf_counter()
    for job in jobs:
        t_f, t_p, node = _schedule(main, job)
        cycles.append(t_f + t_p)
        work.put((job[0], node))  # blocks when every binder is busy, as a bounded pool
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    main.close()
    return {"pods_per_second": round(len(jobs) / elapsed, 1), "binds_ok": ok,
            "filter_plus_prioritize_ms_p50": ms(cycles, 50),
            "bind_ms": {"p50": ms(binds, 50), "p90": ms(binds, 90)},
            **_cpu_per_pod(meter, cpu, len(jobs))}


def measure(connect: Callable[[], Client], jobs: list[Job], concurrency: int,
            single_n: int, meter: CpuMeter | None = None,
            filters: int | None = None) -> dict[str, Any]:
    """The three measurements on one server, each on pods of its own (with a meter, the
    CPU time of this process and of the server's processes in each)."""
    rest = jobs[single_n:]
    half = len(rest) // 2
    return {"single": single(connect, jobs[:single_n], meter),
            "burst": burst(connect, rest[:half], concurrency, meter, filters),
            "pipeline": pipeline(connect, rest[half:], concurrency, meter)}


def floor_app(environ: dict[str, Any], start_response: Callable[..., Any],
              bind_seconds: float = 0.0) -> list[bytes]:
    """The least an extender answers: every node passes, score 0, bound (after
    ``bind_seconds``: the one API write a bind cannot do without, waited for and no more)."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = json.loads(environ["wsgi.input"].read(length) or b"{}")
    path = environ.get("PATH_INFO", "")
    if path == "/filter":
        answer: Any = {"NodeNames": body.get("NodeNames") or [], "FailedNodes": {},
                       "Error": ""}
    elif path == "/prioritize":
        answer = [{"Host": n, "Score": 0} for n in body.get("NodeNames") or []]
    else:
        if bind_seconds > 0:
            time.sleep(bind_seconds)
        answer = {"Error": ""}
    data = json.dumps(answer).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(data)))])
    return [data]


def serve_floor(threads: int, bind_seconds: float = 0.0) -> tuple[int, Callable[[], None]]:
    """The floor server on cheroot (the extenders' server), each bind answered after
    ``bind_seconds``: (port, stop)."""
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        return floor_app(environ, start_response, bind_seconds)
    server = wsgi.Server(("127.0.0.1", 0), app, numthreads=threads,
                         server_name="floor", request_queue_size=LISTEN_BACKLOG)
    server.keep_alive_conn_limit = KEEP_ALIVE_CONNECTIONS
    server.prepare()
    thread = threading.Thread(target=server.serve, name="floor", daemon=True)
    thread.start()

    def stop() -> None:
        server.stop()
        thread.join(timeout=10)
    return int(server.bind_addr[1]), stop


def checks(results: dict[str, dict[str, Any]], goals: dict[str, float]) -> dict[str, Any]:
    """The issue's ratios, from modes measured in the same run."""
    out: dict[str, Any] = {}
    # Every server's own burst/single ratio: what queueing 16 requests costs on this machine
    # whatever the server does (the floor does nothing), beside tandem's.
    for mode, r in results.items():
        out[f"{mode}_burst_bind_p50_vs_single"] = round(
            r["burst"]["bind_ms"]["p50"] / r["single"]["bind_ms"]["p50"], 2)
    # What is each server's own waiting? The floor's burst/single ratio is the machine's
    # (16 requests queueing on its cores); a server's ratio divided by it is what the
    # server adds, and its burst p50 over the floor's burst p50 what a burst bind costs
    # beyond the three HTTP calls under the same burst.
    floor = results.get("floor")
    for mode, r in results.items():
        if floor is not None and mode != "floor":
            out[f"{mode}_burst_bind_p50_vs_single_over_floors"] = round(
                out[f"{mode}_burst_bind_p50_vs_single"]
                / out["floor_burst_bind_p50_vs_single"], 2)
            out[f"{mode}_burst_bind_p50_vs_floor_burst"] = round(
                r["burst"]["bind_ms"]["p50"] / floor["burst"]["bind_ms"]["p50"], 2)
    kube = results.get("kube")
    if kube is not None:
        ratio = kube["burst"]["bind_ms"]["p50"] / kube["single"]["bind_ms"]["p50"]
        out["kube_burst_bind_ok"] = ratio <= goals["burst_bind_p50_vs_single"]
        if floor is not None:
            out["kube_burst_bind_ok_over_floors"] = \
                out["kube_burst_bind_p50_vs_single_over_floors"] <= \
                goals["burst_bind_p50_vs_single"]
        if "trivial" in results:
            out["kube_burst_bind_p50_vs_trivial_burst"] = round(
                kube["burst"]["bind_ms"]["p50"] / results["trivial"]["burst"]["bind_ms"]["p50"], 2)
        for base in ("trivial", "floor"):
            if base in results:
                rate = kube["pipeline"]["pods_per_second"] / \
                    results[base]["pipeline"]["pods_per_second"]
                out[f"kube_pipeline_pods_per_second_vs_{base}"] = round(rate, 2)
        if "trivial" in results:
            out["kube_pipeline_ok"] = \
                out["kube_pipeline_pods_per_second_vs_trivial"] >= goals["pipeline_vs_trivial"]
    if "floor" in results:
        out["floor_cycle_ms"] = round(1000 / results["floor"]["single"]["pods_per_second"], 3)
    return out


def pattern_summary(patterns: list[dict[str, dict]], opts: Any) -> dict:
    """kube-scheduler's pattern per repeat, each repeat's ratios, and their medians."""
    per_run = [checks(p, PATTERN_GOALS) for p in patterns]
    ratios = [k for k, v in per_run[0].items() if isinstance(v, float)]
    return {"pods": opts.pattern_pods, "single_pods": opts.pattern_single,
            "concurrency": opts.concurrency, "goals": PATTERN_GOALS,
            "runs": patterns, "checks_per_run": per_run,
            "checks_median": {k: round(statistics.median(c[k] for c in per_run), 3)
                              for k in ratios}}


class RecordFirstSource(KubeSource):
    """The bind order before #40, for the comparison: the node's placement record written
    (binds to one node sharing writes) before the Binding, both on the scheduler's path."""

    def bind(self, pod: Any, node: str, annotations: Any, placement: Any = None) -> bool:
        """Record, then the Binding (as ``KubeSource.bind`` did)."""
        state = self._state
        try:
            self.records.write(node, pod.uid, encode_entry(placement),
                               lambda uid: uid == pod.uid or state is None
                               or state.is_known(uid))
        except Exception as exc:  # nothing was bound: the scheduler retries
            raise SourceError(f"placement record of {node} not written ({exc!r})") from None
        return super().bind(pod, node, annotations, placement)

    def _record_later(self, node: str, uid: str, entry: str) -> None:
        """Written before the Binding already."""


ORDERS = {"record-first": RecordFirstSource, "binding-first": KubeSource}


def seed_records(api: Any, placed: list[dict], namespace: str = "tandem-system") -> None:
    """The placement records of ``placed`` in the fake API server, as bind left them."""
    data: dict[str, dict[str, str]] = {}
    for pod in placed:
        p = placement_from_pod(pod)
        assert p is not None, pod["metadata"]["name"]
        data.setdefault(p.node, {})[p.pod_uid] = encode_entry(p)
    for node, entries in data.items():
        api.configmap("POST", namespace, None, {"metadata": {
            "name": record_name(node), "labels": {RECORD_LABEL: "true"},
            "annotations": {NODE_ANNOTATION: node}}, "data": entries})


PAIRED = {"single_bind_p50": ("single", "bind_ms", "p50"),
          "single_bind_p90": ("single", "bind_ms", "p90"),
          "burst_bind_p50": ("burst", "bind_ms", "p50"),
          "burst_bind_p90": ("burst", "bind_ms", "p90"),
          "pipeline_pods_per_second": ("pipeline", "pods_per_second")}


PAIRED_BINDS = {k: v for k, v in PAIRED.items() if k != "pipeline_pods_per_second"}


def paired(runs: list[dict[str, Any]], figures: dict[str, tuple[str, ...]] = PAIRED,
           new: str = "binding-first", old: str = "record-first",
           ) -> dict[str, dict[str, Any]]:
    """Per figure, ``new`` over ``old`` in each repeat (both measured back to back, so load
    from elsewhere hits them alike): the ratios, their mean and a 95% t-interval of the
    mean (needs 2 repeats or more)."""
    t95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
    out = {}
    for name, path in figures.items():
        def value(r: dict[str, Any], path: tuple[str, ...] = path) -> float:
            for key in path:
                r = r[key]
            return float(r)  # type: ignore[arg-type]
        ratios = [value(r[new]) / value(r[old]) for r in runs]
        mean = statistics.fmean(ratios)
        half = t95.get(len(ratios) - 1, 2.0) * statistics.stdev(ratios) / len(ratios) ** 0.5 \
            if len(ratios) > 1 else None
        out[name] = {"ratios": [round(x, 3) for x in ratios], "mean": round(mean, 3),
                     "interval_95": None if half is None else
                     [round(mean - half, 3), round(mean + half, 3)]}
    return out


def branch_over_against(runs: dict[str, list[dict[str, Any]]],
                        figures: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """``{"branch_over_against": paired ratios}`` of ``_common.interleaved``'s runs, when
    another checkout was measured twice or more; else nothing."""
    if "against" not in runs or len(runs["against"]) < 2:
        return {}
    return {"branch_over_against": paired(
        [{"branch": b, "against": a} for b, a in zip(runs["branch"], runs["against"],
                                                      strict=True)],
        figures, "branch", "against")}


def _setting() -> tuple[Any, random.Random, list[dict]]:
    """The extenders' configuration (the signing key in the environment the forked ones
    read), the workload's random draws and the cluster's bound pods."""
    from benchmarks import extender_latency as world
    from extender.config.loader import load_config
    from extender.config.sections import StateConfig

    os.environ[StateConfig.signing_key_env] = world.SIGNING_KEY  # the forked extenders'
    cfg = load_config(None, environ={"TANDEM__LOGGING__LEVEL": "warning",
                                     "TANDEM__HANDOFF__MODE": "env"})
    rng = random.Random(42)
    return cfg, rng, world.placed_pods(rng)


def compare_orders(argv: list[str] | None = None) -> None:
    """Both bind orders, the trivial extender and the floor, interleaved per repeat
    (``--compare-orders``: the comparison of #40's bind order)."""
    from benchmarks import extender_latency as world
    from benchmarks import record_burst, trivial_extender
    from lab.fakes import kube_api as fake_kube_api

    parser = argparse.ArgumentParser(description=compare_orders.__doc__)
    parser.add_argument("--pods", type=int, default=416, help="pods per server and repeat")
    parser.add_argument("--single", type=int, default=96, help="of them bound one at a time")
    parser.add_argument("--concurrency", type=int, default=16, help="binds in flight")
    parser.add_argument("--repeats", type=int, default=3)
    _common.add_out_option(parser, "scheduler_pattern_orders")
    opts = parser.parse_args(argv)
    load_before = _common.load_average()
    cfg, rng, placed = _setting()
    jobs = world.workload(rng, world.node_names(), opts.pods, "pat")

    def one(name: str) -> dict[str, Any]:
        api = world.fake_api(placed, jobs)  # the placed pods' records seeded
        api_port, _, api_stop = world.serve_in_child(lambda: (api.start(), api.stop))
        try:
            if name in ORDERS:
                starter = world.tandem_starter(
                    cfg, lambda: ORDERS[name](world.kube_client(api_port)))
            else:
                def starter() -> tuple[int, Callable[[], None]]:
                    return trivial_extender.serve(trivial_extender.create_trivial_app(
                        trivial_extender.kube_client(api_port)), cfg.server.threads)
            port, _, stop = world.serve_in_child(starter)
            try:
                return measure(lambda: RawClient(port), list(jobs), opts.concurrency,
                               opts.single)
            finally:
                stop()
        finally:
            api_stop()

    def api_part(order: str) -> dict[str, Any]:
        """The bind path's API part alone (``KubeSource.bind`` in this process, the API
        server in its own): binds one at a time, then bursts of ``concurrency``."""
        c, n = opts.concurrency, opts.single
        api = fake_kube_api.FakeKubeApi([{"metadata": {"name": f"node-{i}"}} for i in range(c)],
                                        record_burst.pods([1], n, 1)
                                        + record_burst.pods([c], n // 4, c), record=False)
        api_port, _, api_stop = world.serve_in_child(lambda: (api.start(), api.stop))
        try:
            one_at_a_time = record_burst.measure(api_port, [1], n, 1, ORDERS[order])[1]
            bursts = record_burst.measure(api_port, [c], n // 4, c, ORDERS[order])[c]
        finally:
            api_stop()
        return {"single": {"bind_ms": one_at_a_time["bind_ms"]},
                "burst": {"bind_ms": bursts["bind_ms"]}}

    runs, api_runs = [], []
    for _ in range(opts.repeats):
        api_runs.append({order: api_part(order) for order in ORDERS})
        run = {name: one(name) for name in (*ORDERS, "trivial")}
        port, stop = serve_floor(cfg.server.threads)
        try:
            run["floor"] = measure(lambda port=port: RawClient(port), list(jobs),
                                   opts.concurrency, opts.single)
        finally:
            stop()
        runs.append(run)
    per_run = [{order: checks({"kube": run[order], "trivial": run["trivial"],
                               "floor": run["floor"]}, PATTERN_GOALS) for order in ORDERS}
               for run in runs]
    bind_ms = {order: {kind: {q: round(statistics.median(
        r[order][kind]["bind_ms"][q] for r in runs), 3) for q in ("p50", "p90")}
        for kind in ("single", "burst")} for order in ORDERS}
    doc = {"benchmark": "scheduler_pattern", "pods": opts.pods, "single_pods": opts.single,
           "binding_first_over_record_first": paired(runs),
           "bind_path_api_part": {
               "what": "KubeSource.bind alone against the loopback API server: --single "
                       "binds one at a time, then --single/4 bursts of --concurrency binds "
                       "over as many nodes",
               "binding_first_over_record_first": paired(api_runs, PAIRED_BINDS),
               "runs": api_runs},
           "concurrency": opts.concurrency, "repeats": opts.repeats, "goals": PATTERN_GOALS,
           "cluster": "extender_latency.py's: 1,000 nodes x 8 A100-40GB, 8,000 bound pods "
                      "with their placement records, 500 candidates per filter",
           "server": "each extender and the loopback API server in a process of its own",
           "bind_ms_median_of_repeats": bind_ms,
           "checks_median": {order: {k: round(statistics.median(c[order][k] for c in per_run), 3)
                                     for k, v in per_run[0][order].items()
                                     if isinstance(v, float)} for order in ORDERS},
           "checks_per_run": per_run, "runs": runs, "load_average_1_5_15_at_start": load_before,
           **_common.context(("cheroot", "kubernetes", "urllib3"))}
    _common.write_result(doc, opts.out)


def median_interval(values: list[float]) -> dict[str, Any]:
    """The median with a distribution-free 95% interval: the order statistics the binomial
    puts at least 95% around it (6 values or more; fewer give none)."""
    n, ordered = len(values), sorted(values)
    k, below = 0, 0.0  # k values left out on each side, below: P(Binomial(n, 1/2) < k)
    while below + math.comb(n, k) / 2 ** n <= 0.025:
        below += math.comb(n, k) / 2 ** n
        k += 1
    return {"median": round(statistics.median(values), 3),
            "interval_95": [round(ordered[k - 1], 3), round(ordered[n - k], 3)] if k else None,
            "values": [round(v, 3) for v in values]}


SERVERS = ("tandem", "trivial", "floor")


def latency_checks(runs: list[dict[str, dict]]) -> dict[str, Any]:
    """Per server the burst/single bind p50 ratio, and tandem's pods/s over the trivial
    extender's (paired: both in the same repeat), as medians with 95% intervals."""
    out: dict[str, Any] = {}
    for name in SERVERS:
        out[f"{name}_burst_bind_p50_vs_single"] = median_interval(
            [r[name]["burst"]["bind_ms"]["p50"] / r[name]["single"]["bind_ms"]["p50"]
             for r in runs])
    for base in ("trivial", "floor"):
        out[f"tandem_pipeline_pods_per_second_vs_{base}"] = median_interval(
            [r["tandem"]["pipeline"]["pods_per_second"] / r[base]["pipeline"]["pods_per_second"]
             for r in runs])
    out["tandem_burst_bind_ok"] = out["tandem_burst_bind_p50_vs_single"]["median"] \
        <= PATTERN_GOALS["burst_bind_p50_vs_single"]
    out["tandem_pipeline_ok"] = out["tandem_pipeline_pods_per_second_vs_trivial"]["median"] \
        >= PATTERN_GOALS["pipeline_vs_trivial"]
    return out


def cpu_by_process(runs: list[dict[str, dict]]) -> dict[str, Any]:
    """Per server, medians over the repeats: each process's CPU (ms) and cores busy in a
    burst's window, and its CPU per pod over the pipelined loop and over one bind at a time.
    The extender's cores near 1 in the bursts with the others' far under the second core:
    the burst waits on the extender's one interpreter, not on the harness."""
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 2)
    out: dict[str, Any] = {}
    for name in SERVERS:
        mine = [r[name] for r in runs if r[name]["burst"].get("in_bursts")]
        if not mine:
            continue
        windows = [m["burst"]["in_bursts"] for m in mine]
        out[name] = {
            "burst_window_ms": med([w["wall_ms"] for w in windows]),
            "burst_cpu_ms": {k: med([w["cpu_ms"][k] for w in windows])
                             for k in windows[0]["cpu_ms"]},
            "burst_cores_busy": {k: med([w["cores_busy"][k] for w in windows])
                                 for k in windows[0]["cores_busy"]},
            **{f"{mode}_cpu_ms_per_pod": {k: med([m[mode]["cpu_ms_per_pod"][k] for m in mine])
                                          for k in mine[0][mode]["cpu_ms_per_pod"]}
               for mode in ("single", "pipeline")}}
    return out


def write_wait_in_burst(passes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per server and write latency L (against the pass without one): how much the burst
    bind p50 grew, in units of L. Binds that overlap their waits on the API server grow by
    about one L; binds serialised on it, by about half the burst's L's (8 of 16)."""
    base = next((p for p in passes if p["api_write_latency_ms"] == 0), None)
    out: dict[str, dict[str, float]] = {}
    for p in passes:
        latency = p["api_write_latency_ms"]
        if base is None or latency == 0:
            continue
        out[f"{latency:g}ms"] = {name: round(
            (p["bind_ms_median_of_repeats"][name]["burst"]["p50"]
             - base["bind_ms_median_of_repeats"][name]["burst"]["p50"]) / latency, 2)
            for name in SERVERS}
    return out


def main(argv: list[str] | None = None) -> None:
    """tandem, the trivial extender and the floor behind an API server whose writes wait
    each ``--api-latency-ms`` in turn, interleaved per repeat."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if "--compare-orders" in args:
        return compare_orders([a for a in args if a != "--compare-orders"])
    from benchmarks import extender_latency as world
    from benchmarks import trivial_extender
    from lab.fakes.kube_api import REAL_WRITE_LATENCY_S

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--api-latency-ms", type=float, nargs="+",
                        default=[0.0, 1000 * REAL_WRITE_LATENCY_S],
                        help="each write's wait on the loopback API server, one pass each "
                             "(default: none, and a real API server's with etcd on SSD)")
    parser.add_argument("--single", type=int, default=32, help="pods bound one at a time, "
                        "per server and repeat")
    parser.add_argument("--burst", type=int, default=64, help="pods bound in bursts of "
                        "--concurrency, per server and repeat; as many pipelined")
    parser.add_argument("--concurrency", type=int, default=16, help="binds in flight")
    parser.add_argument("--burst-filters", type=int, default=None,
                        help="filters the scheduling loop sends during each burst (default: "
                             "half of --concurrency; 0: the binds alone)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--compare-orders", action="store_true",
                        help="compare the two orders of a bind's writes instead (#40)")
    _common.add_out_option(parser, "scheduler_pattern")
    opts = parser.parse_args(args)
    load_before = _common.load_average()
    cfg, rng, placed = _setting()
    per_repeat = opts.single + 2 * opts.burst
    jobs = world.workload(rng, world.node_names(), per_repeat * opts.repeats, "pat")

    def api_server(latency_s: float) -> tuple[int, Callable[[], None]]:
        api = world.fake_api(placed, jobs)
        api.write_latency_s = latency_s
        port, _, stop = world.serve_in_child(lambda: (api.start(), api.stop))
        return port, stop

    passes = []
    for latency_ms in opts.api_latency_ms:
        latency_s = latency_ms / 1000
        stops: list[Callable[[], None]] = []
        try:
            api_port, api_stop = api_server(latency_s)
            stops.append(api_stop)
            port, _, stop = world.serve_in_child(world.tandem_starter(
                cfg, lambda port=api_port: KubeSource(world.kube_client(port))))
            stops.append(stop)
            ports, apis = {"tandem": port}, {"tandem": api_port}
            api_port, api_stop = api_server(latency_s)
            apis["trivial"] = api_port
            stops.append(api_stop)

            def trivial(port: int = api_port) -> tuple[int, Callable[[], None]]:
                return trivial_extender.serve(trivial_extender.create_trivial_app(
                    trivial_extender.kube_client(port)), cfg.server.threads)
            ports["trivial"], _, stop = world.serve_in_child(trivial)
            stops.append(stop)
            ports["floor"], _, stop = world.serve_in_child(
                lambda latency_s=latency_s: serve_floor(cfg.server.threads, latency_s))
            stops.append(stop)
            pids = world.SERVER_PIDS
            meters = {name: CpuMeter({"extender": pids[ports[name]], **(
                {"api_server": pids[apis[name]]} if name in apis else {})}) for name in SERVERS}
            runs = []
            for r in range(opts.repeats):
                mine = jobs[r * per_repeat:(r + 1) * per_repeat]
                order = SERVERS if r % 2 == 0 else SERVERS[::-1]  # neither always first
                runs.append({name: measure(lambda p=ports[name]: RawClient(p), list(mine),
                                           opts.concurrency, opts.single, meters[name],
                                           opts.burst_filters)
                             for name in order})
        finally:
            for stop in reversed(stops):
                stop()
        passes.append({"api_write_latency_ms": latency_ms, "checks": latency_checks(runs),
                       "cpu_by_process": cpu_by_process(runs),
                       "bind_ms_median_of_repeats": {name: {kind: {q: round(statistics.median(
                           r[name][kind]["bind_ms"][q] for r in runs), 3) for q in ("p50", "p90")}
                           for kind in ("single", "burst")} for name in SERVERS},
                       "runs": runs})
    doc = {"benchmark": "scheduler_pattern", "goals": PATTERN_GOALS,
           "write_wait_in_burst": write_wait_in_burst(passes),
           "api_write_latency": "every write (any verb but GET) to the loopback API server "
                                "waits this long before it is applied and answered; the floor "
                                "waits it once per bind (lab/fakes/kube_api.py "
                                "REAL_WRITE_LATENCY_S cites the realistic figure)",
           "per_repeat": {"single": opts.single, "burst": opts.burst, "pipeline": opts.burst},
           "concurrency": opts.concurrency, "repeats": opts.repeats,
           "burst_filters": opts.concurrency // 2 if opts.burst_filters is None
           else opts.burst_filters,
           "order": "the three servers measured one after the other in each repeat, the order "
                    "reversed every other repeat; ratios are per repeat, then median and a "
                    "distribution-free 95% interval",
           "cluster": "extender_latency.py's: 1,000 nodes x 8 A100-40GB, 8,000 bound pods "
                      "with their placement records, 500 candidates per filter",
           "server": "each extender and each loopback API server in a process of its own",
           "cpu_by_process": "CPU time (utime + stime from /proc) of the scheduler (this "
                             "process: the load generator), the extender and its API server "
                             "(benchmarks/process_cpu.py): in the bursts' windows (release to "
                             "last answer) and per pod over single and pipeline",
           "passes": passes, "load_average_1_5_15_at_start": load_before,
           **_common.context(("cheroot", "kubernetes", "urllib3"))}
    _common.write_result(doc, opts.out)
    return None


if __name__ == "__main__":
    main()
