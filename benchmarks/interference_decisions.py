"""Pairing decisions on measured interference: capture of the random-to-best gap, and
losing pairs placed once measured.

Data: Gavel's 26 single-GPU training jobs alone and in every pair on one P100 or one K80
(``shared/data/interference/``, MIT), and twelve jobs on one H100, time-sliced
(``training_data/nvidia-h100-80gb-hbm3/``).

The jobs are placed two per GPU. On each GPU the pair either **shares** it (worth its
measured combined normalised throughput ``1/s_ab + 1/s_ba``) or **takes turns** (worth
1: exclusive GPUs, time-shared). A decision is worth its mean over the GPUs, valued on the
measured matrix. ``best``: the max-weight pairing on ``max(1/s_ab + 1/s_ba, 1)`` (turns
where sharing loses); ``random``: a random pairing, every pair sharing (what a packer
blind to pairs does); ``exclusive``: 1. A method's **capture** is ``(value - random) /
(best - random)``.

Each learner chooses its own pairings for ``k`` rounds, as its placements would: each
round a max-weight pairing by its figures; every pair it shares is measured once, both
ways, as ``log s + N(0, noise_sd)`` (default 0.066: the H100 retest's per-measurement
spread of log slowdown). After ``k`` rounds its final decision is valued. ``losing_placed``
counts the pairs shared in a later round or the final decision that were worse than
taking turns (measured combined below 1) and had been measured before; ``while_learning``
is the mean value of the rounds it ran (what learning cost).

Learners:

- ``calibration_line``: the pair learner of earlier releases
  (:class:`extender.learning.interference.PairLearner`): the other GPU's matrix through a
  calibration line fitted to the pairs seen, untried pairs lifted by the packaged
  exploration bonus, every pair shared; ``calibration_line_no_prior`` without the matrix.
- ``progress``: :class:`extender.learning.progress_pairs.ProgressPairs`: the samples as
  progress gives them, low-rank completion across jobs and GPU types with the other GPU's
  matrix, shrinkage by the estimated noise; its figures judged by **the product's rule**
  (:func:`product_decisions`: :func:`extender.core.pair_cost.judge_row` and ``pair_rule``
  under the packaged policy, as a newcomer beside one training pod): figures only completed
  from other pairs refuse nothing (the product's curve would share them), untried pairs
  lifted by the packaged exploration bonus, measured pairs kept only where their combined
  progress beats 1 (the throughput rule) and they are not measured losers. The product has
  one rule, so the learning rounds and the final decision choose alike;
  ``progress_no_prior`` without the matrix.

On the H100 there is no other GPU's matrix: the learners run without one. Mean and 95%
(t) interval over seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import _common
import networkx as nx
import numpy as np

from extender.config.sections import DEFAULT_MIN_COLOCATION_GAIN
from extender.core import CostPolicy
from extender.core.pair_cost import PairTerms, judge_row, pair_rule
from extender.core.pairs import UNTRIED, PairModel, TypePairs
from extender.learning.interference import PairLearner
from extender.learning.progress_pairs import Estimates, ProgressPairs
from lab.simulator.profiled import import_profiled

_gavel = _common.sibling("interference")
interval = _gavel.interval
CAMPAIGN = _common.ROOT / "training_data" / "nvidia-h100-80gb-hbm3"
KS = (1, 2, 3)
NOISE_SD = 0.066
EXPLORE_BONUS = _gavel.EXPLORE_BONUS
"""The packaged ``learning.pair_explore_bonus`` (the product's optimism for untried pairs)."""
POLICY = CostPolicy(min_colocation_gain_percent=DEFAULT_MIN_COLOCATION_GAIN)
"""The packaged co-location throughput rule."""
FLAT_CURVE = 1.5
GPU_TYPE = "gpu"
OTHER_TYPE = "other"
Matching = list[tuple[int, int]]


def combined(truth: np.ndarray) -> np.ndarray:
    """Measured ``1/s_ab + 1/s_ba`` (0 where the pair cannot share)."""
    inv = np.where(np.isfinite(truth), 1.0 / truth, 0.0)
    out = inv + inv.T
    out[~(np.isfinite(truth) & np.isfinite(truth.T))] = 0.0
    return out


def match(weight: np.ndarray) -> Matching:
    """The max-weight perfect pairing by ``weight[i, j]``."""
    n = len(weight)
    g = nx.Graph()
    for i in range(n):
        for j in range(i + 1, n):
            g.add_edge(i, j, weight=float(weight[i, j]))
    return sorted((min(e), max(e)) for e in nx.max_weight_matching(g, maxcardinality=True))


def value(pairs: Matching, shared: set[tuple[int, int]], truth: np.ndarray) -> float:
    """Measured value per GPU: shared pairs their combined throughput, the rest 1."""
    c = combined(truth)
    return sum(c[i, j] if (i, j) in shared else 1.0 for i, j in pairs) / len(pairs)


def fits(truth: np.ndarray, i: int, j: int) -> bool:
    return bool(np.isfinite(truth[i, j]) and np.isfinite(truth[j, i]))


def measure(truth: np.ndarray, i: int, j: int, rng: np.random.Generator, sd: float
            ) -> tuple[float, float]:
    """Both log slowdowns of a shared pair, as one noisy measurement."""
    return (math.log(truth[i, j]) + rng.normal(0.0, sd),
            math.log(truth[j, i]) + rng.normal(0.0, sd))


Decide = Callable[[bool], tuple[np.ndarray, np.ndarray]]
"""learning -> (weight of each pair, whether it would share)."""


def run_rounds(truth: np.ndarray, k: int, decide: Decide, learn: Callable[[int, int, float,
               float], None], rng: np.random.Generator, sd: float,
               refused: Callable[[], set[tuple[int, int]]] | None = None
               ) -> list[dict[str, Any]]:
    """``k`` rounds of choosing, measuring and learning; after each (and before the
    first) the final decision's value, the mean value of the rounds run so far, the
    losing pairs placed once measured, in them and in that decision, and (with
    ``refused``: the pairs the learner refuses as measured losers) the winning pairs
    refused."""
    c = combined(truth)
    measured: set[tuple[int, int]] = set()
    ran: list[float] = []
    out: list[dict[str, Any]] = []
    losing_learning = 0

    def placed(learning: bool) -> tuple[Matching, set[tuple[int, int]], int]:
        weight, share = decide(learning)
        pairs = match(weight + 1e-9 * rng.random(weight.shape))
        shared = {(i, j) for i, j in pairs if share[i, j] and fits(truth, i, j)}
        return pairs, shared, sum(1 for p in shared if p in measured and c[p] < 1.0)

    for round_ in range(k + 1):
        pairs, shared, losing = placed(False)
        final = value(pairs, shared, truth)
        out.append({"value": final, "while_learning": float(np.mean(ran)) if ran else final,
                    "losing_placed": losing + losing_learning,
                    "winning_refused": sum(1 for p in refused() if c[p] > 1.0)
                    if refused is not None else 0})
        if round_ == k:
            break
        pairs, shared, losing = placed(True)
        losing_learning += losing
        ran.append(value(pairs, shared, truth))
        for i, j in shared:
            x_ij, x_ji = measure(truth, i, j, rng, sd)
            learn(i, j, x_ij, x_ji)
            measured.add((i, j))
    return out


def calibration_line(jobs: list[str], truth: np.ndarray, other: dict[str, Any] | None,
                     k: int, rng: np.random.Generator, sd: float) -> list[dict[str, Any]]:
    """The earlier pair learner choosing its pairings (module docstring)."""
    learner = PairLearner(max_entries=100_000, explore_bonus=0.0, prior=other)
    fallback = float(np.exp(np.median(np.log(truth[np.isfinite(truth)]))))
    n = len(jobs)

    def decide(learning: bool) -> tuple[np.ndarray, np.ndarray]:
        share = np.ones((n, n), dtype=bool)
        model = learner.model()
        if model is None:  # nothing learned, no matrix: a random pairing
            return rng.random((n, n)), share
        figures, untried = _figures(model, jobs, fallback)
        weight = 1 / figures + 1 / figures.T + (_gavel.EXPLORE_BONUS * untried if learning
                                                else 0.0)
        return np.where(_fit_mask(truth), weight, 0.0), share

    def learn(i: int, j: int, x_ij: float, x_ji: float) -> None:
        learner.add(GPU_TYPE, jobs[i], jobs[j], math.exp(x_ij))
        learner.add(GPU_TYPE, jobs[j], jobs[i], math.exp(x_ji))

    return run_rounds(truth, k, decide, learn, rng, sd)


def _figures(model: Any, jobs: list[str], fallback: float) -> tuple[np.ndarray, np.ndarray]:
    """The earlier learner's figures and which are untried (the exploration bonus's)."""
    answers = [[model.figure(GPU_TYPE, a, b, fallback) for b in jobs] for a in jobs]
    return (np.array([[v for v, _ in row] for row in answers]),
            np.array([[s in UNTRIED for _, s in row] for row in answers]))


def _fit_mask(truth: np.ndarray) -> np.ndarray:
    """Pairs that fit in memory (the memory estimate knows them)."""
    return np.isfinite(truth) & np.isfinite(truth.T)


def progress(jobs: list[str], truth: np.ndarray, prior: dict[str, Any] | None, k: int,
             rng: np.random.Generator, sd: float,
             features: dict[str, list[float]] | None = None) -> list[dict[str, Any]]:
    """The progress learner choosing its pairings by the product's rule (module docstring)."""
    learner = ProgressPairs(priors=prior or {}, features=features or {})
    cannot = frozenset(frozenset((jobs[i], jobs[j])) for i, j in zip(
        *np.nonzero(~_fit_mask(truth)), strict=True) if i < j)
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def decide(learning: bool) -> tuple[np.ndarray, np.ndarray]:
        seen = sum(int(st[0]) for st in learner.stats.values())
        if seen not in cache:  # the product's rule has no learning/final distinction
            est = learner.estimate(jobs, [GPU_TYPE])
            cache[seen] = product_decisions(jobs, product_model(est, learner.losing(), cannot))
        return cache[seen]

    def learn(i: int, j: int, x_ij: float, x_ji: float) -> None:
        learner.add(GPU_TYPE, jobs[i], jobs[j], x_ij)
        learner.add(GPU_TYPE, jobs[j], jobs[i], x_ji)

    def refused() -> set[tuple[int, int]]:
        index = {j: i for i, j in enumerate(jobs)}
        return {tuple(sorted(index[m] for m in pair))  # type: ignore[misc]
                for _t, pair in learner.losing()}

    return run_rounds(truth, k, decide, learn, rng, sd, refused)


def product_model(est: Estimates, losing: frozenset[tuple[str, frozenset[str]]],
                  cannot: frozenset[frozenset[str]]) -> PairModel:
    """The model the product's pair learner builds from these figures: the progress figures,
    the pairs measured to lose, the pairs that do not fit, the packaged exploration bonus."""
    return PairModel({GPU_TYPE: est.type_pairs(GPU_TYPE, TypePairs(cannot=cannot), losing)},
                     explore_bonus=EXPLORE_BONUS)


def product_decisions(jobs: list[str], model: PairModel) -> tuple[np.ndarray, np.ndarray]:
    """Each pair judged as the product judges a newcomer beside one training pod, both ways
    (:func:`extender.core.pair_cost.judge_row` and the co-location rule of
    :func:`extender.core.pair_cost.pair_rule` under the packaged policy): whether it shares,
    and its weight, ``2 - loss`` (the combined progress the product's figures give it, the
    exploration bonus included) where it shares and 1 (taking turns) where it does not.
    Gavel gives no utilisation: every job's is the same, so the curve's part of the cost is
    the same for every pair and drops out of the choice."""
    n = len(jobs)
    weight = np.ones((n, n))
    share = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(i + 1, n):
            rows = [judge_row(model, GPU_TYPE, jobs[a], [jobs[b]], [1], _flat_curve)
                    for a, b in ((i, j), (j, i))]
            terms = PairTerms(np.array([r.extra_util for r in rows]),
                              np.array([r.gain for r in rows]),
                              np.array([not r.fits for r in rows]), {})
            ok = bool((pair_rule(np.zeros(2, dtype=int), terms, POLICY) == 0).all())
            share[i, j] = share[j, i] = ok
            if ok:
                weight[i, j] = weight[j, i] = 2.0 - float(np.mean([r.loss for r in rows]))
    return weight, share


def _flat_curve(i: int, j: int) -> float:
    """The curve's figure for every pair (equal utilisations): only a figure never learned
    reads it, and progress completes every pair."""
    return FLAT_CURVE


def _logs(truth: np.ndarray, jobs: list[str]) -> dict[tuple[str, str], float]:
    return {(a, b): math.log(truth[i, j]) for i, a in enumerate(jobs)
            for j, b in enumerate(jobs) if i != j and np.isfinite(truth[i, j])}


def transfer(jobs: list[str], truth: np.ndarray, other: np.ndarray) -> dict[str, float]:
    """Before any pair is measured here (k = 0): the spread (sd) of the log slowdowns the
    progress learner completes from the other GPU's matrix, the true and the other
    matrix's spread, and the completed figures' correlation with the truth."""
    logs = _logs(other, jobs)
    est = ProgressPairs(priors={OTHER_TYPE: logs}).estimate(jobs, [GPU_TYPE])
    keys = [k for k in _logs(truth, jobs) if k in logs]
    got = np.array([est.figures[(GPU_TYPE, *k)].log for k in keys])
    true = np.array([math.log(truth[jobs.index(a), jobs.index(b)]) for a, b in keys])
    return {"completed_sd": round(float(got.std()), 4), "true_sd": round(float(true.std()), 4),
            "other_sd": round(float(np.std([logs[k] for k in keys])), 4),
            "correlation": round(float(np.corrcoef(got, true)[0, 1]), 4)}


def one_gpu(jobs: list[str], truth: np.ndarray, other: np.ndarray | None, seeds: int,
            sd: float, only: frozenset[str] | None = None, first_seed: int = 0
            ) -> dict[str, Any]:
    """Every learner (or those in ``only``) and ``k`` over seeds ``first_seed`` onward
    (``seeds`` of them) on one GPU's matrix."""
    c = combined(truth)
    n = len(jobs)
    best_pairs = match(np.maximum(np.where(_fit_mask(truth), c, 0.0), 1.0))
    best = value(best_pairs, {p for p in best_pairs if c[p] > 1.0}, truth)
    rng = np.random.default_rng(0)
    randoms = []
    for _ in range(seeds):
        pairs = match(np.where(_fit_mask(truth), rng.random((n, n)), -1.0))
        randoms.append(value(pairs, {p for p in pairs if fits(truth, *p)}, truth))
    random = float(np.mean(randoms))
    methods: dict[str, Callable[[int, np.random.Generator], dict[str, Any]]] = {
        "calibration_line_no_prior": lambda k, r: calibration_line(jobs, truth, None, k, r, sd),
        "progress_no_prior": lambda k, r: progress(jobs, truth, None, k, r, sd)}
    if other is not None:
        logs = _logs(other, jobs)
        table = _gavel.PairTable({a: {b: math.exp(v) for (aa, b), v in logs.items() if aa == a}
                                  for a in jobs}, frozenset())
        methods["calibration_line"] = lambda k, r: calibration_line(
            jobs, truth, {OTHER_TYPE: table}, k, r, sd)
        methods["progress"] = lambda k, r: progress(jobs, truth, {OTHER_TYPE: logs}, k, r, sd)
    if only is not None:
        methods = {m: run for m, run in methods.items() if m in only}
    capture = lambda v: (v - random) / (best - random)  # noqa: E731
    out: dict[str, Any] = {"jobs": n, "best": round(best, 4),
                           "best_turns": sum(1 for p in best_pairs if c[p] <= 1.0),
                           "random": interval(randoms), "exclusive": 1.0,
                           "losing_pairs_share": round(float(np.mean(
                               (c[np.triu_indices(n, 1)] < 1.0)[_fit_mask(truth)[
                                   np.triu_indices(n, 1)]])), 3)}
    for name, run in methods.items():
        per_seed = [run(max(KS), np.random.default_rng(seed))
                    for seed in range(first_seed, first_seed + seeds)]
        per_k: dict[str, Any] = {}
        for k in (0, *KS):
            runs = [rounds[k] for rounds in per_seed]
            values = [r["value"] for r in runs]
            per_k[f"k={k}"] = {
                "value": interval(values),
                "capture": interval([capture(v) for v in values]),
                "below_exclusive_seeds": sum(1 for v in values if v < 1.0),
                "while_learning_capture": interval([capture(r["while_learning"])
                                                    for r in runs]),
                "losing_placed": interval([float(r["losing_placed"]) for r in runs]),
                "losing_placed_total": int(sum(r["losing_placed"] for r in runs)),
                "winning_refused": interval([float(r["winning_refused"]) for r in runs])}
        out[name] = per_k
    out["goal_50pct_by_k3"] = {m: bool(out[m]["k=3"]["capture"]["mean"] >= 0.5)
                               for m in methods}
    if other is not None and "progress" in methods:
        out["progress_transfer_k0"] = transfer(jobs, truth, other)
    return out


def h100(seeds: int, sd: float, only: frozenset[str] | None = None, first_seed: int = 0
         ) -> dict[str, Any]:
    """The twelve H100 jobs (no other GPU's matrix)."""
    _, table, models = import_profiled(CAMPAIGN)
    jobs = sorted(models)
    truth = np.array([[table.slowdown.get(a, {}).get(b, 1.0) for b in jobs] for a in jobs])
    if only is not None:  # no other GPU's matrix here: a learner runs as its no-prior self
        only = frozenset(m if m.endswith("_no_prior") else f"{m}_no_prior" for m in only)
    out = one_gpu(jobs, truth, None, seeds, sd, only, first_seed)
    best, random = out["best"], out["random"]["mean"]
    out["no_harm_points"] = {m: round(float(100 * (out[m]["k=3"]["value"]["mean"] - random)
                                            / best), 2)
                             for m in ("calibration_line_no_prior", "progress_no_prior")
                             if m in out}
    out["goal_no_harm"] = {m: bool(v >= -0.5) for m, v in out["no_harm_points"].items()}
    return out


def _one(raw: dict[str, Any], seeds: int, sd: float, only: frozenset[str] | None,
         first_seed: int, gpu: str) -> dict[str, Any]:
    """One GPU's figures (the H100's, or a Gavel GPU's with the other's matrix)."""
    if gpu == "h100":
        return h100(seeds, sd, only, first_seed)
    jobs, truth = _gavel.matrix(raw, gpu)
    other_jobs, other = _gavel.matrix(raw, _gavel.OTHER[gpu])
    assert other_jobs == jobs
    return one_gpu(jobs, truth, other, seeds, sd, only, first_seed)


def _kept(report: dict[str, Any], earlier: Path, ran: frozenset[str]) -> None:
    """The earlier learners' figures (``calibration_line*``, code unchanged) from
    ``earlier`` (a result of this benchmark), each GPU's and their goal verdicts, so that
    one file compares them without rerunning them."""
    old = json.loads(earlier.read_text())
    report["setup"]["kept_from_earlier_run"] = {"file": earlier.name,
                                                "date": old.get("date"),
                                                "command": old.get("command")}
    for gpu, figures in report["gpus"].items():
        before = old["gpus"].get(gpu) or {}
        for name, entry in before.items():
            if isinstance(entry, dict) and "k=3" in entry and name not in ran \
                    and name.startswith("calibration_line"):
                figures[name] = entry
        for verdicts in ("goal_50pct_by_k3", "no_harm_points", "goal_no_harm"):
            if verdicts in before:
                figures[verdicts] = {**{m: v for m, v in before[verdicts].items()
                                        if m.startswith("calibration_line")},
                                     **figures.get(verdicts, {})}


def main() -> None:
    """Run every GPU, print and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=_gavel.DATA, help="Gavel measurements JSON")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the first learner seed (tune on seeds away from 0-19, the "
                        "evaluation's)")
    parser.add_argument("--noise-sd", type=float, default=NOISE_SD)
    parser.add_argument("--gpus", default="p100,k80,h100")
    parser.add_argument("--methods", default=None,
                        help="comma-separated learners to run (default: all)")
    parser.add_argument("--keep-from", type=Path, default=None,
                        help="with --methods: the other learners' figures from this earlier "
                        "result")
    parser.add_argument("--processes", type=int, default=1,
                        help="processes for the GPUs (each GPU's figures are the same however "
                        "many)")
    _common.add_out_option(parser, "interference_decisions")
    args = parser.parse_args()
    raw = json.loads(args.data.read_text())
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "interference_decisions",
        "kind": "offline decisions on measured matrices (values are measured throughputs)",
        "setup": {"seeds": args.seeds, "first_seed": args.first_seed,
                  "noise_sd_log": args.noise_sd, "ks": list(KS),
                  "progress_rule": "the product's (extender.core.pair_cost.judge_row, pair_rule)",
                  "explore_bonus": EXPLORE_BONUS,
                  "min_colocation_gain_percent": DEFAULT_MIN_COLOCATION_GAIN,
                  "processes": args.processes},
        "gpus": {}}
    gpus = args.gpus.split(",")
    only = frozenset(args.methods.split(",")) if args.methods else None
    run = partial(_one, raw, args.seeds, args.noise_sd, only, args.first_seed)
    results = _common.map_tasks(run, gpus, args.processes)
    report["gpus"] = dict(zip(gpus, results, strict=True))
    if only is not None and args.keep_from is not None:
        _kept(report, args.keep_from, only)
    report["total_wall_s"] = round(time.perf_counter() - started, 1)
    report.update(_common.context(("numpy", "scipy", "networkx")))
    _common.write_result(report, args.out)


if __name__ == "__main__":
    main()
