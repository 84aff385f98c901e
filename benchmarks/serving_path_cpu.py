"""Where the inference server's CPU goes per request, by thread and by function.

Run (CPU, about 2 minutes):
    .venv/bin/python benchmarks/serving_path_cpu.py
Against another checkout's server in the same run (the ratio per executor):
    .venv/bin/python benchmarks/serving_path_cpu.py --baseline PATH

For each executor (``sim``: the profiles slept on the real clock, so only the
request path uses CPU; ``onnxruntime`` on CPU) the server (``tandem agent serve``,
its own process, through ``path_cpu_harness.py``) registers the SLO trio
of ``serving_clients.py`` at the rates planned for it (the issue's 1.17 of one
executor, each capped at ``--max-rps``), with ``--slo-scale`` times its SLOs, no CPU
or worker limit on the request path and the executor planned at its profiles (the
harness lifts the host's measured limits), so all three are admitted whatever the
host's load and every request takes the full path. A client in
another process (``serving_clients.run_client``: Poisson, a connection per
request, its deadline sent) offers 90% of those rates for ``--seconds``.

Measured over the load window only (between two signals to the harness):

- ``cpu_ms_per_request``: the server process's utime + stime (``/proc``) over the
  requests answered, by thread (HTTP accept loop, HTTP workers, the executor loop,
  post-processing) and in all, and the same of an idle window of equal length
  before it (timers and polls: what the server costs without requests); the
  client process's too.
- ``functions`` (a second, profiled run): every thread under ``cProfile`` with a
  per-thread CPU clock, the window's own time per request of the top functions.
  The profiler slows Python several-fold, so these are shares, not the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
import onnx

from benchmarks.path_cpu_harness import OUT_ENV, PROFILE_ENV, group
from benchmarks.process_cpu import process_cpu_seconds
from benchmarks.serving_clients import OFFERED, SIM_PROFILES, TRIO, trio_bodies, trio_on
from benchmarks.serving_http import Server, client_records
from benchmarks.serving_ort import mlp

TOP = 25
PROFILED_SLO_SCALE = 5.0
"""The profiled run's SLOs over the measured run's (the profiler slows the calibration)."""


# --- the benchmark --------------------------------------------------------------------


class HarnessServer(Server):
    """``tandem agent serve`` through this file's harness."""

    def __init__(self, kind: str, store: Path, root: Path, extra: tuple[str, ...],
                 profile: bool, out: Path):
        # This tree's harness (a baseline checkout has none), the server's code from ``root``
        self.command = [sys.executable, str(_common.HERE / "path_cpu_harness.py")]
        self.env = {OUT_ENV: str(out), **({PROFILE_ENV: "1"} if profile else {})}
        super().__init__(kind, store, root, extra)


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of ``pid`` by thread id, from the scheduler's
    nanosecond count (``stat``'s ticks round each of dozens of threads)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except OSError:
            continue  # ended meanwhile
    return out


def measure(kind: str, root: Path, store: Path, extra: tuple[str, ...], bodies: list[dict],
            seconds: float, profile: bool) -> dict[str, Any]:
    """One server: an idle window, then the trio's load window; CPU per request."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "harness.json"
        server = HarnessServer(kind, store, root, extra, profile, out)
        try:
            registered = {}
            for b in bodies:
                status, answer = server.call("POST", "/v1/sessions",
                                             {k: v for k, v in b.items() if not k.startswith("_")})
                registered[b["name"]] = {"status": status, "slo_ms": b["slo_ms"],
                                         "rate_rps": b["rate_rps"],
                                         **({} if status == 201 else
                                            {"refusal": answer.get("reason")})}
            pid = server.proc.pid
            idle0, t0 = process_cpu_seconds(pid), time.monotonic()
            time.sleep(min(seconds, 5.0))
            idle_cpu, idle_wall = process_cpu_seconds(pid) - idle0, time.monotonic() - t0
            sessions = [{"name": b["name"], "shape": b["_shape"], "slo_ms": b["slo_ms"],
                         "rate": OFFERED * b["rate_rps"] if registered[b["name"]]["status"] == 201
                         else 0.0} for b in bodies]
            spec = {"port": server.port, "seconds": seconds, "sessions": sessions}
            threads0, cpu0 = thread_cpu(pid), process_cpu_seconds(pid)
            children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            server.proc.send_signal(signal.SIGUSR1)
            t0 = time.monotonic()
            records = client_records(str(_common.HERE / "serving_clients.py"), spec, seconds)
            wall = time.monotonic() - t0
            server.proc.send_signal(signal.SIGUSR1)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            threads1, cpu1 = thread_cpu(pid), process_cpu_seconds(pid)
            for _ in range(100):
                if out.exists():
                    break
                time.sleep(0.05)
            harness = json.loads(out.read_text())
        finally:
            server.stop()
    answered = len(records)
    if not answered:
        raise RuntimeError(f"no session of the trio admitted: {registered}")
    ok = sum(1 for r in records if r[1] == 200)
    names = {int(k): v for k, v in harness["threads"].items()}
    by_role: dict[str, float] = {}
    for tid, after in threads1.items():
        role = group(names.get(tid, ""))
        by_role[role] = by_role.get(role, 0.0) + after - threads0.get(tid, 0.0)
    idle_per_s = idle_cpu / idle_wall
    client_cpu = (children.ru_utime + children.ru_stime
                  - children0.ru_utime - children0.ru_stime)
    result: dict[str, Any] = {
        "registration": registered, "requests": answered, "ok_200": ok,
        "window_s": round(wall, 2), "requests_per_s": round(answered / wall, 1),
        "server_cpu_ms_per_request": round(1000 * (cpu1 - cpu0) / answered, 3),
        "server_cpu_ms_per_request_less_idle": round(
            1000 * (cpu1 - cpu0 - idle_per_s * wall) / answered, 3),
        "idle_server_cores": round(idle_per_s, 4),
        "server_cores": round((cpu1 - cpu0) / wall, 3),
        "by_thread_ms_per_request": {k: round(1000 * v / answered, 3)
                                     for k, v in sorted(by_role.items())},
        # utime + stime count the threads that ended in the window; /proc's at its end not
        "ended_threads_ms_per_request": round(
            1000 * (cpu1 - cpu0 - sum(by_role.values())) / answered, 3),
        "threads_started_in_window": harness["threads_started"],
        "client_cpu_ms_per_request": round(1000 * client_cpu / answered, 3),
    }
    if profile:
        functions = harness["functions"]
        if os.environ.get("TANDEM_PATH_CPU_TABLE"):  # every function, for a closer look
            Path(os.environ["TANDEM_PATH_CPU_TABLE"]).write_text(json.dumps(
                {k: [c / answered, 1000 * o / answered, 1000 * t / answered]
                 for k, (c, o, t) in functions.items()}))
        own = sum(v[1] for v in functions.values())
        top = sorted(functions.items(), key=lambda kv: -kv[1][1])[:TOP]
        result["profiled_own_ms_per_request"] = round(1000 * own / answered, 3)
        result["top_own_time"] = [
            {"function": k, "calls_per_request": round(c / answered, 2),
             "own_share": round(o / own, 4), "cumulative_share": round(t / own, 4)}
            for k, (c, o, t) in top]
        cumulative = sorted(functions.items(), key=lambda kv: -kv[1][2])[:TOP]
        result["top_cumulative"] = [{"function": k, "cumulative_share": round(t / own, 4)}
                                    for k, (_c, _o, t) in cumulative]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--executors", default="sim,onnxruntime")
    parser.add_argument("--demand", type=float, default=1.17)
    parser.add_argument("--max-rps", type=float, default=100.0)
    parser.add_argument("--slo-scale", type=float, default=20.0,
                        help="the trio's SLOs times this: all three admitted and served, "
                             "none shed (a shed request costs less than a served one)")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled runs")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout whose server runs the same load")
    parser.add_argument("--root", type=Path, default=_common.ROOT,
                        help="the checkout whose server is measured (default: this one)")
    _common.add_out_option(parser, "serving_path_cpu")
    args = parser.parse_args()
    started = time.perf_counter()
    out: dict[str, Any] = {"benchmark": "serving_path_cpu", "seconds": args.seconds,
                           "demand": args.demand, "max_rps": args.max_rps,
                           "slo_scale": args.slo_scale,
                           "offered": f"{OFFERED:.0%} of each registered rate"}
    trees = {"tree": args.root, **({"baseline": args.baseline} if args.baseline else {})}
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        for name, width, layers, *_ in TRIO:
            onnx.save(mlp(width, layers, seed=len(name) + layers), store / f"{name}.onnx")
        (store / "profiles.yaml").write_text(SIM_PROFILES)
        for kind in args.executors.split(","):
            extra, l1 = trio_on(kind, store)
            bodies = trio_bodies(l1, args.demand, args.max_rps)
            for b in bodies:
                b["slo_ms"] *= args.slo_scale
            out[kind] = {"batch1_ms": l1}
            for label, root in trees.items():
                row = {"cpu": measure(kind, root, store, extra, bodies, args.seconds, False)}
                if not args.no_profile:  # the profiler slows the start-up's path figures
                    slower = [{**b, "slo_ms": b["slo_ms"] * PROFILED_SLO_SCALE} for b in bodies]
                    row["profiled"] = measure(kind, root, store, extra, slower, args.seconds,
                                              True)
                out[kind][label] = row
                print(json.dumps({kind: {label: row["cpu"]}}), file=sys.stderr)
            if args.baseline:
                a, b = (out[kind][t]["cpu"]["server_cpu_ms_per_request"] for t in trees)
                out[kind]["tree_over_baseline"] = round(a / b, 3)
    for label, root in trees.items():
        head = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s"],
                              capture_output=True, text=True).stdout.strip()
        out[f"{label}_server"] = head or _common.scrubbed(str(root))
    out["wall_seconds"] = time.perf_counter() - started
    out.update(_common.context(("numpy", "onnxruntime", "cheroot", "flask")))
    _common.write_result(out, args.out)


if __name__ == "__main__":
    main()
