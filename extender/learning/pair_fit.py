"""The fits behind the pair learner (:mod:`extender.learning.interference`): per-model
profiles, the measured matrix's calibration, and the pairs solved from the samples of
GPUs shared by three or more (group samples). Pure functions of what was learned.

Every fit is a sparse ridge least squares solved by its normal equations
(:func:`least_squares`): the learner's model is rebuilt at the end of every agent report
that changed it, so a fit at the bounds must take milliseconds (``benchmarks/pair_refit.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix, identity
from scipy.sparse.linalg import cg, spsolve

from contracts.interferencefile import PairTable
from extender.core.pairs import MATRIX, PairModel, TypePairs

MAX_LOG = math.log(20.0)
"""The largest log slowdown a sample or a figure takes (a slowdown of 20)."""
MAX_EXTRA = 19.0
"""The largest extra slowdown a group sample or a solved pair takes (a slowdown of 20)."""
MAX_SAMPLE_WEIGHT = 5.0
"""The most samples a pair or group sample counts for in a fit."""
RIDGE = 1.0
"""Weight, in samples, pulling each profile toward 0."""
CALIBRATION_RIDGE = 2.0
"""Weight, in pairs, pulling the matrix's calibration line toward alpha 0, beta 1."""
GROUP_RIDGE_MATRIX = 20.0
GROUP_RIDGE = 0.5
"""Weights, in samples, that hold a solved pair to its figure without the group samples:
a measured matrix's, or a profile's or the median's."""
ACTIVE_SET_ROUNDS = 20
DEFAULT_EXTRA = 0.5
"""A pair's extra before anything is seen on its GPU type (the median of the seen pairs
after)."""

GroupKey = tuple[str, str, tuple[str, ...]]
"""(GPU type, model a, the others' models sorted): a beside all of them."""


def _weight(samples: float) -> float:
    """A row's weight in the least squares: the square root of its samples, at most
    ``MAX_SAMPLE_WEIGHT`` of them (a long-seen pair does not drown the rest)."""
    return math.sqrt(min(float(samples), MAX_SAMPLE_WEIGHT))


def fit_profiles(pairs: Mapping[tuple[str, str], tuple[float, int]],
                 cannot: frozenset[frozenset[str]]) -> TypePairs:
    """Ridge fit of ``log s[a][b] = mu + sens[a] + aggr[b]`` over the pairs seen."""
    if not pairs:
        return TypePairs({}, 0.0, {}, {}, cannot)
    victims = sorted({a for a, _ in pairs})
    aggressors = sorted({b for _, b in pairs})
    vi = {m: i for i, m in enumerate(victims)}
    ai = {m: len(victims) + i for i, m in enumerate(aggressors)}
    k = 1 + len(victims) + len(aggressors)
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    target: list[float] = []
    for r, ((a, b), (mean, n)) in enumerate(pairs.items()):
        w = _weight(n)
        rows += [r, r, r]
        cols += [0, 1 + vi[a], 1 + ai[b]]
        values += [w, w, w]
        target.append(w * mean)
    for col in range(1, k):  # the ridge: each profile pulled toward 0, mu free
        rows.append(len(target))
        cols.append(col)
        values.append(math.sqrt(RIDGE))
        target.append(0.0)
    beta = least_squares(csr_matrix((values, (rows, cols)), shape=(len(target), k)),
                         np.array(target))
    return TypePairs(dict(pairs), float(beta[0]),
                     {m: float(beta[1 + vi[m]]) for m in victims},
                     {m: float(beta[1 + ai[m]]) for m in aggressors}, cannot)


def least_squares(a: csr_matrix, y: np.ndarray, upper: float | None = None) -> np.ndarray:
    """``argmin |a x - y|`` by the sparse normal equations (``a`` holds its ridge rows, so
    they are positive definite; milliseconds for thousands of pairs). With ``upper``, ``x``
    is kept in [0, upper]: values outside are held at their bound and the rest solved
    again, a held value the optimum would move inward is freed (an active set, at most
    ``ACTIVE_SET_ROUNDS`` rounds; then clipped)."""
    x = np.zeros(a.shape[1])
    free = np.ones(a.shape[1], dtype=bool)
    for _ in range(ACTIVE_SET_ROUNDS):
        part = a[:, free]
        rhs = y - a[:, ~free] @ x[~free]
        x[free] = _solve_normal(part.T @ part + 1e-9 * identity(part.shape[1]),
                                part.T @ rhs, x[free])
        if upper is None:
            return x
        out = free & ((x < 0.0) | (x > upper))
        if out.any():  # outside: held at the bound
            x[out] = np.clip(x[out], 0.0, upper)
            free &= ~out
            continue
        slope = a.T @ (a @ x - y)  # held values the optimum would move inward: free again
        back = ~free & (((x <= 0.0) & (slope < -1e-9)) | ((x >= upper) & (slope > 1e-9)))
        if not back.any():
            break
        free |= back
    return np.clip(x, 0.0, upper) if upper is not None else x


def _solve_normal(normal: Any, rhs: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The normal equations, symmetric positive definite: conjugate gradients from
    ``start`` (a few milliseconds where a factorisation of thousands of profiles takes
    tens), the exact sparse factorisation if they do not converge."""
    x, info = cg(normal.tocsr(), rhs, x0=start, rtol=1e-12, atol=0.0,
                 maxiter=max(200, 10 * len(rhs)))
    if info != 0:
        x = spsolve(normal.tocsc(), rhs, permc_spec="MMD_AT_PLUS_A")
    return np.atleast_1d(x)


def solve_group_types(fitted: Mapping[str, TypePairs], groups: Mapping[GroupKey, list[float]]
                      ) -> dict[str, dict[tuple[str, str], tuple[float, int]]]:
    """Per GPU type, the pairs solved from its group samples (:func:`solve_groups`)."""
    per_type: dict[str, dict[tuple[str, tuple[str, ...]], tuple[float, int]]] = {}
    for (t, a, others), (n, mean) in groups.items():
        per_type.setdefault(t, {})[(a, others)] = (mean, int(n))
    return {t: solve_groups(fitted[t], g) for t, g in per_type.items()}


def solve_groups(tp: TypePairs,
                 groups: Mapping[tuple[str, tuple[str, ...]], tuple[float, int]]
                 ) -> dict[tuple[str, str], tuple[float, int]]:
    """The pairs in ``groups`` neither seen alone together nor listed by the matrix ->
    (log slowdown, samples they were in): each group sample's extra is the sum of its
    pairs' extras, solved by bounded ridge least squares with the pairs seen and the
    matrix's pairs as anchors (weights as :func:`fit_profiles`, module docstring)."""
    index: dict[tuple[str, str], int] = {}
    counts: dict[tuple[str, str], int] = {}
    rows: list[int] = []
    cols: list[int] = []
    weights: list[float] = []
    target: list[float] = []
    for (a, others), (extra, n) in groups.items():
        w = _weight(n)
        for b in others:  # a model there twice counts twice (its pair's extra, twice)
            rows.append(len(target))
            cols.append(index.setdefault((a, b), len(index)))
            weights.append(w)
            counts[(a, b)] = counts.get((a, b), 0) + n
        target.append(w * extra)
    for pair, (mean, n) in tp.pairs.items():
        if pair in index:  # a pair seen alone with its partner anchors the groups it is in
            w = _weight(n)
            rows.append(len(target))
            cols.append(index[pair])
            weights.append(w)
            target.append(w * math.expm1(mean))
    seen_logs = [mean for mean, _ in tp.pairs.values()]
    fallback = math.exp(float(np.median(seen_logs))) if seen_logs else 1.0 + DEFAULT_EXTRA
    without = PairModel({"": tp})
    measured = set()
    for (a, b), col in index.items():  # the pull toward the figure before the groups
        value, source = without.figure("", a, b, fallback)
        if source == MATRIX:
            measured.add((a, b))
        w = math.sqrt(GROUP_RIDGE_MATRIX if source == MATRIX else GROUP_RIDGE)
        rows.append(len(target))
        cols.append(col)
        weights.append(w)
        target.append(w * min(MAX_EXTRA, value - 1.0))
    matrix = csr_matrix((weights, (rows, cols)), shape=(len(target), len(index)))
    solution = least_squares(matrix, np.array(target), upper=MAX_EXTRA)
    return {pair: (min(MAX_LOG, math.log1p(float(solution[col]))), counts[pair])
            for pair, col in index.items() if pair not in tp.pairs and pair not in measured}


def calibrate(seen: Mapping[tuple[str, str], tuple[float, int]],
              logs: Mapping[tuple[str, str], float]) -> tuple[float, float]:
    """Ridge line ``seen = alpha + beta * matrix`` over the pairs both know (module docstring)."""
    rows = [(logs[k], mean) for k, (mean, n) in seen.items() if k in logs and n > 0]
    if not rows:
        return 0.0, 1.0
    x = np.array([[1.0, m] for m, _ in rows])
    y = np.array([v for _, v in rows])
    penalty = CALIBRATION_RIDGE * np.eye(2)
    alpha, beta = np.linalg.solve(x.T @ x + penalty, x.T @ y + penalty @ np.array([0.0, 1.0]))
    return float(alpha), max(0.0, float(beta))


def prior_logs(tables: Mapping[str, PairTable]
                ) -> dict[str, tuple[dict[tuple[str, str], float], frozenset[frozenset[str]]]]:
    """Per listed GPU type its log slowdowns and cannot-share pairs."""
    return {gpu_type: ({(a, b): min(MAX_LOG, math.log(table.listed(a, b) or 1.0))
                        for a, row in table.slowdown.items() for b in row},
                       frozenset(table.cannot_share))
            for gpu_type, table in tables.items()}


def pooled_logs(prior: Mapping[str, tuple[dict[tuple[str, str], float], Any]]
                 ) -> dict[tuple[str, str], float]:
    """The mean log slowdown of each pair over the types that list it (memory facts, the
    cannot-share pairs, do not carry over to another GPU type)."""
    values: dict[tuple[str, str], list[float]] = {}
    for logs, _ in prior.values():
        for pair, value in logs.items():
            values.setdefault(pair, []).append(value)
    return {pair: sum(v) / len(v) for pair, v in values.items()}
