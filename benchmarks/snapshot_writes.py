"""What a bind's write costs beside a live snapshot, on two checkouts in one run.

The cluster state's side of a bind (``assume`` on the snapshot's stamp, then ``confirm``)
over ``--nodes`` nodes x 8 A100-40GB with one placed pod per GPU
(snapshot_contention.py's cluster at 1,000 nodes): ``alone``, with no snapshot held, and
``beside``, while a snapshot taken just before is held (as a filter running beside the
bind holds one: the write must copy what that snapshot still reads). Each write's
thread CPU is kept (other processes' load does not change it much); figures in
microseconds.

``--against TREE`` runs the same over another checkout with the same ``ClusterState``
API (``snapshot``, ``assume(stamp, placement)``, ``confirm``) in a child process,
interleaved with this one ``--repeats`` times; the result holds both and the paired
ratios.

    .venv/bin/python benchmarks/snapshot_writes.py [--against TREE] [--nodes N]
        [--writes N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import _common  # first: the import-path guard (a child puts its checkout before it)

HERE = Path(__file__).resolve().parent
GPUS, PRODUCT, MIB = 8, "NVIDIA A100-SXM4-40GB", 40960.0


def _measure(nodes: int, writes: int) -> dict:
    """Both cases on the checkout this process imports (``sys.path``)."""
    from extender.core import GpuSpec, NodeSpec, Placement
    from extender.state.ledger import ClusterState

    class Beliefs:  # the state only hands these to its snapshots
        def current(self) -> tuple[None, None]:
            return None, None

    rng = random.Random(42)
    names = [f"node-{i:04d}" for i in range(nodes)]
    state = ClusterState(Beliefs(), time.monotonic, assume_ttl_seconds=30.0)
    state.set_nodes([NodeSpec(n, tuple(GpuSpec(g, f"GPU-{i}-{g}", PRODUCT, MIB)
                                       for g in range(GPUS))) for i, n in enumerate(names)])
    for i, n in enumerate(names):
        for g in range(GPUS):
            state.confirm(Placement(f"placed-{i}-{g}", f"bench/placed-{i}-{g}", n, (g,),
                                    rng.uniform(10, 70), float(rng.randrange(2000, 30000))))
    out = {}
    for case in ("alone", "beside"):
        cpu = []
        for k in range(writes):
            node = names[rng.randrange(nodes)]
            p = Placement(f"{case}-{k}", f"bench/{case}-{k}", node, (k % GPUS,), 20.0, 1000.0)
            stamp = state.snapshot().stamp(node)
            held = state.snapshot() if case == "beside" else None
            started = time.thread_time()
            assert state.assume(stamp, p)
            state.confirm(p)
            cpu.append((time.thread_time() - started) * 1e6)
            del held
        out[case] = {"writes": writes, "cpu_p50_us": round(statistics.median(cpu), 1),
                     "cpu_mean_us": round(statistics.fmean(cpu), 1)}
    return out


def _child(tree: Path, opts: argparse.Namespace) -> dict:
    return _common.run_child(__file__, tree, ["--nodes", str(opts.nodes),
                                              "--writes", str(opts.writes)])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout measured in the same run")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=400, help="per case and repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    _common.add_out_option(parser, "snapshot_writes")
    opts = parser.parse_args(argv)
    if opts.child is not None:
        sys.path.insert(0, str(opts.child))
        result = _measure(opts.nodes, opts.writes)
        print(json.dumps(result))
        return result
    from benchmarks.scheduler_pattern import paired

    load_before = _common.load_average()
    trees = {"branch": HERE.parent, **({"against": opts.against} if opts.against else {})}
    runs = _common.interleaved(opts.against, opts.repeats, lambda tree: _child(tree, opts))
    figures = {f"{case}_{q}": (case, q) for case in ("alone", "beside")
               for q in ("cpu_p50_us", "cpu_mean_us")}
    doc = {"benchmark": "snapshot_writes", "nodes": opts.nodes, "gpus_per_node": GPUS,
           "writes": opts.writes, "repeats": opts.repeats,
           "trees": {k: str(v) for k, v in trees.items()},
           "median_over_repeats": {label: {case: {q: round(statistics.median(
               r[case][q] for r in rs), 1) for q in ("cpu_p50_us", "cpu_mean_us")}
               for case in ("alone", "beside")} for label, rs in runs.items()},
           **({"branch_over_against": paired(
               [{"branch": b, "against": a} for b, a in zip(runs["branch"], runs["against"],
                                                             strict=True)],
               figures, "branch", "against")} if opts.against and opts.repeats > 1 else {}),
           "runs": runs, "load_average_1_5_15_at_start": load_before,
           **_common.context(("numpy",))}
    _common.write_result(doc, opts.out)
    return doc


if __name__ == "__main__":
    main()
