"""Does the exploration bonus decide placements on a busy cluster? (simulator only)

``learning.pair_explore_bonus`` lowers the predicted loss of a GPU whose pair for the
newcomer was never tried (:mod:`extender.core.pairs`). It can only change a decision
where a GPU with an untried pair competes with one whose pairs are all known. This runs
the worlds of ``interference.py`` (Gavel's P100 and K80 truths, 3 x 4 GPUs, w-large
with the truth's models, the proportional signal) with online pair learning, from a cold
start and with the other GPU's matrix, under bonuses 0, the packaged 0.05 and 0.3 on
the same jobs, and counts the runs whose average JCT differs from the run without a
bonus (any changed placement changes it). Simulated cluster; no timing is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from functools import partial
from typing import Any

import _common

from extender.config.loader import load_config
from lab.simulator.belief import SimWorld
from lab.simulator.policies import PolicyOptions, tandem_cost
from lab.simulator.runner import simulate

_gavel = _common.sibling("interference")  # its data, worlds and cluster sizes
BONUSES = (0.0, 0.05, 0.3)
STARTS = ("cold", "matrix")


def _runs(raw: dict[str, Any], workload: str, task: tuple[str, str, int]) -> list[float]:
    """Average JCT of one GPU, start and seed under each bonus."""
    gpu, start, seed = task
    here = _gavel.setting(raw, workload, gpu, "proportional", seed)
    base = replace(load_config(None, environ={}).learning, pairs=True,
                   pair_prior_tables=here.other if start == "matrix" else {})
    out = []
    for bonus in BONUSES:
        world = SimWorld.build(here.truth, "online", replace(base, pair_explore_bonus=bonus),
                               [here.gpu_type])
        result = simulate(here.jobs, here.nodes, "tandem", PolicyOptions(cost=tandem_cost()),
                          world=world)
        out.append(float(result.avg_jct_s))
    return out


def main() -> None:
    """Run every GPU, start and seed; print and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--workload", default="w-large")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    _common.add_out_option(parser, "exploration_simulated")
    args = parser.parse_args()
    raw = json.loads(_gavel.DATA.read_text())
    started = time.perf_counter()
    tasks = [(gpu, start, seed) for gpu in _gavel.GPUS for start in STARTS
             for seed in range(1, args.seeds + 1)]
    results = _common.map_tasks(partial(_runs, raw, args.workload), tasks, args.processes)
    runs = [{"gpu": gpu, "start": start, "seed": seed,
             "avg_jct_s": {str(b): round(v, 1) for b, v in zip(BONUSES, jct, strict=True)}}
            for (gpu, start, seed), jct in zip(tasks, results, strict=True)]
    changed = {str(b): sum(abs(jct[i] - jct[0]) > 1e-6 for jct in results)
               for i, b in enumerate(BONUSES) if b}
    report = {"benchmark": "exploration (simulated cluster)",
              "setup": {"gpus": list(_gavel.GPUS), "starts": list(STARTS),
                        "seeds": args.seeds, "workload": f"{args.workload} with --models truth",
                        "signal": "proportional", "bonuses": list(BONUSES)},
              "runs": runs, "runs_total": len(runs),
              "runs_changed_by_bonus": changed,
              "wall_s": round(time.perf_counter() - started, 1)}
    report.update(_common.context(("numpy",)))
    _common.write_result(report, args.out)


if __name__ == "__main__":
    main()
