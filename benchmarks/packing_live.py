"""What the packing score costs the extender's /prioritize on a live cluster.

One extender per setting in this process over a ``sim:`` cluster of 1,000 nodes x 8
A100-40GB (extender_latency.py's cluster) with 8,000 placed pods, every node with
64 CPUs and 512 GiB allocatable and a bound pod of no GPU taking some of it, and
``--shapes`` distinct pod shapes learned (as binds would teach them). Each cycle
sends ``/prioritize`` with 500 candidate node names through the Flask routes (no
HTTP socket: the decision is what is measured) for a training pod of one GPU, a
training pod of 4 GPUs and a pod of no GPU, interleaving the settings:
``horus`` (``packing.live: false``, the default) and ``live`` (``packing.live:
true``). Prints per setting and pod kind the p50/p99/mean in milliseconds.

    .venv/bin/python benchmarks/packing_live.py [--cycles N] [--shapes N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import _common  # first: the import-path guard

NODES, GPUS, CANDIDATES = 1000, 8, 500
PRODUCT, MIB = "NVIDIA A100-SXM4-40GB", 40960.0
KINDS = ("train-1gpu", "train-4gpu", "no-gpu")


def _extender(live: bool, shapes: int, seed: int):
    from extender.cluster.sim import SimSource
    from extender.config.loader import ConfigHolder, load_config
    from extender.core import GpuSpec, NodeSpec, Placement
    from extender.wiring import create_app

    rng = random.Random(seed)
    names = [f"node-{i:04d}" for i in range(NODES)]
    nodes = [NodeSpec(n, tuple(GpuSpec(g, f"GPU-{i}-{g}", PRODUCT, MIB) for g in range(GPUS)),
                      (64000.0, 512 * 1024.0)) for i, n in enumerate(names)]
    environ = {"TANDEM__LOGGING__LEVEL": "warning", "TANDEM__HANDOFF__MODE": "env",
               "TANDEM__PACKING__LIVE": "true" if live else "false"}
    app = create_app(ConfigHolder(load_config(None, environ=environ)), SimSource(nodes),
                     environ={"TANDEM_AGENT_TOKEN": "bench"})
    ext = app.extensions["tandem"]
    for i, n in enumerate(names):
        ext.state.hosts.bound(f"cpu-{i}", n, rng.uniform(0, 48000), rng.uniform(0, 400 * 1024))
        for g in range(GPUS):
            ext.state.confirm(Placement(f"placed-{i}-{g}", f"bench/placed-{i}-{g}", n, (g,),
                                        rng.uniform(10, 70), float(rng.randrange(2000, 30000))))
    for k in range(shapes):
        gpus = rng.choice((0, 1, 1, 1, 2, 4, 8))
        ext.learner.shapes.observe(gpus, rng.choice((4096, 10240, 20480, 40960)),
                                   1000 * rng.randrange(1, 32), 1024 * rng.randrange(1, 64))
        ext.learner.shapes.observe(gpus, 40960, 4000, 8192) if k % 4 == 0 else None
    return app.test_client(), names


def _pod(kind: str, k: int) -> dict:
    res: dict = {"requests": {"cpu": "4", "memory": "16Gi"}}
    annotations = {}
    if kind != "no-gpu":
        res["limits"] = {"tandem.io/gpu": "4" if kind == "train-4gpu" else "1"}
        annotations = {"tandem.io/gpu-util": "20", "tandem.io/gpu-mem-mib": "8000"}
    return {"metadata": {"name": f"p{k}", "namespace": "bench", "uid": f"uid-{kind}-{k}",
                         "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": res}]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--shapes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    _common.add_out_option(parser, "packing_live")
    opts = parser.parse_args()
    settings = {"horus": _extender(False, opts.shapes, opts.seed),
                "live": _extender(True, opts.shapes, opts.seed)}
    rng = random.Random(opts.seed)
    times: dict[str, dict[str, list[float]]] = {s: {k: [] for k in KINDS} for s in settings}
    for cycle in range(opts.cycles):
        names = rng.sample(settings["horus"][1], CANDIDATES)
        for kind in KINDS:
            body = {"Pod": _pod(kind, cycle), "NodeNames": names}
            for name, (client, _) in settings.items():
                started = time.perf_counter()
                answer = client.post("/prioritize", json=body)
                elapsed = (time.perf_counter() - started) * 1e3
                assert answer.status_code == 200 and len(answer.get_json()) == CANDIDATES
                if cycle >= 10:  # warm-up: caches, first allocations
                    times[name][kind].append(elapsed)

    def summary(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {"p50": round(statistics.median(ordered), 3),
                "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 3),
                "mean": round(statistics.fmean(ordered), 3)}

    doc = {"benchmark": "packing_live",
           "cluster": {"nodes": NODES, "gpus_per_node": GPUS, "placed_pods": NODES * GPUS,
                       "candidates_per_call": CANDIDATES},
           "learned_shapes": opts.shapes, "cycles": opts.cycles,
           "prioritize_ms": {s: {k: summary(v) for k, v in t.items()} for s, t in times.items()},
           **_common.context(("numpy", "flask"))}
    _common.write_result(doc, opts.out)


if __name__ == "__main__":
    main()
