"""A bound, not a product configuration: would serving binds from more than one process
bring the scheduler pattern's burst to at most 2x one bind (#40)?

``scheduler_pattern.py`` finds tandem's burst of 16 binds at 5 ms API writes 3.8-4.7x one
bind's p50, the trivial extender's 3.3-4.2x and the do-nothing floor's 1.4-1.8x: the binds
queue on one interpreter. Here each server also runs as ``--processes`` processes, each
with its own state built from the same loopback API server, and the load generator spreads
its connections over them round-robin (filter and prioritize go to the first). Two tandem
processes may give one GPU twice: the decisions are not the point, the waiting is. If even
the trivial extender served from several processes stays above 2x on this machine, no
split of tandem's binds across processes reaches the goal here either::

    .venv/bin/python benchmarks/bind_processes.py [--api-latency-ms 5] [--processes 2]
        [--repeats 6]

Per repeat, for each server (order reversed every other repeat), one process and then
``--processes`` processes, each on pods of their own: burst p50 over single-bind p50, as
``scheduler_pattern.measure`` takes them; median and distribution-free 95% interval.
"""

from __future__ import annotations

import argparse
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import _common  # first: the import-path guard

pattern = _common.sibling("scheduler_pattern")


def spread(ports: Sequence[int], make: Callable[[int], Any] = pattern.RawClient
           ) -> Callable[[], Any]:
    """A ``connect`` that opens each new connection on the next of ``ports`` in turn."""
    turn, lock = itertools.cycle(ports), threading.Lock()

    def connect() -> Any:
        with lock:
            port = next(turn)
        return make(port)
    return connect


def ratio(measured: dict[str, Any]) -> float:
    """Burst bind p50 over single bind p50."""
    return round(measured["burst"]["bind_ms"]["p50"] / measured["single"]["bind_ms"]["p50"], 3)


def main(argv: list[str] | None = None) -> None:
    """tandem and the trivial extender, one process and several, behind one API server each."""
    from benchmarks import extender_latency as world
    from benchmarks import trivial_extender
    from extender.cluster.kube import KubeSource

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--api-latency-ms", type=float, default=5.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--single", type=int, default=32)
    parser.add_argument("--burst", type=int, default=64)
    _common.add_out_option(parser, "bind_processes")
    opts = parser.parse_args(argv)
    load_before = _common.load_average()
    cfg, rng, placed = pattern._setting()
    per_run = opts.single + 2 * opts.burst
    jobs = world.workload(rng, world.node_names(), per_run * opts.repeats * 2, "bp")
    stops: list[Callable[[], None]] = []

    def api_server() -> int:
        api = world.fake_api(placed, jobs)
        api.write_latency_s = opts.api_latency_ms / 1000
        port, _, stop = world.serve_in_child(lambda: (api.start(), api.stop))
        stops.append(stop)
        return port

    def servers(start: Callable[[], Any]) -> list[int]:
        ports = []
        for _ in range(opts.processes):
            port, _, stop = world.serve_in_child(start)
            stops.append(stop)
            ports.append(port)
        return ports

    try:
        tandem_api, trivial_api = api_server(), api_server()
        ports = {
            "tandem": servers(world.tandem_starter(
                cfg, lambda: KubeSource(world.kube_client(tandem_api)))),
            "trivial": servers(lambda: trivial_extender.serve(
                trivial_extender.create_trivial_app(trivial_extender.kube_client(trivial_api)),
                cfg.server.threads)),
        }
        ratios: dict[str, list[float]] = {}
        for r in range(opts.repeats):
            for name in ("tandem", "trivial") if r % 2 == 0 else ("trivial", "tandem"):
                for i, n in enumerate((1, opts.processes)):
                    first = (2 * r + i) * per_run
                    measured = pattern.measure(spread(ports[name][:n]),
                                               list(jobs[first:first + per_run]), 16,
                                               opts.single)
                    ratios.setdefault(f"{name}_{n}", []).append(ratio(measured))
    finally:
        for stop in reversed(stops):
            stop()
    doc = {"benchmark": "bind_processes",
           "what": "a bound, not a product configuration: binds spread round-robin over N "
                   "processes of each server, each with its own state from the same API "
                   "server (decisions may collide; only the waiting is measured)",
           "api_write_latency_ms": opts.api_latency_ms, "processes": opts.processes,
           "repeats": opts.repeats, "concurrency": 16,
           "burst_over_single_p50": {k: {"runs": v, **pattern.median_interval(v)}
                                     for k, v in ratios.items()},
           "goal": "burst bind p50 at most 2x one bind's (#40)",
           "load_average_1_5_15_at_start": load_before,
           **_common.context(("cheroot", "kubernetes", "urllib3"))}
    _common.write_result(doc, opts.out)


if __name__ == "__main__":
    main()
