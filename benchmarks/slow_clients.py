"""The extender's answer times while slow clients hold connections (a bounded slow-loris).

Starts the extender on loopback (cheroot, ``server.threads`` workers, ``sim:`` source
with 4 nodes) and opens ``--slow`` connections that each send a request head one
byte every ``--interval`` seconds. Meanwhile one client calls ``/livez`` and
``/filter`` ``--requests`` times each, one at a time, each on a new connection
(as a health checker does) or, with ``--keep-alive``, on one, and reports p50,
p99 and max per endpoint plus how many calls did not answer within ``--timeout``
seconds. Loopback only; every connection is closed at the end.

    python benchmarks/slow_clients.py --slow 32 --interval 1 --requests 500
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

# benchmarks/ holds predictor.py: replace the script's own directory on the path.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:1] = [str(ROOT), str(ROOT / "tests")]
from extender_builders import node, training  # noqa: E402
from slow_clients import SlowClients  # noqa: E402

from extender.config import ConfigHolder, build_config  # noqa: E402
from extender.routes import create_app  # noqa: E402
from extender.server import start_background  # noqa: E402
from extender.sim_cluster import SimSource  # noqa: E402


def summary(times: list[float], missed: int) -> dict[str, float | int]:
    """p50/p99/max in milliseconds, and the calls that did not answer in time."""
    if not times:
        return {"answered": 0, "missed": missed}
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"answered": len(times), "missed": missed,
            "p50_ms": round(statistics.median(ordered) * 1e3, 3),
            "p99_ms": round(p99 * 1e3, 3), "max_ms": round(ordered[-1] * 1e3, 3)}


def main() -> None:
    """Run the measurement and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=32)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--keep-alive", action="store_true")
    opts = parser.parse_args()
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
    print(json.dumps({"slow_clients": opts.slow, "interval_s": opts.interval,
                      "threads": opts.threads, "keep_alive": opts.keep_alive,
                      "slow_clients_dropped": dropped,
                      **{name: summary(*r) for name, r in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
