"""Where a bind's CPU goes inside a burst of kube-scheduler's concurrent binds.

One extender (tandem over its ``kube`` source, the trivial extender, or the floor) runs in
a process of its own behind ``scheduler_pattern.py``'s loopback API server (every write
waits ``--api-latency-ms``). This process binds ``--single`` pods one at a time (filter,
prioritize, bind), then ``--bursts`` groups of ``--concurrency`` pods: filtered and
prioritized one after another, their binds then released at once with nothing beside
them. Around each release the extender reports, through a route of a wrapping WSGI app,
its process CPU (user, system), context switches, the API connections it opened (the
official client's and the lean client's) and the thread CPU inside the bind verb
(``bind_cpu.VerbMeter``) and inside named functions (``bind_cpu.PartMeter``). Figures are
per bind, in the bursts and one at a time; thread CPU is not stretched by other load.

Each thread's CPU is reported too, grouped by what the thread does (``thread:http_workers``:
cheroot's workers with the verbs they run; ``thread:tandem-watch-pods``: the pod watch; the
record writers and the event worker), so what a burst costs outside the bind verb shows.
``--parts`` names more of tandem's functions; ``--profile-dump PATH`` writes a cProfile of
every thread of tandem's process (thread CPU; profiling slows it, so not for the figures).

``tandem-unpaced`` is tandem with its pod watch reading on through a burst (as before
``BindTraffic.pace_watch``): beside ``tandem`` in the same repeats, what the pacing changes.
``tandem-writer`` is a prototype, not a product path: tandem with its Binding posted by a
helper process (``--writer-pipes`` pipes, a thread and the lean client on each), the bind
thread waiting on its pipe. Beside ``tandem`` in the same repeats, it says whether moving
the post off the extender's interpreter would shorten the burst. The servers run one after
the other in each repeat.

    .venv/bin/python benchmarks/burst_cpu.py [--servers tandem tandem-unpaced tandem-writer
        trivial floor] [--repeats 3] [--bursts 16] [--api-latency-ms 5] [--writer-pipes 16]
        [--parts module:Class.method ...] [--profile-dump PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import resource
import statistics
import threading
from collections.abc import Callable
from typing import Any

import _common  # first: the import-path guard

bind_cpu = _common.sibling("bind_cpu")
MARK = "/_burst_cpu"
COUNTS = ("voluntary_switches", "involuntary_switches", "connects")
"""Counters that are counts; the others are CPU seconds."""
PARTS = {"tandem": ["extender.service.verbs:Extender.bind",
                    "extender.service.verbs:Extender._assume",
                    "extender.service.verbs:Extender._pod_for",
                    "extender.cluster.kube:KubeSource.bind",
                    "extender.cluster.kube_http:LeanPoster.request"],
         "trivial": ["kubernetes.client.api.core_v1_api:CoreV1Api.create_namespaced_pod_binding",
                     "urllib3.connectionpool:HTTPConnectionPool.urlopen"],
         "floor": []}
PARTS["tandem-writer"] = PARTS["tandem-unpaced"] = PARTS["tandem"]


def _count_connects() -> list[int]:
    """Count every connection either API client opens in this process."""
    import urllib3.connection

    from extender.cluster import kube_http
    count = [0]
    for owner, name in ((urllib3.connection.HTTPConnection, "connect"),
                        (kube_http.LeanPoster, "_connect")):
        def counted(*args: Any, _inner: Callable[..., Any] = getattr(owner, name)) -> Any:
            count[0] += 1
            return _inner(*args)
        setattr(owner, name, counted)
    return count


class Reporter:
    """WSGI app: ``MARK`` answers the process's counters; anything else goes to ``app``."""

    def __init__(self, app: Any, parts: Any, connects: list[int]):
        self.verbs, self.parts, self.connects = bind_cpu.VerbMeter(app), parts, connects

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") != MARK:
            return self.verbs(environ, start_response)
        use = resource.getrusage(resource.RUSAGE_SELF)
        threads: dict[str, float] = {}
        for name, cpu in bind_cpu._thread_cpu().values():
            group = "thread:" + re.sub(r"[-_ ]?\d+", "", bind_cpu._group(name))
            threads[group] = threads.get(group, 0.0) + cpu
        data = json.dumps({**threads, "user": use.ru_utime, "system": use.ru_stime,
                           "voluntary_switches": use.ru_nvcsw,
                           "involuntary_switches": use.ru_nivcsw, "connects": self.connects[0],
                           "bind_verb": self.verbs.cpu["/bind"],
                           **{k.split(":")[1]: v for k, v in self.parts.cpu.items()}}).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(data)))])
        return [data]


class PipePoster:
    """The prototype: Binding posts handed to the writer process; anything else as before."""

    def __init__(self, pipes: list[Any], inner: Any):
        self.free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for pipe in pipes:
            self.free.put(pipe)
        self.inner = inner

    def post(self, path: str, body: bytes) -> bytes:
        """The Binding through a free pipe (the caller waits); other posts directly."""
        if not path.endswith("/binding"):
            return self.inner.post(path, body)
        pipe = self.free.get()
        try:
            pipe.send_bytes(path.encode() + b"\n" + body)
            answer = pipe.recv_bytes()
        finally:
            self.free.put(pipe)
        if answer[:1] != b"+":
            from kubernetes.client.rest import ApiException
            raise ApiException(status=int(answer[1:4]), reason="from the writer process")
        return answer[1:]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def writer_process(count: int, api_port: int) -> list[Any]:
    """Fork the writer: ``count`` pipes, each served by a thread posting with a lean client."""
    import multiprocessing.connection as mpc
    pairs = [mpc.Pipe() for _ in range(count)]
    if os.fork() != 0:
        for _, theirs in pairs:
            theirs.close()
        return [mine for mine, _ in pairs]
    try:  # the child never returns: its caller's code is the parent's
        from kubernetes import client

        from extender.cluster.kube_http import LeanPoster
        poster = LeanPoster(client.Configuration(host=f"http://127.0.0.1:{api_port}"), "writer")

        def serve(pipe: Any) -> None:
            while True:
                try:
                    path, _, body = pipe.recv_bytes().partition(b"\n")
                except EOFError:
                    return  # the extender ended
                try:
                    pipe.send_bytes(b"+" + poster.post(path.decode(), body))
                except Exception as exc:  # noqa: BLE001 - its status goes back to the bind
                    pipe.send_bytes(b"-%03d" % (getattr(exc, "status", None) or 500))
        for mine, _ in pairs:
            mine.close()
        threads = [threading.Thread(target=serve, args=(theirs,)) for _, theirs in pairs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os._exit(0)


def _starter(kind: str, cfg: Any, api_port: int, latency_s: float, writers: int,
             extra_parts: list[str], profile_dump: str | None,
             ) -> Callable[[], tuple[int, Callable[[], None]]]:
    from benchmarks import extender_latency as world
    from benchmarks import scheduler_pattern as pattern
    from benchmarks import trivial_extender

    def start() -> tuple[int, Callable[[], None]]:
        pipes = writer_process(writers, api_port) if kind == "tandem-writer" else None
        profiles = bind_cpu.ThreadProfiles()
        if profile_dump and kind.startswith("tandem"):
            profiles.install()  # every thread started from here on
        connects, parts = _count_connects(), bind_cpu.PartMeter(
            PARTS[kind] + (extra_parts if kind.startswith("tandem") else []))
        if kind.startswith("tandem"):
            from extender.cluster.kube import KubeSource
            from extender.config.loader import ConfigHolder
            from extender.transport.server import start_background
            from extender.wiring import create_app
            source = KubeSource(world.kube_client(api_port))
            if pipes:
                source._poster = PipePoster(pipes, source._poster)
            if kind == "tandem-unpaced":  # the pod watch reads on through a burst, as before
                source._traffic.pace_watch = lambda lag=0.0: None
            server = start_background(Reporter(create_app(ConfigHolder(cfg), source), parts,
                                                connects), cfg.server, port=0)

            def stop() -> None:
                server.stop()
                source.stop()
                if profile_dump:
                    profiles.dump(profile_dump)
            return server.port, stop
        if kind == "trivial":
            app: Any = trivial_extender.create_trivial_app(trivial_extender.kube_client(api_port))
        else:
            def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
                return pattern.floor_app(environ, start_response, latency_s)
        return trivial_extender.serve(Reporter(app, parts, connects), cfg.server.threads)
    return start


def _per_bind(before: dict[str, float], after: dict[str, float], binds: int,
              ) -> dict[str, float]:
    """Counters per bind between two reports: CPU in ms, counts as they are."""
    return {k: round((after.get(k, v) - v) / binds * (1 if k in COUNTS else 1000), 3)
            for k, v in before.items()}


def measure(kind: str, opts: argparse.Namespace) -> dict[str, Any]:
    """One extender: ``--single`` binds one at a time, then ``--bursts`` bursts."""
    from benchmarks import extender_latency as world
    from benchmarks import scheduler_pattern as pattern

    cfg, rng, placed = pattern._setting()
    c = opts.concurrency
    jobs = world.workload(rng, world.node_names(), 16 + opts.single + c * opts.bursts, "bc")
    api = world.fake_api(placed, jobs)
    api.write_latency_s = opts.api_latency_ms / 1000
    api_port, _, api_stop = world.serve_in_child(lambda: (api.start(), api.stop))
    try:
        port, _, stop = world.serve_in_child(_starter(
            kind, cfg, api_port, api.write_latency_s, opts.writer_pipes, opts.parts,
            opts.profile_dump))
        try:
            return _run(port, jobs, opts)
        finally:
            stop()
    finally:
        api_stop()


def _run(port: int, jobs: list[Any], opts: argparse.Namespace) -> dict[str, Any]:
    from benchmarks import scheduler_pattern as pattern

    c = opts.concurrency
    reporter = pattern.RawClient(port)

    def report() -> dict[str, float]:
        return json.loads(reporter.post(MARK, b"{}")[1])
    pattern.single(lambda: pattern.RawClient(port), jobs[:16])  # warm-up
    jobs = jobs[16:]
    before = report()
    single = pattern.single(lambda: pattern.RawClient(port), jobs[:opts.single])
    one_at_a_time = _per_bind(before, report(), opts.single)
    main = pattern.RawClient(port)
    binders = [pattern.Lazy(lambda: pattern.RawClient(port)) for _ in range(c)]
    latencies: list[float] = []
    totals: dict[str, float] = {}
    rest = jobs[opts.single:]
    for start in range(0, len(rest) - c + 1, c):
        group = rest[start:start + c]
        chosen = [pattern._schedule(main, job)[2] for job in group]
        gate = threading.Barrier(c + 1)

        def bind(i: int, gate: threading.Barrier = gate, group: list[Any] = group,
                 chosen: list[str] = chosen) -> None:
            gate.wait()
            latencies.append(pattern._bind(binders[i], group[i][0], chosen[i])[0])
        threads = [threading.Thread(target=bind, args=(i,)) for i in range(c)]
        for t in threads:
            t.start()
        first = report()
        gate.wait()
        for t in threads:
            t.join()
        last = report()
        for k, v in first.items():
            totals[k] = totals.get(k, 0) + last.get(k, v) - v
    for client in [main, reporter, *binders]:
        client.close()
    burst_p50 = pattern.ms(latencies, 50)
    return {"single_bind_p50_ms": single["bind_ms"]["p50"], "burst_bind_p50_ms": burst_p50,
            "burst_over_single": round(burst_p50 / single["bind_ms"]["p50"], 2),
            "per_bind_in_bursts": _per_bind(dict.fromkeys(totals, 0), totals, len(latencies)),
            "per_bind_one_at_a_time": {k: v for k, v in one_at_a_time.items()
                                       if k not in ("user", "system")}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Each server in turn, ``--repeats`` times; medians and every run."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--servers", nargs="+", default=["tandem", "trivial", "floor"],
                        choices=sorted(PARTS))
    parser.add_argument("--single", type=int, default=32)
    parser.add_argument("--bursts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16, help="binds in a burst")
    parser.add_argument("--api-latency-ms", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--writer-pipes", type=int, default=16,
                        help="tandem-writer's pipes to its writer process")
    parser.add_argument("--parts", nargs="+", default=[], metavar="module:Class.method",
                        help="more functions of tandem whose thread CPU is reported")
    parser.add_argument("--profile-dump", default=None, metavar="PATH",
                        help="write a cProfile (thread CPU, every thread) of tandem's process "
                        "as a pstats file (profiling slows it: not for the figures)")
    _common.add_out_option(parser, "burst_cpu")
    opts = parser.parse_args(argv)
    load_before = _common.load_average()
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in opts.servers}
    for _ in range(opts.repeats):
        for kind in opts.servers:
            runs[kind].append(measure(kind, opts))
    doc = {"benchmark": "burst_cpu", "api_write_latency_ms": opts.api_latency_ms,
           "concurrency": opts.concurrency, "bursts": opts.bursts, "single": opts.single,
           "writer_pipes": opts.writer_pipes, "repeats": opts.repeats,
           "medians": {kind: {
               "burst_over_single": statistics.median(r["burst_over_single"] for r in rs),
               "per_bind_in_bursts": {k: round(statistics.median(
                   r["per_bind_in_bursts"][k] for r in rs), 3)
                   for k in rs[0]["per_bind_in_bursts"]
                   if all(k in r["per_bind_in_bursts"] for r in rs)}}
               for kind, rs in runs.items()},
           "runs": runs, "load_average_1_5_15_at_start": load_before,
           **_common.context(("cheroot", "kubernetes", "urllib3"))}
    _common.write_result(doc, opts.out)
    return doc


if __name__ == "__main__":
    main()
