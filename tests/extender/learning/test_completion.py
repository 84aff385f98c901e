"""The completion's objective (extender.learning.completion._Objective): the one-pass loss and
gradient are the per-parameter form's bit for bit, the gradient is the loss's, and a
completion asked again with nothing changed is not refitted."""

from __future__ import annotations

import numpy as np
import pytest

import extender.learning.completion as completion
from extender.learning.completion import (
    FACTOR_RIDGE,
    FACTORS,
    MAX_WEIGHT,
    PAIR_RIDGE,
    RANK,
    RIDGE,
    SCALE_RIDGE,
    TYPE_RIDGE,
    TYPE_TERMS,
    Entry,
    complete,
)

JOBS = [f"j{i}" for i in range(9)]
TYPES = ["k80", "p100", "v100"]


def _reference(entries: list[Entry], n: int, k: int, feats: np.ndarray, x: np.ndarray,
               reference: int) -> tuple[float, np.ndarray]:
    """The objective as written parameter by parameter (its form before the one-pass
    rewrite): what the rewrite must reproduce."""
    ji, ti = {j: i for i, j in enumerate(JOBS[:n])}, {t: i for i, t in enumerate(TYPES[:k])}
    t_idx = np.array([ti[e[0]] for e in entries])
    a_idx, b_idx = np.array([ji[e[1]] for e in entries]), np.array([ji[e[2]] for e in entries])
    y = np.array([e[3] for e in entries])
    w = np.minimum(np.array([e[4] for e in entries]), MAX_WEIGHT)
    d, rank, ta, tb = feats.shape[1], RANK, t_idx * n + a_idx, t_idx * n + b_idx
    shapes = [("mu", (k,)), ("wv", (k, d)), ("wa", (k, d)), ("bv", (k, n)), ("ba", (k, n)),
              ("U", (n, rank)), ("V", (k, n, rank)), ("P", (k, n, rank)), ("Q", (n, rank)),
              ("bv0", (n,)), ("ba0", (n,)), ("V0", (n, rank)), ("E", (n, n)), ("g", (k,))]
    p, at = {}, 0
    for name, shape in shapes:
        p[name] = x[at:at + int(np.prod(shape))].reshape(shape)
        at += int(np.prod(shape))

    def add(index: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
        if values.ndim == 1:
            return np.bincount(index, values, minlength=size)
        return np.stack([np.bincount(index, values[:, c], minlength=size)
                         for c in range(values.shape[1])], axis=1) if values.shape[1] \
            else np.zeros((size, 0))
    fa, fb = feats[a_idx], feats[b_idx]
    u, v, pp, q = p["U"][a_idx], p["V"][t_idx, b_idx], p["P"][t_idx, a_idx], p["Q"][b_idx]
    v0 = p["V0"][b_idx]
    shared = (p["bv0"][a_idx] + p["ba0"][b_idx] + np.einsum("ij,ij->i", u, v0)
              + p["E"][a_idx, b_idx])
    scale = p["g"][t_idx]
    pred = (p["mu"][t_idx] + np.einsum("ij,ij->i", fa, p["wv"][t_idx])
            + np.einsum("ij,ij->i", fb, p["wa"][t_idx]) + p["bv"][t_idx, a_idx]
            + p["ba"][t_idx, b_idx] + np.einsum("ij,ij->i", u, v)
            + np.einsum("ij,ij->i", pp, q) + scale * shared)
    r = w * (pred - y)
    rs = r * scale
    g = {"mu": add(t_idx, r, k), "wv": add(t_idx, r[:, None] * fa, k),
         "wa": add(t_idx, r[:, None] * fb, k), "bv": add(ta, r, k * n), "ba": add(tb, r, k * n),
         "U": add(a_idx, r[:, None] * v + rs[:, None] * v0, n), "V": add(tb, r[:, None] * u, k * n),
         "P": add(ta, r[:, None] * q, k * n), "Q": add(b_idx, r[:, None] * pp, n),
         "bv0": add(a_idx, rs, n), "ba0": add(b_idx, rs, n), "V0": add(b_idx, rs[:, None] * u, n),
         "E": add(a_idx * n + b_idx, rs, n * n), "g": add(t_idx, r * shared, k)}
    g = {name: g[name].reshape(shape) for name, shape in shapes}
    value = 0.5 * float(np.sum(w * (pred - y) ** 2))
    own = np.full(k, TYPE_RIDGE if k > 1 else 1.0)
    for name, _ in shapes[1:-1]:
        weight = RIDGE * (PAIR_RIDGE if name == "E" else FACTOR_RIDGE if name in FACTORS else 1.0)
        if name in TYPE_TERMS:
            weight = weight * own.reshape((k,) + (1,) * (p[name].ndim - 1))
        value += 0.5 * float(np.sum(weight * p[name] ** 2))
        g[name] += weight * p[name]
    value += 0.5 * SCALE_RIDGE * float(np.sum((p["g"] - 1.0) ** 2))
    g["g"] += SCALE_RIDGE * (p["g"] - 1.0)
    g["g"][reference] = 0.0
    return value, np.concatenate([g[name].ravel() for name, _ in shapes])


def _problem(seed: int, n: int, k: int, d: int, count: int
             ) -> tuple[list[Entry], completion._Objective, np.ndarray]:
    rng = np.random.default_rng(seed)
    entries: list[Entry] = []
    for _ in range(count):
        a, b = rng.choice(n, 2, replace=False)
        entries.append((TYPES[int(rng.integers(k))], JOBS[a], JOBS[b],
                        float(rng.normal(0.4, 0.3)), float(rng.uniform(0.5, 15.0))))
    features = {j: list(rng.normal(size=d)) for j in JOBS[:n - 1]} if d else None
    feats = completion._standardised(JOBS[:n], features)
    objective = completion._Objective(entries, {j: i for i, j in enumerate(JOBS[:n])},
                                      {t: i for i, t in enumerate(TYPES[:k])}, feats, RANK, RIDGE)
    return entries, objective, feats


@pytest.mark.parametrize(("seed", "n", "k", "d", "count"),
                         [(1, 9, 3, 2, 40), (2, 6, 1, 0, 12), (3, 9, 2, 3, 70), (4, 5, 3, 0, 3)])
def test_the_one_pass_objective_is_the_per_parameter_form_bit_for_bit(
        seed: int, n: int, k: int, d: int, count: int) -> None:
    entries, objective, feats = _problem(seed, n, k, d, count)
    rng = np.random.default_rng(seed + 100)
    for _ in range(5):
        x = rng.normal(0.0, 0.5, objective.size)
        value, grad = objective.loss(x)
        want_value, want_grad = _reference(entries, n, k, feats, x, objective.reference)
        assert value == want_value
        assert np.array_equal(grad, want_grad)


def test_the_gradient_is_the_losss_by_finite_differences() -> None:
    _, objective, _ = _problem(5, 9, 3, 2, 50)
    rng = np.random.default_rng(6)
    x = rng.normal(0.0, 0.5, objective.size)
    _, grad = objective.loss(x)
    step = 1e-6
    for i in [*rng.choice(objective.size, 40, replace=False), objective.size - 1]:
        e = np.zeros_like(x)
        e[i] = step
        numeric = (objective.loss(x + e)[0] - objective.loss(x - e)[0]) / (2 * step)
        if i == objective.size - objective.k + objective.reference:
            continue  # the reference type's scale: held at 1, its gradient set to 0
        assert numeric == pytest.approx(grad[i], rel=1e-5, abs=1e-6)


def _entries(count: int) -> list[Entry]:
    rng = np.random.default_rng(7)
    return [("t", JOBS[i % 9], JOBS[(i + 1 + i // 9) % 9], float(rng.normal(0.4, 0.2)), 2.0)
            for i in range(count)]


def test_a_completion_asked_again_unchanged_is_not_refitted_and_a_new_sample_refits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fits = []
    real = completion.minimize

    def counted(*args: object, **kwargs: object) -> object:
        fits.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(completion, "minimize", counted)
    entries = _entries(12)
    first = complete(entries, JOBS, ["t"], 0.01)
    assert len(fits) == 1
    again = complete(list(entries), list(JOBS), ["t"], 0.01)
    assert again is first and len(fits) == 1
    more = complete([*entries, ("t", JOBS[0], JOBS[5], 0.9, 1.0)], JOBS, ["t"], 0.01)
    assert len(fits) == 2
    assert more.logs[("t", JOBS[0], JOBS[5])] != first.logs[("t", JOBS[0], JOBS[5])]
    complete(entries, JOBS, ["t"], 0.01, start=first.params)  # a new start: fitted again
    assert len(fits) == 3
