"""Placement on measured H100 interference, with what an H100's NVML really shows.

Data: every pair of twelve training jobs measured on one H100 (time-sliced, no MPS;
``training_data/nvidia-h100-80gb-hbm3/``), and an independent retest of 39 of those pairs
minutes later on the same machine (``benchmarks/results/h100_pairs_retest/``). Both are
imported as ``tandem import-interference --profiled`` does.

**Offline pairing** (as part (a) of ``interference.py``): the twelve jobs paired onto six
GPUs by each method's figures, valued on the campaign's measured matrix; the extender's
pair learner after each job was seen in ``k`` random pairings (the campaign's figures),
alone and with the retest as its prior, and after it chose its own ``k`` pairings
(``learner_choosing``: ``interference.chosen_pairings``); the best-fitting curve; random
pairing.

**Simulator, H100 cluster** (3 nodes x 4 GPUs), the w-large workload with each job's
model drawn from the twelve (its true utilisation and memory the measured ones), the
tandem policy. The truth's pairs are the campaign's. Two signal models:

- ``time-sliced``: what NVML showed on the H100 (each co-located process reads the GPU's
  utilisation). The extender sets such figures aside
  (:mod:`extender.learning.readings`): only pods alone teach.
- ``proportional``: utilisation / slowdown, as if the figures were shares (what online
  pair learning could do if NVML gave them; a counterfactual here).

Modes: ``curve-only`` (today's default learner), ``pair-aware`` (online pair learning,
no matrix), ``pair-aware+retest`` (the retest's 39 measured pairs as
``learning.pair_prior``: a measurement the truth did not come from, as a profiling
campaign on the cluster's GPUs gives), ``prior`` (fixed predictions), ``oracle`` (the
truth's utilisations and every measured pair), ``pair-oracle`` (curve-only's learner
given every measured pair: what knowing the pairs alone is worth). Mean and 95% interval
over seeds of average JCT and makespan; each mode's lead over curve-only paired per seed.
Figures are simulation outputs on measured data, not timings.
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial
from typing import Any

import _common
import numpy as np

from contracts.interferencefile import PairTable
from lab.simulator.cluster import uniform_cluster
from lab.simulator.policies import PolicyOptions, tandem_cost
from lab.simulator.profiled import import_profiled
from lab.simulator.runner import simulate
from lab.simulator.signal import SignalModel
from lab.simulator.truth import Truth
from lab.simulator.workloads import generate, with_named_models

_gavel = _common.sibling("interference")  # the Gavel benchmark's worlds and intervals
_world, _paired, interval = _gavel._world, _gavel._paired, _gavel.interval
pairing_value, learner_predictions = _gavel.pairing_value, _gavel.learner_predictions
CAMPAIGN = _common.ROOT / "training_data" / "nvidia-h100-80gb-hbm3"
RETEST = _common.ROOT / "benchmarks" / "results" / "h100_pairs_retest"
MEMORY_MIB = 81559
SIGNALS = ("time-sliced", "proportional")
MODES = ("curve-only", "pair-aware", "pair-aware+retest", "prior", "oracle", "pair-oracle")
PAIR_AWARE = ("pair-aware", "pair-aware+retest")
KEYS = ("avg_jct_s", "makespan_s")
KS = (1, 2, 3)


def _matrix(table: PairTable, names: list[str]) -> np.ndarray:
    """``S[a, b]`` of ``names`` as measured (below 1 kept: the placements are valued on the
    matrix ``h100_colocation.py`` values them on)."""
    return np.array([[table.slowdown.get(a, {}).get(b, 1.0) for b in names] for a in names])


def offline(seeds: int) -> dict[str, Any]:
    """Pairings of the twelve jobs by each method, as a share of the measured matrix's."""
    _, table, models = import_profiled(CAMPAIGN)
    retest_type, retest, _ = import_profiled(RETEST)
    jobs = sorted(models)
    truth = _matrix(table, jobs)
    np.fill_diagonal(truth, np.inf)  # a job is never paired with itself
    best = pairing_value(truth, truth)
    share = lambda v: round(float(v) / best, 4)  # noqa: E731
    methods: dict[str, Any] = {}
    for name, prior in (("learner", None), ("learner_with_retest", {retest_type: retest})):
        for k in KS:
            values = [pairing_value(learner_predictions(
                jobs, truth, _gavel.seen_pairings(len(jobs), k, np.random.default_rng(seed)),
                prior), truth) for seed in range(seeds)]  # fmt: skip
            methods.setdefault(name, {})[f"k={k}"] = {**interval(values),
                                                      "of_matrix": share(np.mean(values))}
        methods[name.replace("learner", "learner_choosing")] = _gavel.choosing(
            jobs, truth, seeds, best, prior)
    rng = np.random.default_rng(0)
    random = [pairing_value(rng.random(truth.shape) + 1, truth) for _ in range(seeds)]
    retest_alone = pairing_value(learner_predictions(jobs, truth, [], {retest_type: retest}),
                                 truth)  # fmt: skip
    return {"jobs": len(jobs), "matrix": round(best, 4),
            "best_curve_of_matrix": share(pairing_value(_gavel.best_curve(truth), truth)),
            "random": {**interval(random), "of_matrix": share(np.mean(random))},
            "retest_alone_of_matrix": share(retest_alone), **methods}


def _seed_runs(workload: str, task: tuple[str, int]) -> dict[str, dict[str, float]]:
    """One seed under one signal model: every mode's average JCT and makespan, and what
    the pair-aware learners took (pair samples; processes set aside as not shares)."""
    signal, seed = task
    gpu_type, table, models = import_profiled(CAMPAIGN)
    retest_type, retest, _ = import_profiled(RETEST)
    truth = Truth(models=models, interference={gpu_type: table}, signal=SignalModel(signal),
                  seed=seed)
    nodes = uniform_cluster(3, 4, gpu_type, MEMORY_MIB, prefix="h100-node")
    jobs = with_named_models(generate(workload, seed), sorted(models), seed)
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        # pair-aware+matrix of the Gavel benchmark, with the retest as the matrix
        name = "pair-aware+matrix" if mode == "pair-aware+retest" else mode
        world = _world(truth, name, [gpu_type], {retest_type: retest})
        result = simulate(jobs, nodes, "tandem", PolicyOptions(cost=tandem_cost()),
                          world=world).summary()
        out[mode] = {key: float(result[key]) for key in KEYS}
        if mode in PAIR_AWARE:
            learner = world.knowledge.learner
            out[mode].update(pair_samples=float(learner.pairs.stats()["samples"]),
                             not_shares=float(learner.stats()["rejected"].get(
                                 "per-process-not-shares", 0)))  # fmt: skip
    return out


def simulated(seeds: int, workload: str, processes: int) -> dict[str, Any]:
    """Every signal model and mode over ``seeds`` seeds."""
    tasks = [(signal, seed) for signal in SIGNALS for seed in range(1, seeds + 1)]
    results = _common.map_tasks(partial(_seed_runs, workload), tasks, processes)
    out: dict[str, Any] = {}
    for signal in SIGNALS:
        per_seed = [r for (s, _), r in zip(tasks, results, strict=True) if s == signal]
        runs = {m: {k: [r[m][k] for r in per_seed] for k in KEYS} for m in MODES}
        out[signal] = {
            "modes": {m: {k: interval(v) for k, v in r.items()} for m, r in runs.items()},
            "curve_minus_mode_paired": {m: {k: _paired(runs, "curve-only", m, k) for k in KEYS}
                                        for m in MODES if m != "curve-only"},
            "learned": {m: {k: interval([r[m][k] for r in per_seed])
                            for k in ("pair_samples", "not_shares")} for m in PAIR_AWARE},
            "per_seed": runs}
    return out


def main() -> None:
    """Run the simulator part, print and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--offline-seeds", type=int, default=20)
    parser.add_argument("--workload", default="w-large")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    _common.add_out_option(parser, "interference_h100")
    args = parser.parse_args()
    started = time.perf_counter()
    _, table, models = import_profiled(CAMPAIGN)
    _, retest, _ = import_profiled(RETEST)
    report: dict[str, Any] = {
        "benchmark": "interference_h100",
        "kind": "simulator on measured data (figures are simulation outputs)",
        "data": {"truth": str(CAMPAIGN.relative_to(_common.ROOT)),
                 "prior": str(RETEST.relative_to(_common.ROOT)),
                 "measured_on": "NVIDIA H100 80GB HBM3, time-sliced (see provenance.json)",
                 "models": len(models),
                 "truth_directed_pairs": sum(len(r) for r in table.slowdown.values()),
                 "prior_directed_pairs": sum(len(r) for r in retest.slowdown.values())},
        "setup": {"seeds": args.seeds, "workload": f"{args.workload}, models of the truth",
                  "cluster": "3 x 4 H100", "policy": "tandem (packaged config)",
                  "modes": list(MODES), "signals": list(SIGNALS),
                  "processes": args.processes},
        "offline_pairing": offline(args.offline_seeds),
        "simulator": simulated(args.seeds, args.workload, args.processes),
    }
    report["total_wall_s"] = round(time.perf_counter() - started, 1)
    report.update(_common.context(("numpy", "scipy")))
    _common.write_result(report, args.out)


if __name__ == "__main__":
    main()
