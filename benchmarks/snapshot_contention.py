"""Do agent reports, ``/v1/state`` reads and binds wait on filter? Two checkouts, one run.

One extender in this process over a ``sim:`` cluster of 1,000 nodes x 8 A100-40GB
with 8,000 placed pods (extender_latency.py's cluster), driven through its Flask
routes from threads: an agent thread posts a node's report every 5 ms (the agents
of 20 nodes in turn, each reported once before the clock starts: a node's first
report replaces its inventory, a rebuild of the whole table), a reader
thread asks ``/v1/state?node=`` every 5 ms, a binder binds a new pod every 20 ms,
each timed; for ``--seconds`` with nothing else running (``idle``), then as long
with ``--filters`` threads sending ``/filter`` with 500 candidate nodes back to
back (``busy``). The extender's own decisions are what is measured, not HTTP. Each
call's wall-clock time is kept with the CPU its thread spent (``cpu_*``), which
other processes' load does not change: the work a call does, apart from its waits.

``--against TREE`` runs the same program over another checkout (``PYTHONPATH``
set to it, e.g. an export of ``main``) in a child process, interleaved with this
checkout ``--repeats`` times, so both see the same machine load; the result holds
both and the ratios. Run only on a machine doing nothing else worth measuring:
threads of one process share the GIL, so waits on the GIL are in every figure
alike; a wait on the state's lock is in ``busy`` only.

    .venv/bin/python benchmarks/snapshot_contention.py [--against TREE] [--seconds S]
        [--repeats N] [--filters N]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import _common  # first: the import-path guard (a child puts its checkout before it)

HERE = Path(__file__).resolve().parent
NODES, GPUS, CANDIDATES = 1000, 8, 500
PRODUCT, MIB = "NVIDIA A100-SXM4-40GB", 40960.0
TOKEN = "bench-agent-token"
AGENTS = 20
"""Nodes whose agents report."""


def _measure(seconds: float, filters: int) -> dict:
    """Both phases on the checkout this process imports (``sys.path``)."""
    from extender.cluster.sim import SimSource
    from extender.config.loader import ConfigHolder, load_config
    from extender.core import GpuSpec, NodeSpec, Placement
    from extender.wiring import create_app

    rng = random.Random(42)
    names = [f"node-{i:04d}" for i in range(NODES)]
    nodes = [NodeSpec(n, tuple(GpuSpec(g, f"GPU-{i}-{g}", PRODUCT, MIB) for g in range(GPUS)))
             for i, n in enumerate(names)]
    source = SimSource(nodes)
    config = load_config(None, environ={"TANDEM__LOGGING__LEVEL": "warning",
                                        "TANDEM__HANDOFF__MODE": "env"})
    app = create_app(ConfigHolder(config), source, environ={"TANDEM_AGENT_TOKEN": TOKEN})
    ext = app.extensions["tandem"]
    for i, n in enumerate(names):
        for g in range(GPUS):
            ext.state.confirm(Placement(f"placed-{i}-{g}", f"bench/placed-{i}-{g}", n, (g,),
                                        rng.uniform(10, 70), float(rng.randrange(2000, 30000))))
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def pod(name: str) -> dict:
        return {"metadata": {"name": name, "namespace": "bench", "uid": name, "annotations": {
            "tandem.io/gpu-util": "20", "tandem.io/gpu-mem-mib": "1000"}},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"tandem.io/gpu": "1"}}}]}}

    def report(node: str) -> dict:
        i = names.index(node)
        return {"node": node, "timestamp": time.time(), "interval_seconds": 1.0,
                "gpus": [{"index": g, "uuid": f"GPU-{i}-{g}", "product": PRODUCT,
                          "memory_total_mib": MIB, "memory_used_mib": 5000,
                          "utilization_percent": 30.0, "processes": []} for g in range(GPUS)]}

    def timed(stop: threading.Event, period: float, call, out: list[tuple[float, float]],
              ) -> None:
        client = app.test_client()
        k = 0
        while not stop.is_set():
            started, cpu = time.perf_counter(), time.thread_time()
            call(client, k)
            out.append(((time.perf_counter() - started) * 1e3,
                        (time.thread_time() - cpu) * 1e3))
            k += 1
            stop.wait(max(0.0, period - (time.perf_counter() - started)))

    def agent(client, k):
        assert client.post("/v1/agents/report", json=report(names[k % AGENTS]),
                           headers=auth).status_code == 200

    def reader(client, k):
        assert client.get(f"/v1/state?node={names[(7 * k) % NODES]}",
                          headers=auth).status_code == 200

    counter = iter(range(10**9))

    def binder(client, k):
        name = f"bind-{next(counter)}"
        p = pod(name)
        source.create_pod(p)
        node = names[rng.randrange(NODES)]
        client.post("/bind", json={"PodName": name, "PodNamespace": "bench", "PodUID": name,
                                   "Node": node})

    def filterer(client, k):
        body = {"Pod": pod(f"f-{k}"), "NodeNames": rng.sample(names, CANDIDATES)}
        assert client.post("/filter", json=body).status_code == 200

    warm = app.test_client()
    for k in range(AGENTS):
        agent(warm, k)
    filterer(warm, -1)
    binder(warm, -1)
    phases = {}
    for phase, n_filters in (("idle", 0), ("busy", filters)):
        stop = threading.Event()
        series: dict[str, list[tuple[float, float]]] = {
            "report": [], "state": [], "bind": [], "filter": []}
        threads = [threading.Thread(target=timed, args=(stop, 0.005, agent, series["report"])),
                   threading.Thread(target=timed, args=(stop, 0.005, reader, series["state"])),
                   threading.Thread(target=timed, args=(stop, 0.02, binder, series["bind"]))]
        threads += [threading.Thread(target=timed, args=(stop, 0.0, filterer, series["filter"]))
                    for _ in range(n_filters)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        phases[phase] = {verb: _stats(v) for verb, v in series.items() if v}
    return phases


def _stats(timings: list[tuple[float, float]]) -> dict:
    """Wall-clock figures, and the CPU the calling thread spent (``cpu_*``: the work each
    call did, without its waits for the lock, the GIL or the machine's other load)."""
    ordered = sorted(wall for wall, _ in timings)
    cpu = [c for _, c in timings]
    return {"count": len(ordered), "p50_ms": round(statistics.median(ordered), 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
            "mean_ms": round(statistics.fmean(ordered), 3),
            "cpu_p50_ms": round(statistics.median(cpu), 3),
            "cpu_mean_ms": round(statistics.fmean(cpu), 3)}


def paired_ratios(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per phase, verb and p50/p99, this checkout's figure over the other's in each repeat
    (measured back to back), their mean and 95% interval (``scheduler_pattern.paired``)."""
    from benchmarks.scheduler_pattern import paired

    figures = {f"{phase}_{verb}_{q}": (phase, verb, f"{q}_ms")
               for phase in ("idle", "busy") for verb in runs["branch"][0][phase]
               for q in ("p50", "p99", "cpu_p50") if f"{q}_ms" in runs["branch"][0][phase][verb]}
    return paired([{"branch": b, "against": a} for b, a in zip(runs["branch"],
                                                                runs["against"], strict=True)],
                  figures, "branch", "against")


def _child(tree: Path, opts: argparse.Namespace) -> dict:
    return _common.run_child(__file__, tree, ["--seconds", str(opts.seconds),
                                              "--filters", str(opts.filters)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout measured in the same run (e.g. main)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--filters", type=int, default=2, help="filter threads when busy")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "snapshot_contention.json")
    opts = parser.parse_args()
    if opts.child is not None:
        sys.path.insert(0, str(opts.child))
        print(json.dumps(_measure(opts.seconds, opts.filters)))
        return
    load_before = _common.load_average()
    trees = {"branch": HERE.parent, **({"against": opts.against} if opts.against else {})}
    runs = _common.interleaved(opts.against, opts.repeats, lambda tree: _child(tree, opts))
    summary = {label: {phase: {verb: {k: round(statistics.median(r[phase][verb][k]
                                                              for r in rs), 3)
                                      for k in ("p50_ms", "p99_ms", "mean_ms", "count",
                                                "cpu_p50_ms", "cpu_mean_ms")}
                               for verb in rs[0][phase]}
                       for phase in ("idle", "busy")}
               for label, rs in runs.items()}
    doc = {"benchmark": "snapshot_contention", "seconds_per_phase": opts.seconds,
           "repeats": opts.repeats, "filter_threads": opts.filters,
           "trees": {k: str(v) for k, v in trees.items()},
           "median_over_repeats": summary,
           **({"branch_over_against": paired_ratios(runs)} if opts.against else {}),
           "runs": runs, "load_average_1_5_15_at_start": load_before,
           **_common.context(("numpy", "flask"))}
    _common.write_result(doc, opts.out)


if __name__ == "__main__":
    main()
