"""Benchmark: online learning of utilisation against fixed priors and oracle knowledge.

The world differs from what the extender believes. Each workload's jobs are
grouped into models (``lab.simulator.workloads.with_models``: by
utilisation, each model's prior the mean of its jobs). Three truths, each with
its own interference curve per GPU type (so the curve error is reported under
every truth):

- ``random`` (per-model error of both signs): each model's true utilisation is
  its prior times a factor drawn uniformly in [0.5, 1.5], and each GPU type's
  true curve is the configured curve with every coefficient times a factor drawn
  in the same range (seeded; ``lab.simulator.truth.factor_truth``).
- ``systematic`` (far from the priors in the direction that matters for
  placement): every model really uses half the utilisation its prior says and
  each GPU type's true curve is the configured one with every coefficient halved,
  so the prior packs too little; that is the case learning is for.
- ``optimistic`` (far from the priors the other way): twice the utilisation
  (capped at 100) and every coefficient doubled: the prior packs jobs that slow
  each other down far more than it believes.

Every truth also has the phases a real job shows the agent (``PHASES``): its first
60 s at 5% of its utilisation (loading, compiling) and an evaluation phase of 30 s
at 20% every 600 s. The simulated agents report what a 1 Hz agent would: one
report a minute of constant load, each weighed by the time it covers (the
learner's estimates and curve points are the same as at 1 Hz; see
``lab/simulator/agents.py``), with Gaussian noise (sd 2 points; on a shared
GPU a job's utilisation over the GPU's true slowdown, the signal curve learning
reads; ``--signal time-sliced``: the GPU's utilisation, as an H100 time-slicing
two jobs showed, which the learner sets aside, so that only pods alone on a GPU
teach). The ``tandem`` policy runs three ways on the same trace:

- ``online``: learns with the extender's own ``Learner`` and packaged
  ``learning`` configuration (trusted estimates, the learned curves);
- ``prior``: keeps the priors (the trained model's answer and the configured
  curves, never corrected);
- ``oracle``: knows the truth (utilisation and curves).

Each (truth, workload) runs for ``--seeds`` seeds (workload and truth both
seeded; default 5). Per seed: the learning curve of the online run (mean and max
over (model, GPU count, GPU type) of |believed - true| utilisation, and the mean
|believed - true| slowdown over cumulative utilisations 25..200%, after
50/100/200/500 completed jobs and at the end) and makespan, mean JCT and mean
wait of each run, and how many estimates were observed and how many were
predictions corrected by the learned bias (``prior-corrected:<n>``). Over the
seeds: the mean and 95% interval (Student t) of ``online / prior - 1`` and
``online / oracle - 1`` (makespan), of the utilisation error after 200 jobs and
of the final curve errors. ``online / prior - 1`` is taken per seed, so its
interval is a paired one (both runs see the same trace and truth); the paired
difference in seconds (``online_minus_prior_makespan_s``) and, for comparison,
the unpaired interval of the two runs' mean makespans (Welch,
``online_vs_prior_makespan_unpaired``, far wider: seeds differ more than the
runs of one seed) are reported beside it.

Goals, restated on that basis: (1) where the priors are wrong, online finishes
ahead of the priors by more than the interval (the upper end of the 95% interval
of the paired ``online / prior - 1`` is below 0); (2) at the real reporting cadence the
utilisation error after 200 completed jobs is at most 5 points (mean over the
seeds, with its interval), on the production-like trace (the W-Small and
W-Large traces have 100 jobs).

Usage: ``.venv/bin/python benchmarks/learning.py [--seeds N] [--production-jobs N]
[--truths T,..] [--workloads W,..] [--no-prior-correction] [--signal S] [--out FILE]``;
prints one JSON object and writes it to ``benchmarks/results/learning.json`` (or ``--out``).
``--no-prior-correction`` is the ablation: predictions of keys not observed yet are
not corrected by the bias learned on the observed ones.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from typing import Any

import _common
import numpy as np
from scipy import stats

from extender.config.loader import load_config
from extender.learning import bias
from lab.simulator.belief import MODES, SimKnowledge, SimWorld
from lab.simulator.cluster import builtin_cluster
from lab.simulator.engine import JobRun
from lab.simulator.jobs import SimJob
from lab.simulator.policies import tandem_cost
from lab.simulator.runner import simulate
from lab.simulator.signal import SIGNAL_MODELS, SignalModel
from lab.simulator.truth import Phases, Truth, factor_truth, truth_document
from lab.simulator.workloads import generate, production, with_models
from predictor.curves import InterferenceCurve

CHECKPOINTS = (50, 100, 200, 500)
FACTOR_RANGE = (0.5, 1.5)
NOISE_SD = 2.0
GOAL_ERROR_POINTS = 5.0
SYSTEMATIC_UTIL_FACTOR = 0.5
SYSTEMATIC_CURVE_FACTOR = 0.5
OPTIMISTIC_UTIL_FACTOR = 2.0
OPTIMISTIC_CURVE_FACTOR = 2.0
TRUTHS = ("random", "systematic", "optimistic")
WORKLOADS = ("w-small", "w-large", "production")
PHASES = Phases(warmup_seconds=60.0, warmup_util_factor=0.05, eval_every_seconds=600.0,
                eval_seconds=30.0, eval_util_factor=0.2)
"""What every truth's jobs show the agents besides their steady utilisation."""
CURVE_GRID = tuple(range(25, 201, 25))
"""Cumulative utilisations (%) at which a believed curve is compared with the truth's."""


def _scaled(curve: InterferenceCurve, factor: float) -> InterferenceCurve:
    return InterferenceCurve(*(round(c * factor, 6) for c in curve.coefficients()))


def make_truth(kind: str, models: list[str], types: list[str], seed: int) -> Truth:
    """The ``random``, ``systematic`` or ``optimistic`` truth of the module docstring."""
    if kind not in TRUTHS:
        raise ValueError(f"unknown truth {kind!r} (valid: {', '.join(TRUTHS)})")
    cost = tandem_cost()
    if kind == "random":
        base = factor_truth(models, *FACTOR_RANGE, seed=seed, util_stddev_percent=NOISE_SD)
        rng = np.random.default_rng(seed + 10_000)  # apart from the models' draws
        factors = rng.uniform(*FACTOR_RANGE, size=len(types))
        curves = {t: _scaled(cost.curve_for(t), float(f))
                  for t, f in zip(types, factors, strict=True)}
    else:
        util_factor, curve_factor = (SYSTEMATIC_UTIL_FACTOR, SYSTEMATIC_CURVE_FACTOR) \
            if kind == "systematic" else (OPTIMISTIC_UTIL_FACTOR, OPTIMISTIC_CURVE_FACTOR)
        base = factor_truth(models, util_factor, util_factor, seed=seed,
                            util_stddev_percent=NOISE_SD)
        curves = {t: _scaled(cost.curve_for(t), curve_factor) for t in types}
    return replace(base, curves=curves, phases=PHASES)


def _representatives(jobs: list[SimJob]) -> dict[tuple[str, int], SimJob]:
    """One job per (model, GPUs per pod): estimates are kept per GPU count."""
    reps: dict[tuple[str, int], SimJob] = {}
    for job in jobs:
        reps.setdefault((job.model, job.gpus_per_task), job)
    return reps


def _errors(knowledge: SimKnowledge, truth: Truth, reps: dict[tuple[str, int], SimJob],
            types: list[str]) -> dict[str, Any]:
    """|believed - true| utilisation per (model, GPU count, GPU type), as resolved."""
    values: list[float] = []
    observed = corrected = 0
    for _, job in sorted(reps.items()):
        for t in types:
            d = knowledge.demand(JobRun(0, job)).for_type(t)
            assert d is not None
            values.append(abs(d.util_percent - truth.util_of(job, t)))
            observed += d.source.startswith("observed:")
            corrected += d.source.startswith("prior-corrected:")
    return {"mean_abs_error_points": round(sum(values) / len(values), 2),
            "max_abs_error_points": round(max(values), 2),
            "observed_estimates": observed, "prior_corrected_estimates": corrected,
            "estimates": len(values)}


def _curve_error(knowledge: SimKnowledge, truth: Truth, types: list[str]) -> float | None:
    """Mean |believed - true| slowdown over ``CURVE_GRID`` and GPU types."""
    if not truth.curves:
        return None
    believed = knowledge.policy(tandem_cost())
    gaps = [abs(believed.curve_for(t).slowdown(u) - truth.curves[t].slowdown(u))
            for t in types if t in truth.curves for u in CURVE_GRID]
    return round(sum(gaps) / len(gaps), 3) if gaps else None


def scenario(name: str, jobs: list[SimJob], cluster: str, seed: int,
             truth_kind: str = "random", prior_correction: bool = True,
             signal: str = "proportional") -> dict[str, Any]:
    """The three runs on one workload under one truth, with the online run's learning curve
    (``signal``: what the agents show of a shared GPU's jobs, :mod:`lab.simulator.signal`)."""
    nodes = builtin_cluster(cluster)
    types = sorted({g.gpu_type for n in nodes for g in n.gpus})
    reps = _representatives(jobs)
    truth = replace(make_truth(truth_kind, sorted({m for m, _ in reps}), types, seed),
                    signal=SignalModel(signal))
    learning = replace(load_config(None, environ={}).learning, prior_correction=prior_correction)
    runs: dict[str, Any] = {}
    curve: list[dict[str, Any]] = []
    for mode in MODES:
        world = SimWorld.build(truth, mode, learning, types)
        if mode == "online":
            online_world = world

            def checkpoint(done: int, world: SimWorld = world) -> None:
                if done in CHECKPOINTS or done == len(jobs):
                    curve.append({"completed_jobs": done, "samples": world.agents.samples,
                                  **_errors(world.knowledge, truth, reps, types),
                                  "curve_error_slowdown": _curve_error(world.knowledge, truth,
                                                                       types)})
            world.agents.on_completed = checkpoint
        started = time.perf_counter()
        r = simulate(jobs, nodes, "tandem", world=world)
        runs[mode] = {"makespan_s": round(r.makespan_s, 1), "avg_jct_s": round(r.avg_jct_s, 1),
                      "avg_wait_s": round(r.avg_wait_s, 1),
                      "avg_gpu_util": round(r.avg_gpu_util, 2),
                      "avg_slowdown": round(r.avg_slowdown, 3), "oom_events": r.oom_events,
                      "finished": r.finished, "samples": world.agents.samples,
                      "curve_error_slowdown": _curve_error(world.knowledge, truth, types),
                      "wall_s": round(time.perf_counter() - started, 1)}
        if mode == "prior":
            runs[mode]["error"] = _errors(world.knowledge, truth, reps, types)
    online, prior, oracle = (runs[m]["makespan_s"] for m in MODES)
    after_200 = next((p for p in curve if p["completed_jobs"] >= 200), None)
    curves = [{k: row[k] for k in ("gpu_type", "curve", "r2", "points", "outliers", "refits")}
              for row in online_world.agents.learner.curves.view()]
    return {"truth_kind": truth_kind, "workload": name, "cluster": cluster,
            "gpus": sum(len(n.gpus) for n in nodes),
            "jobs": len(jobs), "models": len({m for m, _ in reps}), "truth_seed": seed,
            "prior_mean_abs_error_points": runs["prior"]["error"]["mean_abs_error_points"],
            "truth": truth_document(truth), "runs": runs, "learning_curve": curve,
            "learned_curves": curves,
            "online_vs_prior_makespan": round(online / prior - 1.0, 4),
            "online_vs_oracle_makespan": round(online / oracle - 1.0, 4),
            "oracle_vs_prior_makespan": round(oracle / prior - 1.0, 4),
            "error_after_200_jobs_points": after_200["mean_abs_error_points"]
            if after_200 else None}


def interval(values: list[float]) -> dict[str, Any]:
    """Mean and 95% interval (Student t) of ``values``; None fields when there are none."""
    xs = [v for v in values if v is not None]
    if not xs:
        return {"n": 0, "mean": None, "low": None, "high": None}
    mean = sum(xs) / len(xs)
    if len(xs) == 1:
        return {"n": 1, "mean": round(mean, 4), "low": None, "high": None}
    half = float(stats.t.ppf(0.975, len(xs) - 1)) * float(np.std(xs, ddof=1)) / math.sqrt(len(xs))
    return {"n": len(xs), "mean": round(mean, 4), "low": round(mean - half, 4),
            "high": round(mean + half, 4)}


def unpaired(online: list[float], prior: list[float]) -> dict[str, Any]:
    """``mean(online) / mean(prior) - 1`` with the 95% interval of two independent samples
    (Welch), for comparison with the paired interval (the same seed's runs differ far less
    from each other than seeds do)."""
    n = len(online)
    if n < 2 or len(prior) != n:
        return {"n": n, "mean": None, "low": None, "high": None}
    mo, mp = sum(online) / n, sum(prior) / n
    vo, vp = float(np.var(online, ddof=1)) / n, float(np.var(prior, ddof=1)) / n
    dof = (vo + vp) ** 2 / ((vo * vo + vp * vp) / (n - 1)) if vo + vp > 0 else n - 1
    half = float(stats.t.ppf(0.975, dof)) * math.sqrt(vo + vp)
    return {"n": n, "mean": round((mo - mp) / mp, 4), "low": round((mo - mp - half) / mp, 4),
            "high": round((mo - mp + half) / mp, 4)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the seeds of one (truth, workload): intervals and the restated goals."""
    online_vs_prior = interval([r["online_vs_prior_makespan"] for r in runs])
    error_200 = interval([r["error_after_200_jobs_points"] for r in runs])
    final = [r["learning_curve"][-1] for r in runs if r["learning_curve"]]
    return {
        "truth_kind": runs[0]["truth_kind"], "workload": runs[0]["workload"],
        "seeds": [r["truth_seed"] for r in runs],
        "online_vs_prior_makespan": online_vs_prior,
        "online_minus_prior_makespan_s": interval([r["runs"]["online"]["makespan_s"]
                                                   - r["runs"]["prior"]["makespan_s"]
                                                   for r in runs]),
        "online_vs_prior_makespan_unpaired": unpaired(
            [r["runs"]["online"]["makespan_s"] for r in runs],
            [r["runs"]["prior"]["makespan_s"] for r in runs]),
        "online_vs_oracle_makespan": interval([r["online_vs_oracle_makespan"] for r in runs]),
        "oracle_vs_prior_makespan": interval([r["oracle_vs_prior_makespan"] for r in runs]),
        "prior_error_points": interval([r["prior_mean_abs_error_points"] for r in runs]),
        "error_after_200_jobs_points": error_200,
        "final_error_points": interval([p["mean_abs_error_points"] for p in final]),
        "online_curve_error_slowdown": interval([p["curve_error_slowdown"] for p in final]),
        "prior_curve_error_slowdown": interval([r["runs"]["prior"]["curve_error_slowdown"]
                                                for r in runs]),
        "goals": {
            "online_ahead_of_prior_beyond_interval": online_vs_prior["high"] is not None
            and online_vs_prior["high"] < 0,
            "error_after_200_jobs_at_most_5_points": None if error_200["mean"] is None
            else error_200["mean"] <= GOAL_ERROR_POINTS,
        },
    }


def _workloads(seed: int, production_jobs: int) -> list[tuple[str, list[SimJob], str]]:
    large = builtin_cluster("large")
    prod = production(seed, jobs=production_jobs, gpus=sum(len(n.gpus) for n in large))
    return [("w-small", with_models(generate("w-small", seed), 10), "testbed"),
            ("w-large", with_models(generate("w-large", seed), 10), "testbed"),
            ("production", with_models(prod, 20), "large")]


def main() -> None:
    """Every truth on the three workloads over the seeds; print and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--production-jobs", type=int, default=500,
                        help="jobs in the production-like trace (default 500 of its 2000, so "
                             "five seeds run in minutes; the 200-job checkpoint is reached)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N (default 5)")
    parser.add_argument("--truths", default=",".join(TRUTHS),
                        help="comma-separated truths to run (default: all)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="comma-separated workloads to run (default: all)")
    parser.add_argument("--signal", default="proportional", choices=sorted(SIGNAL_MODELS),
                        help="what the agents show of a shared GPU's jobs (time-sliced: the "
                             "GPU's figure, as an H100 showed; the learner sets it aside)")
    parser.add_argument("--no-prior-correction", action="store_true",
                        help="learning.prior_correction off (the ablation: observed "
                             "estimates alone)")
    _common.add_out_option(parser, "learning")
    args = parser.parse_args()
    started = time.perf_counter()
    truths, workloads = args.truths.split(","), args.workloads.split(",")
    if not set(truths) <= set(TRUTHS) or not set(workloads) <= set(WORKLOADS):
        parser.error(f"truths are {', '.join(TRUTHS)}; workloads {', '.join(WORKLOADS)}")
    per_seed: list[dict[str, Any]] = []
    for seed in range(1, args.seeds + 1):
        for name, jobs, cluster in _workloads(seed, args.production_jobs):
            if name in workloads:
                per_seed += [scenario(name, jobs, cluster, seed, kind,
                                      not args.no_prior_correction, args.signal)
                             for kind in truths]
    summaries = [summarise([r for r in per_seed
                            if (r["truth_kind"], r["workload"]) == (kind, name)])
                 for kind in truths for name in workloads]
    report: dict[str, Any] = {
        "benchmark": "learning",
        "setup": {"truths": {
                      "random": {"util_factor_range": list(FACTOR_RANGE),
                                 "curve_coefficient_factor_range": list(FACTOR_RANGE)},
                      "optimistic": {"util_factor": OPTIMISTIC_UTIL_FACTOR,
                                     "curve_coefficient_factor": OPTIMISTIC_CURVE_FACTOR},
                      "systematic": {"util_factor": SYSTEMATIC_UTIL_FACTOR,
                                     "curve_coefficient_factor": SYSTEMATIC_CURVE_FACTOR}},
                  "phases": dict(PHASES.__dict__), "noise_sd_points": NOISE_SD,
                  "signal": args.signal,
                  "reporting": "one report a minute of constant load, weighed by time "
                               "(equivalent to 1 Hz for the learner)",
                  "seeds": args.seeds, "checkpoints": list(CHECKPOINTS),
                  "policy": "tandem (packaged config)",
                  "learning": replace(load_config(None, environ={}).learning,
                                      prior_correction=not args.no_prior_correction).__dict__,
                  "prior_bias": {"min_models": bias.MIN_MODELS, "max_factor": bias.MAX_FACTOR,
                                 "ceiling_percent": bias.CEILING,
                                 "min_change_log": bias.MIN_CHANGE},
                  "production_jobs": args.production_jobs,
                  "production_reduced": args.production_jobs < 2000},
        "summaries": summaries,
        "scenarios": [{k: v for k, v in r.items() if k != "truth"} for r in per_seed],
    }
    report["total_wall_s"] = round(time.perf_counter() - started, 1)
    report.update(_common.context(("numpy", "scipy")))
    _common.write_result(report, args.out)


if __name__ == "__main__":
    main()
