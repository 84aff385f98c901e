"""Low-rank completion of log slowdowns across jobs and GPU types (Gavel's estimator).

Every GPU type's matrix of log slowdowns ``y[t][a][b]`` (job ``a`` beside job ``b``) is
fitted at once by

    y[t][a][b] ~ mu[t] + f[a].wv[t] + f[b].wa[t] + bv[t][a] + ba[t][b]
                 + U[a].V[t][b] + P[t][a].Q[b] + g[t] S[a][b]
    S[a][b] = bv0[a] + ba0[b] + U[a].V0[b] + E[a][b]

``U`` (how a job suffers) and ``Q`` (how it harms) are shared by every GPU type, so a
matrix measured on another GPU type, or the pairs seen on any type, inform the pairs of
a type seen little; ``V`` and ``P`` say how each type reads them. ``S`` is what every
type shares, pair by pair, and ``g[t]`` how strongly type ``t`` shows it (1 on the type
with the most weight of entries, the others pulled toward 1 with weight
:data:`SCALE_RIDGE`): log slowdowns measured on one GPU are not those of
another one for one (Gavel's K80 against its P100: slope 0.56, correlation 0.64), so a
type's own pairs set how far the others' figures carry over, first of all through its
scale: one figure, which a few pairs measure. ``f`` are a job's
features (its alone utilisation and memory, its graph's size: whatever the caller has,
standardised here), so a job never seen still gets the figure of jobs like it. Every
parameter but ``mu`` is pulled toward 0 with weight :data:`RIDGE`: with few entries the
fit stays near the per-type mean. A type's own terms (``wv``, ``wa``, ``bv``, ``ba``,
``V``, ``P``) are pulled :data:`TYPE_RIDGE` times harder than the shared ones: they say how
a type departs from the others pair by pair, which takes many of its pairs to tell, so a
matrix seen on one type alone is explained by the shared part and a type never seen reads
it nearly whole, in its own scale (with equal weights half of the spread stayed with the
type it was seen on: Gavel's K80 read from its P100 at 0.13 sd against 0.22 true; at 3,
0.19; at 30, 0.24 of the P100's 0.25, before its scale is learned).

A directed entry weighs its samples over the noise (``n / noise_var``), capped, and a
measured matrix's entry counts as :data:`MATRIX_SAMPLES` samples. Fitted by L-BFGS on the
weighted squared error (milliseconds for tens of jobs).

The figure's uncertainty is the completion's own error out of sample: the entries seen on
each type are split in :data:`FOLDS` folds, each predicted by a fit without it, and the
mean squared error (less the noise each entry carries) is the variance of a completed
figure there (:func:`complete`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize

_add = np.add.reduce
"""``np.sum`` of a 1-D array without its wrapper's overhead (the same pairwise sum)."""

RANK = 2
RIDGE = 1.0
PAIR_RIDGE = 0.5
"""Weight pulling each pair's own residual (shared by the GPU types) toward 0."""
FACTOR_RIDGE = 0.3
"""Weight pulling the low-rank factors toward 0 (relative to :data:`RIDGE`)."""
INIT = 0.3
"""Spread of the factors' seeded start (a start at 0 is a saddle the fit stays on)."""
FACTORS = ("U", "V", "P", "Q", "V0")
TYPE_TERMS = ("wv", "wa", "bv", "ba", "V", "P")
TYPE_RIDGE = 30.0
"""How many times harder a type's own terms are pulled toward 0 than the shared ones
(module docstring). Chosen with :data:`SCALE_RIDGE` on the decisions benchmark's tuning
seeds 100-119 under the extender's pair rule (k = 3; K80 / P100 capture of the
random-to-best gap): 3 with a scale weight of 5, 45% / 47%; 30 with 5, 52% / 50% (but a
type seen on a third of its pairs then read another's at slope 0.79 where its own was
0.5); 30 with 0.2, 54% / 48%. At 3 the K80's figures completed from the P100's kept 0.76
of their spread, which reorders the combined progress of pairs (a sum of two
exponentials): the K80's pairing from them captured 45% of the gap before any pair was
measured, from the P100's matrix itself 61%."""
SCALE_RIDGE = 0.2
"""Weight pulling each type's scale of the shared part, ``g[t]``, toward 1 (in samples):
light, so a type's first pairs set it (module docstring)."""
MATRIX_SAMPLES = 2.0
MAX_WEIGHT = 10.0
"""The most samples an entry counts for (a long-seen pair does not drown the rest)."""
FOLDS = 4
MIN_VAR = 0.05 ** 2
"""The smallest variance a completed figure takes (a fit is never exact)."""
DEFAULT_VAR = 0.3 ** 2
"""A completed figure's variance where too few entries were seen to measure it."""
MIN_HELD_OUT = 8
MAX_ITERATIONS = 300
FOLD_ITERATIONS = 100
"""A fold starts from the full fit, a few entries away: it needs far fewer steps."""

Entry = tuple[str, str, str, float, float]
"""(GPU type, a, b, mean log slowdown of a beside b, weight in samples)."""


@dataclass(frozen=True)
class Completed:
    """The completion's figures: ``(t, a, b) -> log slowdown`` for every type and pair of
    the jobs it knows, and per type the variance of a completed figure."""

    logs: Mapping[tuple[str, str, str], float]
    variance: Mapping[str, float]
    params: np.ndarray | None = None
    """The fit's parameters: the next fit over the same jobs and types starts there."""


def fit(entries: Sequence[Entry], jobs: Sequence[str], types: Sequence[str],
        features: Mapping[str, Sequence[float]] | None = None, rank: int = RANK,
        ridge: float = RIDGE) -> dict[tuple[str, str, str], float]:
    """The fitted log slowdown of every (type, a, b) over ``jobs`` and ``types``."""
    return _fit(entries, jobs, types, features, rank, ridge)[0]


def _fit(entries: Sequence[Entry], jobs: Sequence[str], types: Sequence[str],
         features: Mapping[str, Sequence[float]] | None, rank: int = RANK,
         ridge: float = RIDGE, start: np.ndarray | None = None, maxiter: int = MAX_ITERATIONS
         ) -> tuple[dict[tuple[str, str, str], float], np.ndarray]:
    """:func:`fit` and its parameters; from ``start`` (a fit's parameters over the same
    jobs and types: the folds of :func:`complete` start from the full fit's)."""
    ji = {j: i for i, j in enumerate(jobs)}
    ti = {t: i for i, t in enumerate(types)}
    feats = _standardised(jobs, features)
    objective = _Objective(entries, ji, ti, feats, rank, ridge)
    y, w, t_idx, k = objective.y, objective.w, objective.t_idx, len(types)
    x0 = np.random.default_rng(0).normal(0.0, INIT, objective.size)
    x0[:k] = [float(np.average(y[t_idx == t], weights=w[t_idx == t])) if (t_idx == t).any()
              else float(np.mean(y)) if len(y) else 0.0 for t in range(k)]
    x0[-k:] = 1.0  # each type's scale of the shared part
    if start is not None and start.shape == x0.shape:
        x0 = start.copy()
    if len(y):
        x0 = minimize(objective.loss, x0, jac=True, method="L-BFGS-B",
                      options={"maxiter": maxiter}).x
    full = _every_pair(objective.unpack(x0), feats)
    return {(t, a, b): float(full[ti[t], ji[a], ji[b]])
            for t in types for a in jobs for b in jobs}, x0


class _Objective:
    """The weighted squared error of the module docstring's model, its ridge terms and its
    gradient, over a flat parameter vector. Every index into it is computed once per fit:
    an evaluation is a few gathers, products and one ``np.bincount`` (at tens of jobs the
    per-parameter form spent its time in numpy's call overhead). Sums run in the order of
    the per-parameter form (entries in order, each term added in the same sequence), so
    the figures are that form's bit for bit (tests/extender/learning/test_completion.py)."""

    def __init__(self, entries: Sequence[Entry], ji: Mapping[str, int], ti: Mapping[str, int],
                 feats: np.ndarray, rank: int, ridge: float):
        n, k, d = len(ji), len(ti), feats.shape[1]
        t_idx = np.array([ti[e[0]] for e in entries], dtype=int)
        a_idx = np.array([ji[e[1]] for e in entries], dtype=int)
        b_idx = np.array([ji[e[2]] for e in entries], dtype=int)
        self.y = np.array([e[3] for e in entries])
        self.w = np.minimum(np.array([e[4] for e in entries]), MAX_WEIGHT)
        self.t_idx, self.k = t_idx, k
        self.shapes = [("mu", (k,)), ("wv", (k, d)), ("wa", (k, d)), ("bv", (k, n)),
                       ("ba", (k, n)), ("U", (n, rank)), ("V", (k, n, rank)),
                       ("P", (k, n, rank)), ("Q", (n, rank)), ("bv0", (n,)), ("ba0", (n,)),
                       ("V0", (n, rank)), ("E", (n, n)), ("g", (k,))]
        sizes = [int(np.prod(s)) for _, s in self.shapes]
        at = np.cumsum([0, *sizes])
        off = {name: int(at[i]) for i, (name, _) in enumerate(self.shapes)}
        self.size = int(at[-1])
        ta, tb = t_idx * n + a_idx, t_idx * n + b_idx

        def rows(name: str, row: np.ndarray, width: int) -> np.ndarray:
            return off[name] + row[:, None] * width + np.arange(width)
        # Each gathered term's flat index in x is also where its gradient adds up.
        self.at1 = np.stack([off["mu"] + t_idx, off["bv"] + ta, off["ba"] + tb,
                             off["bv0"] + a_idx, off["ba0"] + b_idx,
                             off["E"] + a_idx * n + b_idx, off["g"] + t_idx])
        self.at_r = np.stack([rows("U", a_idx, rank), rows("V", tb, rank), rows("P", ta, rank),
                              rows("Q", b_idx, rank), rows("V0", b_idx, rank)])
        self.at_d = np.stack([rows("wv", t_idx, d), rows("wa", t_idx, d)])
        self.fa, self.fb = feats[a_idx], feats[b_idx]
        mu, bv, ba, bv0, ba0, e, g = self.at1
        u_at, v_at, p_at, q_at, v0_at = self.at_r
        self.into = np.concatenate([mu, self.at_d[0].ravel(), self.at_d[1].ravel(), bv, ba,
                                    u_at.ravel(), v_at.ravel(), p_at.ravel(), q_at.ravel(),
                                    bv0, ba0, v0_at.ravel(), e, g])
        # The ridge: every parameter but the per-type mean and scale (shapes[1:-1]).
        own = np.full(k, TYPE_RIDGE if k > 1 else 1.0)  # one type: nothing shared to depart
        weights: list[np.ndarray] = []
        self.segments: list[tuple[int, int]] = []
        for name, shape in self.shapes[1:-1]:
            weight = ridge * (PAIR_RIDGE if name == "E" else FACTOR_RIDGE if name in FACTORS
                              else 1.0)
            if name in TYPE_TERMS:  # per type: the first axis
                weight = weight * own.reshape((k,) + (1,) * (len(shape) - 1))
            weights.append(np.broadcast_to(weight, shape).ravel())
            if int(np.prod(shape)):  # its slice of x[k:-k]
                self.segments.append((off[name] - k, off[name] - k + int(np.prod(shape))))
        self.ridge = np.concatenate(weights)
        weights_per_type = np.bincount(t_idx, self.w, minlength=k)
        self.reference = int(np.argmax(weights_per_type)) if len(self.y) else 0

    def unpack(self, x: np.ndarray) -> dict[str, np.ndarray]:
        out, at = {}, 0
        for name, shape in self.shapes:
            size = int(np.prod(shape))
            out[name] = x[at:at + size].reshape(shape)
            at += size
        return out

    def loss(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        k, y, w = self.k, self.y, self.w
        mu, bv, ba, bv0, ba0, e, scale = x[self.at1]
        u, v, pp, q, v0 = x[self.at_r]
        wv, wa = x[self.at_d]
        shared = bv0 + ba0 + np.einsum("ij,ij->i", u, v0) + e
        if self.fa.shape[1]:  # without features both terms are 0 (x + 0.0 == x)
            mu = mu + np.einsum("ij,ij->i", self.fa, wv) + np.einsum("ij,ij->i", self.fb, wa)
        pred = mu + bv + ba + np.einsum("ij,ij->i", u, v) + np.einsum("ij,ij->i", pp, q) \
            + scale * shared
        r = w * (pred - y)
        rs = r * scale
        rc = r[:, None]
        grad = np.bincount(self.into, np.concatenate([
            r, (rc * self.fa).ravel(), (rc * self.fb).ravel(), r, r,
            (rc * v + rs[:, None] * v0).ravel(), (rc * u).ravel(), (rc * q).ravel(),
            (rc * pp).ravel(), rs, rs, (rs[:, None] * u).ravel(), rs, r * shared]),
            minlength=self.size)
        value = 0.5 * float(np.sum(w * (pred - y) ** 2))
        inner, last = x[k:self.size - k], self.size - k
        terms = self.ridge * inner ** 2
        for lo, hi in self.segments:  # np.sum's pairwise sum per parameter (not reduceat's)
            value += 0.5 * float(_add(terms[lo:hi]))
        grad[k:last] += self.ridge * inner
        g = x[last:]
        value += 0.5 * SCALE_RIDGE * float(np.sum((g - 1.0) ** 2))
        grad[last:] += SCALE_RIDGE * (g - 1.0)
        grad[self.size - k + self.reference] = 0.0  # the reference type's scale stays 1
        return value, grad


def _every_pair(p: Mapping[str, np.ndarray], feats: np.ndarray) -> np.ndarray:
    """The fitted ``y[t][a][b]`` of every type and pair (the model of the module docstring)."""
    return (p["mu"][:, None, None] + np.einsum("ad,td->ta", feats, p["wv"])[:, :, None]
            + np.einsum("bd,td->tb", feats, p["wa"])[:, None, :] + p["bv"][:, :, None]
            + p["ba"][:, None, :] + np.einsum("ar,tbr->tab", p["U"], p["V"])
            + np.einsum("tar,br->tab", p["P"], p["Q"])
            + p["g"][:, None, None]
            * (p["bv0"][:, None] + p["ba0"][None, :] + p["U"] @ p["V0"].T + p["E"])[None])


def _standardised(jobs: Sequence[str], features: Mapping[str, Sequence[float]] | None
                  ) -> np.ndarray:
    """Each job's features, each column centred and scaled (a job without them: 0, the mean)."""
    if not features:
        return np.zeros((len(jobs), 0))
    d = max(len(v) for v in features.values())
    raw = np.array([list(features.get(j, ())) + [math.nan] * (d - len(features.get(j, ())))
                    for j in jobs], dtype=float)
    mean = np.nanmean(raw, axis=0) if np.isfinite(raw).any() else np.zeros(d)
    sd = np.nanstd(raw, axis=0)
    out = (raw - mean) / np.where(sd > 0, sd, 1.0)
    return np.nan_to_num(out, nan=0.0)


def complete(entries: Sequence[Entry], jobs: Sequence[str], types: Sequence[str],
             noise_var: float, features: Mapping[str, Sequence[float]] | None = None,
             learned: Sequence[str] = (), start: np.ndarray | None = None) -> Completed:
    """:func:`fit` on every entry (from ``start``, an earlier fit's parameters, when they
    fit), and per type in ``learned`` the variance of a completed figure measured out of
    sample (module docstring); a type with fewer than :data:`MIN_HELD_OUT` entries seen
    takes :data:`DEFAULT_VAR`. Asked again with nothing changed (the same entries, their
    weights, jobs, types, noise, features and start), it answers the last result unfitted."""
    key = (tuple(entries), tuple(jobs), tuple(types), noise_var,
           tuple(sorted((j, tuple(v)) for j, v in (features or {}).items())), tuple(learned),
           None if start is None else (start.shape, start.tobytes()))
    last = _last.get(key)
    if last is None:
        last = _complete(entries, jobs, types, noise_var, features, learned, start)
        _last.clear()  # one result kept: a refit's inputs are the last ones or new ones
        _last[key] = last
    return last


_last: dict[tuple[Any, ...], Completed] = {}
"""The last :func:`complete`'s inputs and result."""


def _complete(entries: Sequence[Entry], jobs: Sequence[str], types: Sequence[str],
              noise_var: float, features: Mapping[str, Sequence[float]] | None,
              learned: Sequence[str], start: np.ndarray | None) -> Completed:
    """:func:`complete`, fitted."""
    logs, params = _fit(entries, jobs, types, features, start=start)
    variance = {t: DEFAULT_VAR for t in types}
    for t in learned:
        own = [i for i, e in enumerate(entries) if e[0] == t]
        if len(own) < MIN_HELD_OUT:
            continue
        order = np.random.default_rng(len(own)).permutation(own)
        errors, noise = [], []
        for fold in range(FOLDS):
            held = set(order[fold::FOLDS].tolist())
            rest = [e for i, e in enumerate(entries) if i not in held]
            predicted = _fit(rest, jobs, types, features, start=params,
                             maxiter=FOLD_ITERATIONS)[0]
            for i in held:
                e = entries[i]
                errors.append((predicted[(e[0], e[1], e[2])] - e[3]) ** 2)
                noise.append(noise_var / max(e[4], 1.0))
        variance[t] = max(MIN_VAR, float(np.mean(errors) - np.mean(noise)))
    return Completed(logs, variance, params)
