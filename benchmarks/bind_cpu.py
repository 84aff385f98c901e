"""Where the extender process's CPU goes per pod under kube-scheduler's pattern.

tandem over its ``kube`` source runs in a process of its own, behind the loopback API
server of ``scheduler_pattern.py`` (writes wait ``--api-latency-ms``); this process is
the scheduler and runs the pipelined loop (filter and prioritize one pod after another,
each bind handed to ``--concurrency`` binders) on ``--pods`` pods. The extender measures
itself: each thread's CPU time from the moment it serves until every record is written,
every event posted and the watch has seen every bound pod, grouped by what the thread
does (the pod watch, the record writers, the event worker, the HTTP workers), and, inside
the HTTP workers, each verb's CPU time (``time.thread_time`` around the WSGI call: the
verb with its JSON), the rest of those threads being cheroot's own request handling.
Figures are microseconds per pod; thread CPU time is not stretched by other processes'
load, so it can be compared across runs on a busy machine. ``bind_path_us`` is what a
bound pod costs beyond its filter and prioritize: the bind verb, cheroot's share of the
bind request (a third of the workers' own time) and the background work a bind causes.

``--against TREE`` measures another checkout (same ``create_app``/``KubeSource``) in a
child process, interleaved with this one ``--repeats`` times, and reports the paired
ratios. ``--profile N`` adds the N costliest functions by own time over every thread
(cProfile of thread CPU time per thread; profiling slows everything about 2x, so its run
is separate; ``BIND_CPU_PROFILE_DUMP=PATH`` also writes the merged pstats file), and
``--parts module:Class.method ...`` each named function's thread CPU time.

    .venv/bin/python benchmarks/bind_cpu.py [--against TREE] [--pods N] [--repeats N]
        [--api-latency-ms MS] [--concurrency N] [--profile N]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common  # first: the import-path guard (a child puts its checkout before it)

HERE = Path(__file__).resolve().parent
VERBS = ("/filter", "/prioritize", "/bind")
SETTLE_SECONDS = 20.0
"""Longest the extender waits for its background work to finish before it is measured."""


def _group(name: str) -> str:
    """A thread's part, from its name (numbers dropped: one part per kind of thread)."""
    if name.startswith("CP Server Thread"):
        return "http_workers"
    return re.sub(r"[-_ ]?\d+$", "", name) or "unnamed"


def _thread_cpu() -> dict[int, tuple[str, float]]:
    out = {}
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            out[t.ident] = (t.name, time.clock_gettime(time.pthread_getcpuclockid(t.ident)))
        except (OSError, ProcessLookupError):  # ended meanwhile
            continue
    return out


class VerbMeter:
    """WSGI middleware: each verb's thread CPU time, the body's encoding included."""

    def __init__(self, app: Any):
        self.app = app
        self.cpu: dict[str, float] = {v: 0.0 for v in VERBS}
        self.calls: dict[str, int] = {v: 0 for v in VERBS}
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list:
        began = time.thread_time()
        body = list(self.app(environ, start_response))
        spent = time.thread_time() - began
        path = environ.get("PATH_INFO", "")
        if path in self.cpu:
            with self._lock:
                self.cpu[path] += spent
                self.calls[path] += 1
        return body


class PartMeter:
    """Thread CPU time inside named functions (``module:Class.method``), wrapped in place;
    a call nested in another wrapped one counts in both."""

    def __init__(self, names: list[str]):
        import importlib

        self.cpu: dict[str, float] = {}
        for name in names:
            module, _, attr = name.partition(":")
            owner: Any = importlib.import_module(module)
            *path, last = attr.split(".")
            for part in path:
                owner = getattr(owner, part)
            raw = vars(owner).get(last)
            setattr(owner, last, staticmethod(self._wrap(name, raw.__func__))
                    if isinstance(raw, staticmethod) else self._wrap(name, getattr(owner, last)))
            self.cpu[name] = 0.0

    def _wrap(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        cpu = self.cpu

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.thread_time()
            try:
                return func(*args, **kwargs)
            finally:
                cpu[name] += time.thread_time() - began
        return timed


class ThreadProfiles:
    """A cProfile of thread CPU time per thread started after :meth:`install` (every thread's
    bootstrap wrapped: cheroot's workers override ``run``), merged by :meth:`top`."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []

    def install(self) -> None:
        inner, profiles = threading.Thread._bootstrap_inner, self.profiles  # type: ignore[attr-defined]

        def profiled(thread: threading.Thread) -> None:
            profile = cProfile.Profile(time.thread_time)
            profiles.append(profile)
            profile.enable()
            try:
                inner(thread)
            finally:
                profile.disable()
        threading.Thread._bootstrap_inner = profiled  # type: ignore[attr-defined]

    def dump(self, path: str) -> None:
        """The merged profile as a pstats file."""
        pstats.Stats(*self.profiles, stream=io.StringIO()).dump_stats(path)

    def top(self, n: int, pods: int, key: int = 2) -> list[str]:
        """The ``n`` functions of most own time (``key`` 3: cumulative), in microseconds
        per pod."""
        stats = pstats.Stats(*self.profiles, stream=io.StringIO())
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][key])[:n]  # type: ignore[attr-defined]
        return [f"{1e6 * tt / pods:8.1f} us own {1e6 * ct / pods:8.1f} us cum  {nc / pods:6.1f}"
                f" calls  {_common.scrubbed(f'{file}:{line}')} {func}"
                for (file, line, func), (_, nc, tt, ct, _) in rows]


def _settled(source: Any, bound: set[str]) -> bool:
    """Every record written, every event posted, every bound pod confirmed by the watch."""
    state = source._state
    ledger = state._parts(state.now())[1]
    confirmed = all(ledger.get(u) is not None and ledger.get(u, True) is None for u in bound)
    return source.record_writer.pending() == 0 and source._events._events.qsize() == 0 \
        and confirmed


def _starter(cfg: Any, api_port: int, profile: int, out: str, parts: list[str],
             ) -> Callable[[], tuple[int, Callable[[], None]]]:
    from benchmarks import extender_latency as world
    from extender.cluster.kube import KubeSource
    from extender.config.loader import ConfigHolder
    from extender.transport.server import start_background
    from extender.wiring import create_app

    def start() -> tuple[int, Callable[[], None]]:
        meter_parts = PartMeter(parts)
        profiles = ThreadProfiles()
        if profile:
            profiles.install()
        source = KubeSource(world.kube_client(api_port))
        meter = VerbMeter(create_app(ConfigHolder(cfg), source))
        server = start_background(meter, cfg.server, port=0)
        before = _thread_cpu()
        meter_parts.cpu.update(dict.fromkeys(meter_parts.cpu, 0.0))  # not the sync's
        process_before = time.process_time()

        def stop() -> None:
            with open(out + ".bound") as f:
                uids = set(json.load(f))
            deadline = time.monotonic() + SETTLE_SECONDS
            while not _settled(source, uids) and time.monotonic() < deadline:
                time.sleep(0.05)
            settled = _settled(source, uids)
            time.sleep(0.2)  # the last post's answer read, the worker back to waiting
            after, process = _thread_cpu(), time.process_time() - process_before
            parts: dict[str, float] = {}
            for ident, (name, cpu) in after.items():
                group = _group(name)
                parts[group] = parts.get(group, 0.0) + cpu - before.get(ident, ("", 0.0))[1]
            result = {"settled": settled, "process_cpu_s": process, "threads_cpu_s": parts,
                      "verbs_cpu_s": meter.cpu, "verb_calls": meter.calls,
                      "parts_cpu_s": meter_parts.cpu}
            server.stop()
            source.stop()
            if profile:
                result["profile_top"] = profiles.top(profile, max(1, len(uids)))
                result["profile_top_cumulative"] = profiles.top(profile, max(1, len(uids)), 3)
                if os.environ.get("BIND_CPU_PROFILE_DUMP"):
                    profiles.dump(os.environ["BIND_CPU_PROFILE_DUMP"])
            with open(out, "w") as f:
                json.dump(result, f)
        return server.port, stop
    return start


def _per_pod(raw: dict[str, Any], pods: int) -> dict[str, Any]:
    """Microseconds per pod by part, from the extender's own figures."""
    us = {k: round(1e6 * v / pods, 1) for k, v in raw["threads_cpu_s"].items()
          if 1e6 * v / pods >= 0.5}
    verbs = {k.strip("/"): round(1e6 * v / pods, 1) for k, v in raw["verbs_cpu_s"].items()}
    workers = us.get("http_workers", 0.0)
    cheroot = round(workers - sum(verbs.values()), 1)
    background = sum(v for k, v in us.items() if k.startswith(("tandem-watch-pods",
                                                               "tandem-records",
                                                               "tandem-events")))
    bind_path = verbs["bind"] + cheroot / 3 + background
    return {"process_us": round(1e6 * raw["process_cpu_s"] / pods, 1), "threads_us": us,
            # the filter verb's code is the same in both trees: a ratio to it takes out
            # how fast the shared cores ran during the run
            "bind_path_over_filter": round(bind_path / verbs["filter"], 3),
            "verbs_us": verbs, "cheroot_us": cheroot,
            "parts_us": {k: round(1e6 * v / pods, 1) for k, v in raw["parts_cpu_s"].items()},
            "bind_path_us": round(bind_path, 1),
            "settled": raw["settled"], **{k: v for k, v in raw.items() if k.startswith("profile")}}


def measure(opts: argparse.Namespace) -> dict[str, Any]:
    """One run on the checkout this process imports: the extender's CPU per pod by part."""
    from benchmarks import extender_latency as world
    from benchmarks import scheduler_pattern as pattern

    cfg, rng, placed = pattern._setting()
    jobs = world.workload(rng, world.node_names(), opts.pods, "cpu")
    api = world.fake_api(placed, jobs)
    api.write_latency_s = opts.api_latency_ms / 1000
    api_port, _, api_stop = world.serve_in_child(lambda: (api.start(), api.stop))
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        with open(out + ".bound", "w") as f:
            json.dump([pod["metadata"]["uid"] for pod, _ in jobs], f)
        port, _, stop = world.serve_in_child(_starter(cfg, api_port, opts.profile, out,
                                                      opts.parts))
        try:
            run = pattern.pipeline(lambda: pattern.RawClient(port), jobs, opts.concurrency)
        finally:
            stop()
        with open(out) as f:
            raw = json.load(f)
    finally:
        api_stop()
        for path in (out, out + ".bound"):
            if os.path.exists(path):
                os.remove(path)
    assert run["binds_ok"] == opts.pods, run
    return {"pods_per_second": run["pods_per_second"], **_per_pod(raw, opts.pods)}


def _child(tree: Path, opts: argparse.Namespace) -> dict[str, Any]:
    return _common.run_child(__file__, tree, [
        "--pods", str(opts.pods), "--concurrency", str(opts.concurrency),
        "--api-latency-ms", str(opts.api_latency_ms), "--profile", str(opts.profile),
        *(["--parts", *opts.parts] if opts.parts else [])])


FIGURES = {"process_us": ("process_us",), "bind_path_us": ("bind_path_us",),
           "bind_path_over_filter": ("bind_path_over_filter",),
           "bind_verb_us": ("verbs_us", "bind"), "cheroot_us": ("cheroot_us",)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout measured in the same run")
    parser.add_argument("--pods", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16, help="binds in flight")
    parser.add_argument("--api-latency-ms", type=float, default=5.0,
                        help="each write's wait on the loopback API server")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0,
                        help="also list this many functions of most own time")
    parser.add_argument("--parts", nargs="+", default=[],
                        help="also time these functions (module:Class.method)")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    _common.add_out_option(parser, "bind_cpu")
    opts = parser.parse_args(argv)
    if opts.child is not None:
        sys.path.insert(0, str(opts.child))
        result = measure(opts)
        print(json.dumps(result))
        return result
    from benchmarks.scheduler_pattern import branch_over_against

    load_before = _common.load_average()
    runs = _common.interleaved(opts.against, opts.repeats, lambda tree: _child(tree, opts))
    doc = {"benchmark": "bind_cpu", "pods": opts.pods, "concurrency": opts.concurrency,
           "api_write_latency_ms": opts.api_latency_ms, "repeats": opts.repeats,
           "median_over_repeats": {label: {name: round(statistics.median(
               _value(r, path) for r in rs), 3) for name, path in FIGURES.items()}
               for label, rs in runs.items()},
           **branch_over_against(runs, FIGURES),
           "runs": runs, "load_average_1_5_15_at_start": load_before,
           **_common.context(("cheroot", "kubernetes"))}
    _common.write_result(doc, opts.out)
    return doc


def _value(run: dict[str, Any], path: tuple[str, ...]) -> float:
    for key in path:
        run = run[key]
    return float(run)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
