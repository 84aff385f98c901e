"""Simulated clusters on measured interference, the agents reporting the jobs' progress.

The imported Gavel truths (P100 and K80, ``shared/data/interference/``) on 3 x 4 GPUs of
each type, the w-small and w-large workloads with each job's model drawn from the truth's
26 (as ``interference.py`` (b)), the tandem policy. Signals
(:mod:`lab.simulator.signal`):

- ``progress``: NVML as an H100 shows it (each co-located process reads the GPU's
  figure), and each pod's steps per second (its true slowdown times lognormal noise of sd
  0.066 on the log, the H100 retest's);
- ``time-sliced``: NVML only (what a tandem without progress counters sees).

Modes: ``curve-only`` (the packaged learner), ``pair-aware`` (``learning.pairs: true``:
the progress pair learner, no matrix), ``pair-aware+revert`` (the same with the opt-in
``learning.revert_losing_seconds`` at :data:`REVERT_SECONDS`: the newest pod of a GPU whose
pair was measured to lose is moved, as the extender evicts it), ``pair-aware+matrix`` (the
same learner given the other GPU type's published matrix as ``learning.pair_prior``: the
K80's for the P100 truth and the reverse, never the truth's own),
``pair-aware+campaign-k<k>`` (the same learner given a small profiling campaign of the
cluster's own GPU type as ``learning.pair_prior``: each of the truth's models measured once
beside ``k`` partners chosen by a seeded ring that never reads the truth's figures, each
job's slowdown the truth's times the progress noise, written as ``tandem profile run``
writes a campaign and imported through ``tandem import-interference --profiled`` and the
config loader, :mod:`lab.simulator.pair_campaign`; the setup says what it costs),
``pair-aware+matrix+campaign-k<k>`` (that campaign and the other type's matrix in one prior
file), ``hindsight-diagnostic``
(no product mode, run only when named: the learner measures as ``pair-aware`` does, but
decisions read a pair's true slowdown once it has a sample, the mean of those otherwise;
what knowing exactly the pairs measured is worth), ``pair-oracle``
(curve-only's learner given every measured pair: what knowing the pairs is worth). Per seed
(paired: every mode runs the same jobs): average JCT, jobs finished within a fixed window
(half of curve-only's makespan on that seed, from the first arrival) and makespan
(information only). The
**capture** is ``(curve - pair) / (curve - oracle)`` of the mean average JCT: the share of
the pair-oracle's gain a learner mode gets, given only where that gain (paired per seed) is
beyond its interval. Mean and 95% (t) interval over seeds. Figures are simulation outputs
on measured data, not timings.

Tasks (a seed of a setting) run in ``--processes`` processes of one BLAS/OpenMP thread each,
the costliest first; each prints its CPU time and figures as a JSON line on stderr as it
ends.
"""

# ruff: noqa: E402 (the thread settings below must precede numpy's import)
from __future__ import annotations

import os

if __name__ == "__main__":  # one BLAS/OpenMP thread per process, set before numpy loads:
    # the fits' arrays are tiny, and a second thread per process only spun (on 2 busy
    # cores, 12x the CPU time of one thread for the same run)
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import argparse
import json
import math
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import _common
import numpy as np

from extender.config.loader import load_config
from extender.core.pairs import PairModel, TypePairs, unseen_figure
from lab.simulator.belief import SimKnowledge, SimWorld
from lab.simulator.pair_campaign import (
    WINDOW_SECONDS,
    Campaign,
    campaign_pairs,
    campaign_prior,
    write_campaign,
)
from lab.simulator.policies import PolicyOptions, tandem_cost
from lab.simulator.runner import simulate

_gavel = _common.sibling("interference")
interval = _gavel.interval
GPUS = ("p100", "k80")
WORKLOADS = ("w-small", "w-large")
REVERT = "pair-aware+revert"
MATRIX = "pair-aware+matrix"
HINDSIGHT = "hindsight-diagnostic"
CAMPAIGN = re.compile(r"pair-aware(\+matrix)?\+campaign-k(\d+)")
"""A campaign mode: ``k`` partners per model measured on the cluster's own GPU type before
jobs arrive, imported as ``learning.pair_prior`` (with the other type's matrix: ``+matrix``)."""
CAMPAIGNS = ("pair-aware+campaign-k2", "pair-aware+campaign-k3",
             "pair-aware+matrix+campaign-k2", "pair-aware+matrix+campaign-k3")
MODES = {"progress": ("curve-only", "pair-aware", REVERT, MATRIX, *CAMPAIGNS, HINDSIGHT,
                      "pair-oracle"),
         "time-sliced": ("curve-only", "pair-aware", MATRIX)}
LEARNERS = ("pair-aware", REVERT, MATRIX, *CAMPAIGNS, HINDSIGHT)
PRODUCT_LEARNERS = ("pair-aware", REVERT, MATRIX)
"""The learner modes run unless ``--learners`` names others (the diagnostic on request)."""
REVERT_SECONDS = 600.0
"""``learning.revert_losing_seconds`` in the revert mode: a pod is moved within its first ten
minutes on a GPU (set, not tuned; docs/interference.md)."""
KEYS = ("avg_jct_s", "finished_in_window", "makespan_s")
WINDOW_OF_MAKESPAN = 0.5
LEARNED = ("progress_samples", "refused_losing", "directed_pairs_measured",
           "windows_without_alone_time", "windows_of_three_or_more", "windows_attributed",
           "reverts")
"""What the progress learner had by the end of each run: samples, pairs refused as losing,
directed pairs with samples, shared windows set aside waiting for an alone time (some
become samples later), windows of GPUs held by three pods or more that gave no sample and
those attributed to the one partner not yet measured (samples), and pods moved as the
newest of a pair measured to lose (the revert mode)."""


class _Hindsight(SimKnowledge):
    """A diagnostic, no product mode: the progress learner measures as pair-aware does, but
    decisions read each directed pair's TRUE slowdown once it has a progress sample, and the
    mean of those true figures (as :func:`unseen_figure`) for a pair never measured: the
    most any learner that knows only the pairs it has measured could decide with."""

    def policy(self, base):  # type: ignore[no-untyped-def]
        learned = super().policy(base)
        stats = self.learner.pairs.progress.stats
        if len(stats) != getattr(self, "_seen", -1):
            self._seen, self._model = len(stats), PairModel({
                t: _measured_truth(table, [(a, b) for tt, a, b in stats if tt == t])
                for t, table in self.truth.interference.items()})
        return learned.with_pairs(self._model) if stats else learned


def _measured_truth(table: Any, measured: list[tuple[str, str]]) -> TypePairs:
    """``table``'s true log slowdowns of the ``measured`` pairs as progress figures."""
    figures = {(a, b): (math.log(max(table.slowdown[a][b], 1.0)), 1e-6, "progress:1")
               for a, b in measured}
    return TypePairs(progress=figures, unseen=unseen_figure(figures),
                     cannot=table.cannot_share)


def _campaign_world(truth: Any, mode: str, gpu_type: str, other: dict[str, Any],
                    jobs: Sequence[Any]) -> SimWorld:
    """The learner given a campaign of ``k`` partners per model on ``gpu_type`` (seeded by
    the truth's seed), imported through ``tandem import-interference --profiled``."""
    match = CAMPAIGN.fullmatch(mode)
    assert match is not None
    table = truth.interference[gpu_type]
    models = table.models()
    pairs = campaign_pairs(models, int(match.group(2)), seed=[truth.seed, 1])
    # each model alone as its jobs run (the prior reads only the pairs)
    util = {j.model: (j.util_percent, float(j.mem_mib)) for j in jobs}
    mean = (float(np.mean([u for u, _ in util.values()])), max(m for _, m in util.values())) \
        if util else (50.0, 1000.0)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp) / gpu_type
        write_campaign(where, gpu_type.replace("-", " "), table, pairs,
                       {m: util.get(m, mean) for m in models}, seed=[truth.seed, 2])
        cfg = campaign_prior(where, load_config(None, environ={}).learning, models,
                             other if match.group(1) else None)
    return SimWorld.build(truth, "online", cfg, [gpu_type])


def _campaign_cost(raw: dict[str, Any], mode: str) -> dict[str, Any]:
    """What a campaign mode's profiling costs per GPU type: runs (each model alone, each
    pair once) and GPU minutes at the committed H100 campaign's run length."""
    k = int(CAMPAIGN.fullmatch(mode).group(2))  # type: ignore[union-attr]
    out = {}
    for gpu in GPUS:
        models = _gavel.import_gavel(raw, gpu)[1].models()
        pairs = campaign_pairs(models, k, seed=0)
        cost = Campaign(tuple(pairs), runs=len(models) + len(pairs))
        out[gpu] = {"partners_per_model": k, "models": len(models), "pairs": len(pairs),
                    "runs": cost.runs, "gpu_minutes": round(cost.gpu_seconds / 60, 1),
                    "seconds_per_run": WINDOW_SECONDS}
    return out


def _world(truth: Any, mode: str, gpu_type: str, other: dict[str, Any],
           jobs: Sequence[Any] = ()) -> SimWorld:
    if CAMPAIGN.fullmatch(mode):
        return _campaign_world(truth, mode, gpu_type, other, jobs)
    if mode == MATRIX:  # the other GPU type's published matrix as learning.pair_prior
        return _gavel._world(truth, "pair-aware+matrix", [gpu_type], other)
    if mode == HINDSIGHT:
        world = _gavel._world(truth, "pair-aware", [gpu_type], {})
        world.knowledge = _Hindsight("online", truth, world.knowledge.learner,
                                     world.knowledge.cfg, [gpu_type])
        return world
    if mode == REVERT:
        base = load_config(None, environ={}).learning
        return SimWorld.build(truth, "online", replace(
            base, pairs=True, revert_losing_seconds=REVERT_SECONDS), [gpu_type])
    return _gavel._world(truth, mode, [gpu_type], {})


def _seed_runs(raw: dict[str, Any], jobs: int | None, learners: tuple[str, ...],
               task: tuple[str, str, str, int]) -> dict[str, Any]:
    """One seed of one GPU, workload and signal: the figures of every mode (of the learner
    modes, ``learners``; the workload's first ``jobs`` arrivals where given)."""
    gpu, workload, signal, seed = task
    started = time.process_time()
    here = _gavel.setting(raw, workload, gpu, signal, seed)
    if jobs is not None:
        here = replace(here, jobs=sorted(here.jobs, key=lambda j: j.arrival_s)[:jobs])
    first = min(j.arrival_s for j in here.jobs)
    out: dict[str, Any] = {}
    finishes: dict[str, np.ndarray] = {}
    for mode in _modes(signal, learners):
        world = _world(here.truth, mode, here.gpu_type, here.other, here.jobs)
        result = simulate(here.jobs, here.nodes, "tandem", PolicyOptions(cost=tandem_cost()),
                          world=world)
        out[mode] = {"avg_jct_s": float(result.avg_jct_s), "makespan_s": float(result.makespan_s),
                     "unfinished": int(result.unfinished)}
        if result.unfinished == 0:  # runs are in job order: finish = arrival + JCT
            finishes[mode] = np.array([j.arrival_s for j in here.jobs]) + np.array(result.jct_s)
        if mode in LEARNERS:
            pairs = world.knowledge.learner.pairs
            stats = pairs.stats()
            out[mode].update(progress_samples=stats["progress_samples"],
                             refused_losing=stats["losing"],
                             directed_pairs_measured=len(pairs.progress.stats),
                             windows_without_alone_time=pairs.tracker.alone_steps.skipped.get(
                                 "no-alone-time", 0),
                             windows_of_three_or_more=pairs.tracker.alone_steps.skipped.get(
                                 "not-a-pair", 0),
                             windows_attributed=pairs.tracker.alone_steps.skipped.get(
                                 "attributed", 0), reverts=result.reverts)
    window = WINDOW_OF_MAKESPAN * out["curve-only"]["makespan_s"]
    for mode in out:
        done = finishes.get(mode)
        out[mode]["finished_in_window"] = float(np.sum(done <= first + window)) \
            if done is not None else float("nan")
    # progress on stderr, a line per task as it ends (its figures: a long run's so far)
    print(json.dumps({"task": list(task), "cpu_s": round(time.process_time() - started, 1),
                      "modes": out}), file=sys.stderr, flush=True)
    return out


def _modes(signal: str, learners: tuple[str, ...]) -> tuple[str, ...]:
    """The modes run under ``signal``: curve-only, the oracle and the learner modes asked."""
    return tuple(m for m in MODES[signal] if m not in LEARNERS or m in learners)


def _capture(runs: dict[str, dict[str, list[float]]], mode: str, shown: bool) -> float | None:
    curve, pair, oracle = (float(np.mean(runs[m]["avg_jct_s"]))
                           for m in ("curve-only", mode, "pair-oracle"))
    return round((curve - pair) / (curve - oracle), 3) if shown else None


BOOTSTRAP = 10_000
"""Resamples of the seeds for a capture's interval (:func:`capture_interval`)."""


def capture_interval(runs: dict[str, dict[str, list[float]]], mode: str
                     ) -> dict[str, float | None]:
    """The capture of ``mode`` (its mean average-JCT gain over curve-only over the
    oracle's) and its 95% paired bootstrap interval: seeds resampled together, the ratio of
    the resampled means (percentiles 2.5 and 97.5; seeded, so a result reads back equal).
    Where the oracle gains nothing there is nothing to capture: None (resamples in which
    it gains nothing are left out of the interval likewise)."""
    curve = np.array(runs["curve-only"]["avg_jct_s"])
    gain, oracle = curve - np.array(runs[mode]["avg_jct_s"]), curve - np.array(
        runs["pair-oracle"]["avg_jct_s"])
    if oracle.mean() == 0:
        return {"capture": None, "ci95_low": None, "ci95_high": None}
    picks = np.random.default_rng(0).integers(0, len(curve), (BOOTSTRAP, len(curve)))
    gains, oracles = gain[picks].mean(axis=1), oracle[picks].mean(axis=1)
    ratios = gains[oracles != 0] / oracles[oracles != 0]
    low, high = np.percentile(ratios, [2.5, 97.5])
    return {"capture": round(float(gain.mean() / oracle.mean()), 3),
            "ci95_low": round(float(low), 3), "ci95_high": round(float(high), 3)}


def summarise(results: dict[str, Any]) -> None:
    """Add to each setting of ``results`` that ran the oracle every learner mode's capture
    interval and, per pair of learner modes, the paired difference of average JCT
    (``a_minus_b``: positive where ``b`` is shorter)."""
    for entry in results.values():
        runs = entry["per_seed"]
        if "pair-oracle" not in runs:
            continue
        learners = [m for m in LEARNERS if m in runs]
        entry["capture_interval"] = {m: capture_interval(runs, m) for m in learners}
        entry["learner_differences_paired"] = {
            f"{a}_minus_{b}": _gavel._paired(runs, a, b, "avg_jct_s")
            for a in learners for b in learners if a < b}


def _keep(runs: dict[str, dict[str, list[float]]], learned: dict[str, Any],
          old: dict[str, Any] | None) -> None:
    """Add to ``runs`` the learner modes not run of ``old`` (an earlier result's entry of the
    same setting and seeds: its curve-only figures must be these, seed for seed)."""
    for mode in LEARNERS if old else ():
        if mode in runs or mode not in old["per_seed"]:
            continue
        if old["per_seed"]["curve-only"]["avg_jct_s"] != runs["curve-only"]["avg_jct_s"]:
            raise SystemExit("--keep-from: curve-only differs there (other seeds or jobs?)")
        runs[mode] = old["per_seed"][mode]
        was = old.get("learned", {})
        learned[mode] = was.get(mode, was if mode == "pair-aware" else None)


def _longest_first(tasks: list[tuple[str, str, str, int]]) -> list[int]:
    """The tasks' indices, the costliest first (so the pool's last tasks are short ones):
    more modes (the progress signal's), then w-large, then the K80 (the slowest setting)."""
    def cost(i: int) -> tuple[int, bool, bool]:
        gpu, workload, signal, _ = tasks[i]
        return len(MODES[signal]), workload == "w-large", gpu == "k80"
    return sorted(range(len(tasks)), key=cost, reverse=True)


def run(raw: dict[str, Any], seeds: int, processes: int, jobs: int | None = None,
        first_seed: int = 1, signals: tuple[str, ...] = tuple(MODES),
        learners: tuple[str, ...] = PRODUCT_LEARNERS, kept: dict[str, Any] | None = None
        ) -> dict[str, Any]:
    """Every GPU, workload and signal over ``seeds`` paired seeds from ``first_seed``;
    ``kept``: an earlier result's ``results``, whose learner modes not run here it adds."""
    tasks = [(gpu, workload, signal, seed) for gpu in GPUS for workload in WORKLOADS
             for signal in signals for seed in range(first_seed, first_seed + seeds)]
    order = _longest_first(tasks)
    done = _common.map_tasks(partial(_seed_runs, raw, jobs, learners),
                             [tasks[i] for i in order], processes)
    results: list[dict[str, Any]] = [{}] * len(tasks)
    for i, r in zip(order, done, strict=True):
        results[i] = r
    out: dict[str, Any] = {}
    for gpu in GPUS:
        for workload in WORKLOADS:
            for signal in signals:
                per_seed = [r for (g, w, s, _), r in zip(tasks, results, strict=True)
                            if (g, w, s) == (gpu, workload, signal)]
                runs = {m: {k: [r[m][k] for r in per_seed] for k in KEYS}
                        for m in _modes(signal, learners)}
                learned = {m: {k: interval([float(r[m][k]) for r in per_seed]) for k in LEARNED}
                           for m in LEARNERS if m in runs}
                _keep(runs, learned, (kept or {}).get(f"{gpu}/{workload}/{signal}"))
                modes = [m for m in MODES[signal] if m in runs]
                entry: dict[str, Any] = {
                    "modes": {m: {k: interval(v) for k, v in r.items()} for m, r in runs.items()},
                    "curve_minus_mode_paired": {
                        m: {k: _gavel._paired(runs, "curve-only", m, k) for k in KEYS}
                        for m in modes if m != "curve-only"},
                    "per_seed": runs}
                entry["learned"] = learned
                if "pair-aware" in runs and REVERT in runs:  # what the revert adds
                    entry["pair_aware_minus_revert_paired"] = {
                        k: _gavel._paired(runs, "pair-aware", REVERT, k) for k in KEYS}
                if "pair-oracle" in modes:
                    gain = entry["curve_minus_mode_paired"]["pair-oracle"]["avg_jct_s"]
                    # a capture of a gain the seeds do not show is noise: no verdict
                    shown = gain["mean"] > gain["ci95"]
                    entry["oracle_gain_beyond_interval"] = bool(shown)
                    entry["capture_of_oracle_gain_avg_jct"] = {
                        m: _capture(runs, m, shown) for m in LEARNERS if m in runs}
                    entry["goal_50pct"] = {m: bool(c >= 0.5) if c is not None else None
                                           for m, c in entry["capture_of_oracle_gain_avg_jct"]
                                           .items()}
                elif "pair-aware" in runs:
                    lead = entry["curve_minus_mode_paired"]["pair-aware"]["avg_jct_s"]
                    entry["goal_no_worse_than_curve"] = bool(lead["mean"] + lead["ci95"] >= 0)
                out[f"{gpu}/{workload}/{signal}"] = entry
    summarise(out)
    return out


def main() -> None:
    """Run, print and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=_gavel.DATA, help="Gavel measurements JSON")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1,
                        help="seeds FIRST_SEED.. (tune away from the evaluation seeds 1-20)")
    parser.add_argument("--signals", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--learners", default=",".join(PRODUCT_LEARNERS),
                        help=f"comma-separated learner modes, of {', '.join(LEARNERS)} "
                             "(curve-only and the oracle always run)")
    parser.add_argument("--keep-from", type=Path, default=None,
                        help="an earlier result of the same seeds and jobs: its learner modes "
                             "not run now are added (curve-only must reproduce it)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="each workload's first JOBS arrivals (default: all 100)")
    parser.add_argument("--summarise", type=Path, default=None,
                        help="add capture intervals and paired learner differences to this "
                             "result file and exit (no run)")
    _common.add_out_option(parser, "interference_progress_sim")
    args = parser.parse_args()
    if args.summarise:
        done = json.loads(args.summarise.read_text())
        summarise(done["results"])
        args.summarise.write_text(_common.scrubbed(json.dumps(done, indent=2)) + "\n")
        return
    signals = tuple(s for s in args.signals.split(",") if s)
    if not signals or any(s not in MODES for s in signals):
        parser.error(f"--signals: choose from {', '.join(MODES)}")
    learners = tuple(m for m in args.learners.split(",") if m)
    if not learners or any(m not in LEARNERS for m in learners):
        parser.error(f"--learners: choose from {', '.join(LEARNERS)}")
    raw = json.loads(args.data.read_text())
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "interference_progress_sim",
        "kind": "simulator on measured data (figures are simulation outputs)",
        "setup": {"seeds": args.seeds, "first_seed": args.first_seed, "gpus": list(GPUS),
                  "workloads": list(WORKLOADS),
                  "modes": {s: list(_modes(s, learners)) for s in signals},
                  "revert_losing_seconds": REVERT_SECONDS, "cluster": "3 x 4 GPUs",
                  "policy": "tandem (packaged config)", "processes": args.processes,
                  "window": f"{WINDOW_OF_MAKESPAN} x curve-only's makespan per seed",
                  "jobs_per_workload": args.jobs or 100},
        "results": run(raw, args.seeds, args.processes, args.jobs, args.first_seed, signals,
                       learners, json.loads(args.keep_from.read_text())["results"]
                       if args.keep_from else None)}
    report["setup"]["campaigns"] = {m: _campaign_cost(raw, m) for m in learners
                                    if CAMPAIGN.fullmatch(m)}
    if args.keep_from:
        report["setup"]["kept_from"] = args.keep_from.name
    report["total_wall_s"] = round(time.perf_counter() - started, 1)
    report.update(_common.context(("numpy", "scipy")))
    _common.write_result(report, args.out)


if __name__ == "__main__":
    main()
