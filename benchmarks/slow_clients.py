"""A server's answer times while slow clients hold connections (a bounded slow-loris).

Starts the ``--target`` on loopback: the extender (cheroot, ``server.threads``
workers, ``sim:`` source with 4 nodes; the default), the inference server (sim
executor, ``--threads`` workers) or the session proxy in front of one, and
opens ``--slow`` connections that each send a request head one byte every
``--interval`` seconds. Meanwhile one client calls ``/livez`` and ``/filter``
(inference server: ``GET /v1/sessions``; session proxy: ``/readyz``)
``--requests`` times each, one at a time, each on a new connection
(as a health checker does) or, with ``--keep-alive``, on one, and reports p50,
p99 and max per endpoint plus how many calls did not answer within ``--timeout``
seconds. Loopback only; every connection is closed at the end.

Every target by default, one result with the machine details
(``benchmarks/results/slow_clients.json``); goal: every endpoint's p99 within
10 ms and no call missed.

    python benchmarks/slow_clients.py --slow 32 --interval 1 --requests 300 --keep-alive
    python benchmarks/slow_clients.py --target session --slow 32 --threads 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _common
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tests"))  # the slow-loris and the loopback servers of the tests
from extender_builders import node, training  # noqa: E402
from slow_loris import SlowClients  # noqa: E402

from extender.cluster.sim import SimSource  # noqa: E402
from extender.config.loader import ConfigHolder  # noqa: E402
from extender.config.schema import build_config  # noqa: E402
from extender.transport.server import start_background  # noqa: E402
from extender.wiring import create_app  # noqa: E402


def summary(times: list[float], missed: int) -> dict[str, float | int]:
    """p50/p99/max in milliseconds, and the calls that did not answer in time."""
    if not times:
        return {"answered": 0, "missed": missed}
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"answered": len(times), "missed": missed,
            "p50_ms": round(statistics.median(ordered) * 1e3, 3),
            "p99_ms": round(p99 * 1e3, 3), "max_ms": round(ordered[-1] * 1e3, 3)}


TARGETS = ("extender", "inference", "session")


def main(argv: list[str] | None = None) -> dict:
    """Measure each target, print one JSON object and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=32)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--keep-alive", action="store_true")
    parser.add_argument("--target", choices=(*TARGETS, "all"), default="all")
    _common.add_out_option(parser, "slow_clients")
    opts = parser.parse_args(argv)
    targets = TARGETS if opts.target == "all" else (opts.target,)
    result = {"benchmark": "slow_clients",
              "setup": {"slow_clients": opts.slow, "interval_s": opts.interval,
                        "requests_per_endpoint": opts.requests, "threads": opts.threads,
                        "timeout_s": opts.timeout, "keep_alive": opts.keep_alive},
              "targets": {t: measure_extender(opts) if t == "extender"
                          else measure_agent_side(opts, t) for t in targets}}
    result["goal_p99_ms"] = GOAL_P99_MS
    result["goal_met"] = all(
        e.get("missed", 1) == 0 and e.get("p99_ms", float("inf")) <= GOAL_P99_MS
        for r in result["targets"].values() for e in r.values() if isinstance(e, dict))
    result.update(_common.context(("httpx", "cheroot", "flask")))
    _common.write_result(result, opts.out)
    return result


GOAL_P99_MS = 10.0
"""Every endpoint answers within this at p99 while the slow clients hold connections."""


def measure_extender(opts: argparse.Namespace) -> dict:
    """The extender (``sim:`` source, 4 nodes): ``/livez`` and ``/filter``."""
    cfg = build_config({"server": {"host": "127.0.0.1", "threads": opts.threads}})
    app = create_app(ConfigHolder(cfg), SimSource([node(f"n{i}") for i in range(4)]))
    running = start_background(app, cfg.server, port=0)
    body = {"Pod": training("p"), "NodeNames": [f"n{i}" for i in range(4)]}
    results: dict[str, tuple[list[float], int]] = {"livez": ([], 0), "filter": ([], 0)}
    budget = opts.requests * opts.timeout * 2 + 10
    client = httpx.Client(timeout=opts.timeout) if opts.keep_alive else None
    try:
        with SlowClients(running.port, opts.slow, opts.interval, min(budget, 60.0)) as slow:
            for _ in range(opts.requests):
                for name in results:
                    start = time.perf_counter()
                    try:
                        call = client or httpx
                        if name == "livez":
                            call.get(f"{running.url}/livez", timeout=opts.timeout)
                        else:
                            call.post(f"{running.url}/filter", json=body, timeout=opts.timeout)
                        results[name][0].append(time.perf_counter() - start)
                    except httpx.HTTPError:
                        times, missed = results[name]
                        results[name] = (times, missed + 1)
            dropped = slow.dropped
    finally:
        if client is not None:
            client.close()
        running.stop()
    return {"slow_clients_dropped": dropped,
            **{f"/{name}": summary(*r) for name, r in results.items()}}


def measure_agent_side(opts: argparse.Namespace, target: str) -> dict:
    """The inference server (sim executor), or the session proxy in front of it."""
    import dataclasses
    import threading

    from agent.inference.http.serve import ServeOptions, http_server
    from agent.session.http import ProxyConfig, ProxyServer
    from agent.session.proxy import SessionLink
    from lab.fakes.session_upstream import SLO, Loopback, Upstream

    upstream = Upstream()
    stops = [upstream.runtime.stop]
    if target == "inference":
        fields = {f.name: None for f in dataclasses.fields(ServeOptions)}
        server = http_server(upstream.app, ServeOptions(**{
            **fields, "host": "127.0.0.1", "port": 0, "http_threads": opts.threads,
            "max_body_bytes": 1 << 20, "read_deadline_seconds": 30.0}))
        server.prepare()
        threading.Thread(target=server.serve, daemon=True).start()
        port, paths = int(server.bind_addr[1]), ("/livez", "/v1/sessions")
        stops.insert(0, server.stop)
    else:
        backend = Loopback(upstream)
        proxy = ProxyServer(SessionLink(backend.url, SLO), ProxyConfig(
            listen_host="127.0.0.1", listen_port=0, http_threads=opts.threads,
            shutdown_delay_seconds=0, deregister=False))
        proxy.start()
        port, paths = proxy.port, ("/livez", "/readyz")
        stops[:0] = [proxy.shutdown, backend.stop]
    results: dict[str, tuple[list[float], int]] = {p: ([], 0) for p in paths}
    budget = opts.requests * opts.timeout * 2 + 10
    try:
        with SlowClients(port, opts.slow, opts.interval, min(budget, 60.0)) as slow, \
                httpx.Client(timeout=opts.timeout) as client:
            for _ in range(opts.requests):
                for path in paths:
                    start = time.perf_counter()
                    try:
                        (client if opts.keep_alive else httpx).get(
                            f"http://127.0.0.1:{port}{path}", timeout=opts.timeout)
                        results[path][0].append(time.perf_counter() - start)
                    except httpx.HTTPError:
                        results[path] = (results[path][0], results[path][1] + 1)
            dropped = slow.dropped
    finally:
        for stop in stops:
            stop()
    return {"slow_clients_dropped": dropped, **{path: summary(*r) for path, r in results.items()}}


if __name__ == "__main__":
    main()
