"""Pairwise interference: does learning who slows whom place jobs better than the curve?

Data: Gavel's measured throughputs of 26 single-GPU training jobs alone and in
every pair sharing one P100 or one K80 (``shared/data/interference/``, MIT).

(a) **Offline pairing.** The 26 jobs are paired onto 13 GPUs by a maximum-weight
matching on ``1/s_ab + 1/s_ba`` computed from each method's predicted slowdowns;
a pairing is worth its *measured* combined normalised throughput per GPU (1.0 =
one job alone). Methods: the measured matrix (the best possible); the
best-fitting Horus-style curve (each job's utilisation and the curve's three
coefficients fitted by least squares on log slowdown over every measured pair:
better than any curve learner could get); the extender's pair learner
(:class:`extender.learning.interference.PairLearner`, the code decisions use)
after it has seen each job in ``k`` random pairings (``k`` random perfect
matchings, both directions of each pair, measured figures), over ``--seeds``
seeds, alone and with the *other* GPU's measured matrix as its prior
(``learning.pair_prior``: the K80's matrix for the P100 and the reverse; never
the matrix under test). The same learner also chooses its own ``k`` pairings
(``learner_choosing``, :func:`chosen_pairings`), as its placements do on a cluster: each a
max-weight pairing by its figures with untried pairs lifted by the packaged exploration
bonus; ``while_learning_of_matrix`` is what the pairings it ran were worth, the cost of
learning. Pairs that do not fit in memory are known to every method (the memory
estimate knows them), so no method picks one. A diagnostic, ``best_line_with_seen``, puts
the other GPU's matrix through the best calibration line there is (fitted to every
measured pair) with the pairs seen exact: the most the learner's model of a matrix prior
can reach from random pairings. ``pairings_for_goal_with_other_gpu_matrix`` says how
many random pairings per job the learner with that matrix needs for 97% (up to 16).
Another, ``profile_on_every_pair``,
pairs by the learner's per-model profile (sensitivity and aggressiveness) fitted
to every measured pair, without the pairs themselves: what the learner's
generalisation to unseen pairs is worth at best (it uses the truth; not a method).

(b) **Simulator.** The imported truths (``tandem import-interference``) on a
12-GPU cluster of each type (3 nodes x 4), the w-large workload with each job's
model drawn from the truth's 26 (``--models truth``), the tandem policy under
both signal models (what agents show: utilisation / slowdown, or / sqrt(slowdown);
the learners are never told): online pair-aware (``learning.pairs: true``) with
the other GPU's matrix as ``learning.pair_prior`` (``pair-aware+matrix``), with
that matrix's model names shuffled (``pair-aware+wrong-matrix``: what a matrix
that tells nothing costs), and without (``pair-aware``); ``:two-only`` beside a
mode learns only from GPUs shared by two (``learning.pair_groups: false``: what
the group samples of GPUs shared by three or more add); ``:warm`` beside a mode
starts from the learning document its learner left after an earlier workload of
the same mix on the same cluster (another seed's jobs; an extender that has run
there before, restarted: what the persisted, bounded document carries), and is
compared with curve-only warmed the same way; online curve-only
(today's learner), fixed priors, and the oracle (the truth's utilisation and
measured pairs); and ``pair-oracle``, curve-only's online learner
given every measured pair (what knowing the pairs alone is worth, a diagnostic).
Mean and 95% interval (t) over seeds of the average JCT and the makespan, and
what each pair-aware learner had by the end: directed pairs seen, pairs solved
from group samples, pair and group samples taken. Each goal also says whether the
oracle itself is ahead of curve-only by more than the interval (what no learner can
beat), and ``where_vs_curve`` says where each mode's time goes against curve-only,
paired per seed: waiting, running (slowed by neighbours) and GPU utilisation. Memory and SLO
sessions are unchanged (the training workload has none).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import _common
import networkx as nx
import numpy as np
import xgboost as xgb
from scipy.optimize import least_squares
from scipy.stats import t as student_t

from contracts.interferencefile import PairTable
from extender.config.loader import load_config
from extender.config.sections import LearningConfig
from extender.core.pairs import UNTRIED, PairModel, TypePairs
from extender.core.snapshot import NodeSpec
from extender.learning.interference import PairLearner
from extender.learning.pair_fit import MAX_LOG
from lab.simulator.belief import SimKnowledge, SimWorld, oracle_pairs
from lab.simulator.cluster import uniform_cluster
from lab.simulator.jobs import SimJob
from lab.simulator.pairwise import GAVEL_GPUS, gavel_model_name, import_gavel
from lab.simulator.policies import PolicyOptions, tandem_cost
from lab.simulator.runner import simulate
from lab.simulator.signal import SignalModel
from lab.simulator.truth import Truth
from lab.simulator.workloads import generate, with_named_models

_DATA = Path("shared") / "data" / "interference" / "gavel-p100-k80.json"
DATA = next((base / _DATA for base in (_common.ROOT, *_common.ROOT.parents)
             if (base / _DATA).exists()), _common.ROOT / _DATA)
"""The Gavel file: the first ``shared/data/interference/`` at or above the repository."""
GPUS = ("p100", "k80")
OTHER = {"p100": "k80", "k80": "p100"}
"""The GPU whose measured matrix is the learner's prior (never the one under test)."""
KS = (1, 2, 3)
MORE_KS = (4, 6, 8, 12, 16)
"""More random pairings per job, for how many the goal takes (``pairings_for_goal``)."""
OFFLINE_METHODS = ("learner", "learner_with_other_gpu_matrix", "seen_pairs_only",
                   "features_on_other_gpu_and_seen", "best_line_with_seen")
"""The learner alone and with the other GPU's matrix as its prior (what the extender
does), and three diagnostics: the pairs seen and nothing else, a feature model, and the
other GPU's matrix through the best calibration line there is."""
EXPLORE_BONUS = LearningConfig().pair_explore_bonus
"""The packaged exploration bonus: an untried pair's weight in a chosen pairing."""
MAX_SLOWDOWN = math.exp(MAX_LOG)
"""The figure a matrix's cannot-share pair takes where a slowdown is needed (the learner's
largest, a slowdown of 20)."""
GOAL_OF_MATRIX = 0.97
GOAL_VS_ORACLE = 0.05
MEMORY_MIB = {"p100": 16280, "k80": 11441}


def matrix(raw: dict[str, Any], gpu: str) -> tuple[list[str], np.ndarray]:
    """Job names and ``S[a, b]`` (a's slowdown beside b; inf: cannot share)."""
    _, table = import_gavel(raw, gpu)
    jobs = sorted(gavel_model_name(j) for j in raw["gpus"][gpu])
    s = np.full((len(jobs), len(jobs)), np.inf)
    for i, a in enumerate(jobs):
        for j, b in enumerate(jobs):
            v = table.listed(a, b)
            if v is not None and table.can_share(a, b):
                s[i, j] = v
    return jobs, s


def best_pairs(weight: np.ndarray, truth: np.ndarray) -> list[tuple[int, int]]:
    """The max-weight pairing by ``weight[i, j]`` (i < j), among pairs that fit."""
    n = len(truth)
    g = nx.Graph()
    for i in range(n):
        for j in range(i + 1, n):
            if np.isfinite(truth[i, j]) and np.isfinite(truth[j, i]):
                g.add_edge(i, j, weight=weight[i, j])
    return [(min(e), max(e)) for e in nx.max_weight_matching(g, maxcardinality=True)]


def measured_value(pairs: list[tuple[int, int]], truth: np.ndarray) -> float:
    """Measured combined normalised throughput per GPU of ``pairs``."""
    return sum(1 / truth[i, j] + 1 / truth[j, i] for i, j in pairs) / (len(truth) // 2)


def pairing_value(predicted: np.ndarray, truth: np.ndarray) -> float:
    """Measured throughput per GPU of the max-weight pairing by ``predicted`` slowdowns."""
    return measured_value(best_pairs(1 / predicted + 1 / predicted.T, truth), truth)


def best_curve(truth: np.ndarray) -> np.ndarray:
    """The best-fitting curve's symmetric predictions (module docstring)."""
    n = len(truth)
    ii, jj = np.nonzero(np.isfinite(truth) & ~np.eye(n, dtype=bool))
    y = np.log(truth[ii, jj])

    def slow(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        x = p[3 + a] + p[3 + b]
        over = np.maximum(x - 1, 0)
        return 1 + p[0] * np.minimum(x, 1) + p[1] * over + p[2] * over * over

    best = None
    upper = np.concatenate([[10, 10, 10], np.full(n, 1.5)])
    for start in (0.3, 0.5, 0.7):
        p0 = np.concatenate([[0.5, 0.5, 0.1], np.full(n, start)])
        fit = least_squares(lambda p: np.log(slow(p, ii, jj)) - y, p0,
                            bounds=(np.zeros(3 + n), upper))
        if best is None or fit.cost < best.cost:
            best = fit
    assert best is not None
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return slow(best.x, a, b)


def seen_pairings(n: int, k: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """The pairs of ``k`` random perfect matchings of ``n`` jobs (each job seen ``k`` times)."""
    seen = []
    for _ in range(k):
        order = rng.permutation(n)
        seen += [(int(order[x]), int(order[x + 1])) for x in range(0, n - 1, 2)]
    return seen


def learner_figures(jobs: list[str], truth: np.ndarray, seen: list[tuple[int, int]],
                    prior: dict[str, PairTable] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The pair learner's figures after the pairings ``seen`` (both directions measured),
    and which of them are untried (a figure of the matrix, a profile or the fallback)."""
    learner = PairLearner(max_entries=100_000, explore_bonus=0.0, prior=prior)
    for i, j in seen:
        if not np.isfinite(truth[i, j]):
            learner.refuse("gpu", jobs[i], jobs[j])
            continue
        learner.add("gpu", jobs[i], jobs[j], float(truth[i, j]))
        learner.add("gpu", jobs[j], jobs[i], float(truth[j, i]))
    model = learner.model()
    assert model is not None
    fallback = float(np.exp(np.median(np.log(truth[np.isfinite(truth)]))))
    answers = [[model.figure("gpu", a, b, fallback) for b in jobs] for a in jobs]
    return (np.array([[value for value, _ in row] for row in answers]),
            np.array([[source in UNTRIED for _, source in row] for row in answers]))


def learner_predictions(jobs: list[str], truth: np.ndarray, seen: list[tuple[int, int]],
                        prior: dict[str, PairTable] | None = None) -> np.ndarray:
    """The pair learner's figures after the pairings ``seen`` (both directions measured)."""
    return learner_figures(jobs, truth, seen, prior)[0]


def chosen_pairings(jobs: list[str], truth: np.ndarray, k: int, rng: np.random.Generator,
                    prior: dict[str, PairTable] | None = None
                    ) -> tuple[list[list[tuple[int, int]]], list[float]]:
    """The learner choosing its own ``k`` pairings, as its placements do on a cluster:
    each a max-weight pairing by its figures, an untried pair's weight raised by the
    packaged exploration bonus (``learning.pair_explore_bonus``, as prioritize lowers its
    loss); with nothing learned and no matrix, the first is random (among pairs that fit,
    as the memory estimate knows them). The pairings run and
    the measured value of each (what learning cost while it ran)."""
    seen: list[tuple[int, int]] = []
    rounds: list[list[tuple[int, int]]] = []
    ran: list[float] = []
    for round_ in range(k):
        if round_ == 0 and prior is None:  # a random pairing among the pairs that fit
            pairs = best_pairs(rng.random(truth.shape), truth)
        else:
            figures, untried = learner_figures(jobs, truth, seen, prior)
            pairs = best_pairs(1 / figures + 1 / figures.T + EXPLORE_BONUS * untried, truth)
        ran.append(measured_value(pairs, truth))
        rounds.append(pairs)
        seen += pairs
    return rounds, ran


def best_line_with_seen(truth: np.ndarray, other: np.ndarray, seen: list[tuple[int, int]]
                        ) -> np.ndarray:
    """Diagnostic: the other GPU's matrix through the best calibration line there is (log
    slowdown here on log slowdown there, fitted to every measured pair), the pairs seen
    exact: what the learner's own model of a matrix prior reaches at best."""
    both = np.isfinite(truth) & np.isfinite(other) & ~np.eye(len(truth), dtype=bool)
    beta, alpha = np.polyfit(np.log(other[both]), np.log(truth[both]), 1)
    out = np.exp(alpha + beta * np.log(np.where(np.isfinite(other), other, MAX_SLOWDOWN)))
    for i, j in seen:
        out[i, j], out[j, i] = truth[i, j], truth[j, i]
    return out


def seen_only(truth: np.ndarray, seen: list[tuple[int, int]]) -> np.ndarray:
    """Diagnostic: the measured figures of the pairs seen, every other pair ruled out."""
    out = np.full(truth.shape, 1e6)
    for i, j in seen:
        out[i, j], out[j, i] = truth[i, j], truth[j, i]
    return out


def _job_features(job: str, families: list[str]) -> list[float]:
    family, _, batch = job.partition("-bs")
    return [float(family == f) for f in families] + [math.log2(float(batch or 1))]


def features_predictions(jobs: list[str], truth: np.ndarray, other: np.ndarray,
                         seen: list[tuple[int, int]]) -> np.ndarray:
    """Diagnostic: XGBoost on each job's family and log batch size (from Gavel's names),
    trained on the other GPU's measured pairs and the pairs seen here (weight 5)."""
    families = sorted({j.partition("-bs")[0] for j in jobs})
    feats = [_job_features(j, families) for j in jobs]
    rows, ys, weights = [], [], []
    n = len(jobs)
    for i in range(n):
        for j in range(n):
            if i != j and np.isfinite(other[i, j]):
                rows.append(feats[i] + feats[j] + [0.0])
                ys.append(math.log(other[i, j]))
                weights.append(1.0)
    for i, j in seen:
        for a, b in ((i, j), (j, i)):
            if np.isfinite(truth[a, b]):
                rows.append(feats[a] + feats[b] + [1.0])
                ys.append(math.log(truth[a, b]))
                weights.append(5.0)
    model = xgb.XGBRegressor(n_estimators=300, max_depth=4, learning_rate=0.05,
                             subsample=0.9, random_state=0, n_jobs=1)
    model.fit(np.array(rows), np.array(ys), sample_weight=np.array(weights))
    grid = np.array([feats[i] + feats[j] + [1.0] for i in range(n) for j in range(n)])
    return np.exp(model.predict(grid)).reshape(n, n)


def profile_on_every_pair(jobs: list[str], truth: np.ndarray) -> np.ndarray:
    """The learner's profile fitted to every measured pair, pairs themselves dropped."""
    learner = PairLearner(max_entries=100_000, explore_bonus=0.0)
    for i, a in enumerate(jobs):
        for j, b in enumerate(jobs):
            if i != j and np.isfinite(truth[i, j]):
                learner.add("gpu", a, b, float(truth[i, j]))
    full = learner.model()
    assert full is not None
    fitted = full.types["gpu"]
    model = PairModel({"gpu": TypePairs({}, fitted.mu, fitted.sens, fitted.aggr)})
    return np.array([[model.figure("gpu", a, b, 1.0)[0] for b in jobs] for a in jobs])


def choosing(jobs: list[str], truth: np.ndarray, seeds: int, best: float,
             prior: dict[str, PairTable] | None) -> dict[str, Any]:
    """Per ``k``: the pairing by the learner's figures after choosing its own ``k``
    pairings (:func:`chosen_pairings`), and the measured value of the pairings it ran
    while it learned, as a share of the matrix's best."""
    final: dict[int, list[float]] = {k: [] for k in KS}
    running: dict[int, list[float]] = {k: [] for k in KS}
    for seed in range(seeds):
        rounds, ran = chosen_pairings(jobs, truth, max(KS), np.random.default_rng(seed), prior)
        for k in KS:
            seen = [pair for pairs in rounds[:k] for pair in pairs]
            final[k].append(pairing_value(learner_predictions(jobs, truth, seen, prior), truth))
            running[k].append(float(np.mean(ran[:k])))
    return {f"k={k}": {**interval(final[k]),
                       "of_matrix": round(float(np.mean(final[k])) / best, 4),
                       "while_learning_of_matrix": round(float(np.mean(running[k])) / best, 4)}
            for k in KS}


def pairings_for_goal(jobs: list[str], truth: np.ndarray, seeds: int, best: float,
                      prior: dict[str, PairTable]) -> dict[str, Any]:
    """Diagnostic: the learner with ``prior`` after more random pairings per job
    (:data:`MORE_KS`), as a share of the matrix's best, and the fewest that reach the
    goal (None: none of them)."""
    shares = {k: float(np.mean([pairing_value(learner_predictions(
        jobs, truth, seen_pairings(len(jobs), k, np.random.default_rng(seed)), prior),
        truth) for seed in range(seeds)])) / best for k in MORE_KS}
    return {"of_matrix": {f"k={k}": round(v, 4) for k, v in shares.items()},
            "first_k_reaching_goal": next((k for k, v in shares.items()
                                           if v >= GOAL_OF_MATRIX), None)}


def interval(values: list[float]) -> dict[str, float]:
    """Mean and half-width of the 95% t interval."""
    v = np.asarray(values, dtype=float)
    half = float(student_t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))) \
        if len(v) > 1 else 0.0
    return {"mean": round(float(v.mean()), 4), "ci95": round(half, 4), "n": len(v)}


def offline(raw: dict[str, Any], seeds: int) -> dict[str, Any]:
    """Part (a) for every GPU of the file."""
    out: dict[str, Any] = {}
    for gpu in GPUS:
        jobs, truth = matrix(raw, gpu)
        best = pairing_value(truth, truth)
        curve = pairing_value(best_curve(truth), truth)
        other_type, other = import_gavel(raw, OTHER[gpu])
        _, other_truth = matrix(raw, OTHER[gpu])
        values: dict[str, dict[int, list[float]]] = {name: {k: [] for k in KS}
                                                     for name in OFFLINE_METHODS}
        for k in KS:
            for seed in range(seeds):
                seen = seen_pairings(len(jobs), k, np.random.default_rng(seed))
                predicted = {
                    "learner": learner_predictions(jobs, truth, seen),
                    "learner_with_other_gpu_matrix": learner_predictions(
                        jobs, truth, seen, {other_type: other}),
                    "seen_pairs_only": seen_only(truth, seen),
                    "features_on_other_gpu_and_seen": features_predictions(
                        jobs, truth, other_truth, seen)}
                predicted["best_line_with_seen"] = best_line_with_seen(truth, other_truth, seen)
                for name, figures in predicted.items():
                    values[name][k].append(pairing_value(figures, truth))
        methods = {name: {f"k={k}": {**interval(v),
                                     "of_matrix": round(float(np.mean(v)) / best, 4)}
                          for k, v in per_k.items()} for name, per_k in values.items()}
        for name, prior in (("learner_choosing", None),
                            ("learner_choosing_with_other_gpu_matrix", {other_type: other})):
            methods[name] = choosing(jobs, truth, seeds, best, prior)
        learned, with_matrix = methods["learner"], methods["learner_with_other_gpu_matrix"]
        matrix_only = pairing_value(learner_predictions(jobs, truth, [], {other_type: other}),
                                    truth)
        rng = np.random.default_rng(0)
        random = [pairing_value(rng.random(truth.shape) + 1, truth) for _ in range(seeds)]
        profile = pairing_value(profile_on_every_pair(jobs, truth), truth)
        out[gpu] = {"jobs": len(jobs), "matrix": round(best, 4),
                    "best_curve": round(curve, 4), "best_curve_of_matrix": round(curve / best, 4),
                    "random": interval(random), **methods,
                    "other_gpu_matrix_alone_of_matrix": round(matrix_only / best, 4),
                    "pairings_for_goal_with_other_gpu_matrix": pairings_for_goal(
                        jobs, truth, seeds, best, {other_type: other}),
                    "profile_on_every_pair": round(profile, 4),
                    "profile_on_every_pair_of_matrix": round(profile / best, 4),
                    "goal_97pct_by_k3": {name: bool(v["k=3"]["of_matrix"] >= GOAL_OF_MATRIX)
                                         for name, v in (("learner", learned),
                                                         ("with_matrix", with_matrix))},
                    "goal_above_curve_by_k3": {name: bool(v["k=3"]["mean"] > curve)
                                               for name, v in (("learner", learned),
                                                               ("with_matrix", with_matrix))}}
    return out


MODES = ("pair-aware+matrix", "pair-aware+matrix:two-only", "pair-aware+wrong-matrix",
         "pair-aware", "pair-aware:two-only", "pair-aware:warm", "curve-only", "curve-only:warm",
         "prior", "oracle", "pair-oracle")
PAIR_AWARE = ("pair-aware+matrix", "pair-aware+matrix:two-only", "pair-aware+wrong-matrix",
              "pair-aware", "pair-aware:two-only", "pair-aware:warm")
TWO_ONLY = ":two-only"
"""A pair-aware mode that learns only from GPUs shared by two (``learning.pair_groups`` off)."""
WARM = ":warm"
"""A learning mode that starts from the learning document of an earlier workload on the
same cluster (:func:`_warm_world`), as an extender restarted in a cluster it ran in does."""
HISTORY_SEED = 1000
"""Added to a seed for the earlier workload a warm mode learned from (its own jobs)."""
WRONG_SEED = 7
"""Seeds the permutation of model names that makes the wrong matrix."""


class _PairOracle(SimKnowledge):
    """Curve-only's online learning, decisions given every measured pair (a diagnostic)."""

    def policy(self, base):  # type: ignore[no-untyped-def]
        return super().policy(base).with_pairs(oracle_pairs(self.truth))


def shuffled_names(tables: dict[str, PairTable], seed: int) -> dict[str, PairTable]:
    """``tables`` with model names permuted: figures as measured, for the wrong pairs."""
    out = {}
    for gpu_type, table in tables.items():
        names = table.models()
        new = dict(zip(names, np.random.default_rng(seed).permutation(names).tolist(),
                       strict=True))
        out[gpu_type] = PairTable(
            {new[a]: {new[b]: v for b, v in row.items()} for a, row in table.slowdown.items()},
            frozenset(frozenset(new[m] for m in pair) for pair in table.cannot_share))
    return out


def _world(truth: Truth, mode: str, types: list[str],
           matrix: dict[str, PairTable]) -> SimWorld:
    base = load_config(None, environ={}).learning
    if mode.endswith(TWO_ONLY):
        mode, base = mode.removesuffix(TWO_ONLY), replace(base, pair_groups=False)
    if mode in ("pair-aware+matrix", "pair-aware+wrong-matrix"):
        prior = matrix if mode == "pair-aware+matrix" else shuffled_names(matrix, WRONG_SEED)
        return SimWorld.build(truth, "online", replace(base, pairs=True,
                                                       pair_prior_tables=prior), types)
    if mode == "pair-oracle":
        world = SimWorld.build(truth, "online", replace(base, pairs=False), types)
        world.knowledge = _PairOracle("online", truth, world.knowledge.learner,
                                      world.knowledge.cfg, types)
        return world
    if mode in ("pair-aware", "curve-only"):
        return SimWorld.build(truth, "online", replace(base, pairs=mode == "pair-aware"), types)
    return SimWorld.build(truth, mode, base, types)


def _warm_world(truth: Truth, mode: str, types: list[str], matrix: dict[str, PairTable],
                history: list[SimJob], nodes: list[NodeSpec]) -> tuple[SimWorld, float]:
    """A world whose learner loaded the learning document (the persisted, bounded form)
    left by running ``history`` in ``mode``; and when that run ended, for the next run's
    jobs to arrive after it (simulated time runs on, as the learner's clock does)."""
    past = _world(truth, mode, types, matrix)
    ended = simulate(history, nodes, "tandem", PolicyOptions(cost=tandem_cost()),
                     world=past).makespan_s
    world = _world(truth, mode, types, matrix)
    world.knowledge.learner.load_document(past.knowledge.learner.document())
    return world, math.ceil(ended) + 1.0


SIGNALS = ("proportional", "sub-proportional")
LEARNED = ("pairs_seen", "pairs_inferred", "pair_samples", "group_samples")
TIMES = ("avg_jct_s", "makespan_s")
WHERE = ("avg_wait_s", "avg_run_s", "avg_gpu_util")
"""Where a mode's time goes: waiting, running (slowed by its neighbours), and how busy
the GPUs were (the simulator's ``avg_gpu_util``)."""


@dataclass(frozen=True)
class Setting:
    """One seed of one GPU's world: its truth, cluster and jobs, and the other GPU's matrix."""

    gpu_type: str
    table: PairTable
    other: dict[str, PairTable]
    nodes: list[NodeSpec]
    truth: Truth
    jobs: list[SimJob]


def setting(raw: dict[str, Any], workload: str, gpu: str, signal: str, seed: int) -> Setting:
    """The imported truth of ``gpu`` under ``signal`` on 3 x 4 GPUs, ``workload`` drawing
    the truth's models (seeded), and the other GPU's imported matrix."""
    gpu_type, table = import_gavel(raw, gpu)
    other_type, other = import_gavel(raw, OTHER[gpu])
    return Setting(gpu_type, table, {other_type: other},
                   uniform_cluster(3, 4, gpu_type, MEMORY_MIB[gpu], prefix=f"{gpu}-node"),
                   Truth(interference={gpu_type: table}, signal=SignalModel(signal), seed=seed),
                   with_named_models(generate(workload, seed), table.models(), seed))


def _seed_runs(raw: dict[str, Any], workload: str, task: tuple[str, str, int]
               ) -> dict[str, dict[str, float]]:
    """One seed of one GPU and signal model: every mode's average JCT, makespan and, for
    the pair-aware modes, what the learner had by the end (:data:`LEARNED`)."""
    gpu, signal, seed = task
    here = setting(raw, workload, gpu, signal, seed)
    history = with_named_models(generate(workload, seed + HISTORY_SEED), here.table.models(),
                                seed + HISTORY_SEED)
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        run = here.jobs
        if mode.endswith(WARM):
            world, start = _warm_world(here.truth, mode.removesuffix(WARM), [here.gpu_type],
                                       here.other, history, here.nodes)
            run = [replace(j, arrival_s=j.arrival_s + start) for j in here.jobs]
        else:
            world = _world(here.truth, mode, [here.gpu_type], here.other)
        result = simulate(run, here.nodes, "tandem", PolicyOptions(cost=tandem_cost()),
                          world=world).summary()
        out[mode] = {key: float(result[key]) for key in TIMES + WHERE}
        if mode in PAIR_AWARE:
            pairs = world.knowledge.learner.pairs
            pairs.model()  # the last solve of the group samples
            s = pairs.stats()
            out[mode].update(pairs_seen=s["pairs"], pairs_inferred=s["inferred_pairs"],
                             pair_samples=s["samples"] - s["group_samples"],
                             group_samples=s["group_samples"])
    return out


def simulated(raw: dict[str, Any], seeds: int, workload: str, processes: int = 1
              ) -> dict[str, Any]:
    """Part (b): every GPU, signal model and mode over ``seeds`` seeds (seeds run in
    ``processes`` processes; each seed's runs are the same however many)."""
    tasks = [(gpu, signal, seed) for gpu in GPUS for signal in SIGNALS
             for seed in range(1, seeds + 1)]
    results = _common.map_tasks(partial(_seed_runs, raw, workload), tasks, processes)
    out: dict[str, Any] = {}
    for gpu in GPUS:
        names = import_gavel(raw, gpu)[1].models()
        for signal in SIGNALS:
            per_seed = [r for (g, s, _), r in zip(tasks, results, strict=True)
                        if (g, s) == (gpu, signal)]
            runs = {m: {k: [r[m][k] for r in per_seed] for k in TIMES + WHERE}
                    for m in MODES}
            summary = {m: {k: interval(v) for k, v in r.items()} for m, r in runs.items()}
            out[f"{gpu}/{signal}"] = {
                "modes": summary,
                "goals": {m: _goals(runs, m, "curve-only" + (WARM if m.endswith(WARM) else ""))
                          for m in PAIR_AWARE},
                "learned": {m: {k: interval([r[m][k] for r in per_seed]) for k in LEARNED}
                            for m in PAIR_AWARE},
                # what group samples are worth: the two-only twin minus the mode, per seed
                "groups_paired": {m: {k: _paired(runs, m + TWO_ONLY, m, k) for k in TIMES}
                                  for m in PAIR_AWARE if m + TWO_ONLY in MODES},
                # where the time goes: the mode minus curve-only, per seed
                "where_vs_curve": {m: {k: _paired(runs, m, "curve-only", k) for k in WHERE}
                                   for m in MODES if m != "curve-only"},
                "directed_pairs": len(names) ** 2,
                "per_seed": runs}
    return out


def _paired(runs: dict[str, dict[str, list[float]]], first: str, second: str, key: str
            ) -> dict[str, float]:
    """Mean and interval of ``first - second`` per seed (positive: ``second`` is shorter)."""
    return interval(list(np.array(runs[first][key]) - np.array(runs[second][key])))


def _goals(runs: dict[str, dict[str, list[float]]], mode: str, curve_mode: str
           ) -> dict[str, Any]:
    """``mode`` within 5% of the oracle, ahead of ``curve_mode`` (curve-only, warm for a
    warm mode) by more than the interval."""
    goals: dict[str, Any] = {}
    for key in TIMES:
        pair, curve, oracle = (np.mean(runs[m][key]) for m in (mode, curve_mode, "oracle"))
        ahead = _paired(runs, curve_mode, mode, key)
        oracle_ahead = _paired(runs, "curve-only", "oracle", key)  # what any learner can reach
        goals[key] = {"pair_vs_oracle": round(float(pair / oracle - 1), 4),
                      "within_5pct_of_oracle": bool(pair <= oracle * (1 + GOAL_VS_ORACLE)),
                      "curve_minus_pair_paired": ahead,
                      "ahead_of_curve_beyond_interval": bool(ahead["mean"] > ahead["ci95"]),
                      "curve_minus_pair_oracle_paired": _paired(runs, "curve-only",
                                                                "pair-oracle", key),
                      "curve_minus_oracle_paired": oracle_ahead,
                      "oracle_ahead_of_curve_beyond_interval": bool(
                          oracle_ahead["mean"] > oracle_ahead["ci95"]),
                      "curve_vs_oracle": round(float(curve / oracle - 1), 4),
                      "against": curve_mode}
        if curve_mode != "curve-only":  # a warm mode: also against the cold curve-only
            goals[key]["cold_curve_minus_pair_paired"] = _paired(runs, "curve-only", mode, key)
    return goals


def main() -> None:
    """Run (a) and (b), print and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="Gavel measurements JSON")
    parser.add_argument("--offline-seeds", type=int, default=20)
    parser.add_argument("--sim-seeds", type=int, default=40)
    parser.add_argument("--workload", default="w-large", help="generated workload for (b)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                        help="processes for (b)'s seeds (default: one per CPU)")
    _common.add_out_option(parser, "interference")
    args = parser.parse_args()
    raw = json.loads(args.data.read_text())
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "interference",
        "data": "Gavel pairwise throughputs (shared/data/interference/gavel-p100-k80.json)",
        "setup": {"gpu_types": {g: GAVEL_GPUS[g] for g in GPUS}, "ks": list(KS),
                  "offline_seeds": args.offline_seeds, "sim_seeds": args.sim_seeds,
                  "processes": args.processes,
                  "workload": f"{args.workload} with --models truth", "cluster": "3 x 4 GPUs",
                  "policy": "tandem (packaged config)", "modes": list(MODES),
                  "memory_and_slo_sessions": "unchanged (the training workload has none)"},
        "offline_pairing": offline(raw, args.offline_seeds),
    }
    report["offline_wall_s"] = round(time.perf_counter() - started, 1)
    report["simulator"] = simulated(raw, args.sim_seeds, args.workload, args.processes)
    report["total_wall_s"] = round(time.perf_counter() - started, 1)
    report.update(_common.context(("numpy", "scipy", "networkx", "xgboost-cpu")))
    _common.write_result(report, args.out)


if __name__ == "__main__":
    main()
