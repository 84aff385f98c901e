"""What the first real-GPU co-location campaign says: noise, models, placements, signal.

Measured on one NVIDIA H100 80GB HBM3 (time-slicing, no MPS), analysed here on CPU
from the committed files: ``training_data/nvidia-h100-80gb-hbm3/`` (12 training jobs,
batch 32, alone, in every pair and in two triples) and its independent rerun minutes
later, ``benchmarks/results/h100_pairs_retest/`` (the 12 alone, 39 of the pairs).

1. **retest**: the measurement noise everything else is judged against.
2. **asymmetry**: pairs whose two directions differ beyond that noise.
3. **variance explained** in log slowdown by tandem's curve and a per-job two-factor
   model, in sample and leaving one unordered pair out, against the noise ceiling.
4. **decisions**: the 12 jobs two to a GPU; all 10,395 perfect matchings valued on
   the *measured* matrix (mean over GPUs of ``1/s_ab + 1/s_ba``).
5. **signal**: what a node agent's NVML figures say about slowdown.
6. **features**: whether what tandem knows of a job alone predicts its factors.
7. **triples**: against the product, max and sum (tandem's) rules.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common
import numpy as np
from scipy.optimize import least_squares
from scipy.stats import pearsonr, spearmanr

from contracts.interferencefile import PairTable
from lab.simulator.pairwise import job_slowdowns
from predictor.curves import InterferenceCurve, fit_curve
from predictor.dataset import load_gpu_dir

DATA = _common.ROOT / "training_data" / "nvidia-h100-80gb-hbm3"
RETEST = _common.RESULTS / "h100_pairs_retest"
FEATURES = ("util_mean_percent", "step_time_ms", "flops", "params_bytes", "activations_bytes")
Pair = tuple[str, str]


@dataclass
class Campaign:
    """One run's figures: the jobs alone, each directed pair's row, the triples' rows."""

    models: list[str]
    isolated: dict[str, dict[str, Any]]
    pairs: dict[Pair, dict[str, Any]] = field(default_factory=dict)  # (a, b): a's row beside b
    triples: list[list[dict[str, Any]]] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)

    def log_slowdowns(self) -> dict[Pair, float]:
        return {k: math.log(r["slowdown"]) for k, r in self.pairs.items()}

    def matrix(self) -> np.ndarray:
        """``S[i, j]``: job ``i``'s measured slowdown beside job ``j`` (diagonal 1)."""
        s = np.ones((len(self.models), len(self.models)))
        for (a, b), row in self.pairs.items():
            s[self.models.index(a), self.models.index(b)] = row["slowdown"]
        return s


def load(directory: Path) -> Campaign:
    """Read one run through the project's own loader (ok rows only)."""
    data = load_gpu_dir(directory)
    isolated = {r["model"]: r for r in data.isolated if r["status"] == "ok"}
    run = Campaign(sorted(isolated), isolated, provenance=data.provenance)
    combos: dict[str, list[dict[str, Any]]] = {}
    for row in (r for r in data.colocated if r["status"] == "ok"):
        combos.setdefault(row["combo_id"], []).append(row)
    for rows in combos.values():
        rows.sort(key=lambda r: r["job_index"])
        if len(rows) != 2:
            run.triples.append(rows)
            continue
        for x, y in (rows, rows[::-1]):
            assert (x["model"], y["model"]) not in run.pairs, "a pair measured twice"
            run.pairs[x["model"], y["model"]] = x
    return run


def _rho(x: Any, y: Any, kind: Callable[..., Any] = pearsonr) -> float:
    return round(float(kind(x, y)[0]), 4)


def _stats(x: list[float], y: list[float]) -> dict[str, Any]:
    d = np.asarray(y) - np.asarray(x)
    return {"n": len(x), "pearson": _rho(x, y), "spearman": _rho(x, y, spearmanr),
            "mean_difference": round(float(d.mean()), 4),
            "sd_difference": round(float(d.std(ddof=1)), 4)}


def retest(campaign: Campaign, again: Campaign) -> dict[str, Any]:
    """Two runs of the same pairs on the same GPU: the noise floor. Any model or decision
    that differs from another by less than this cannot be told apart from it here."""
    common = sorted(set(campaign.pairs) & set(again.pairs))
    first, second = campaign.log_slowdowns(), again.log_slowdowns()
    pairs = _stats([first[k] for k in common], [second[k] for k in common])
    pairs["sigma_one_measurement"] = round(pairs["sd_difference"] / math.sqrt(2), 4)
    models = sorted(set(campaign.isolated) & set(again.isolated))
    alone = _stats(*([math.log(run.isolated[m]["step_time_ms"]) for m in models]
                     for run in (campaign, again)))
    alone["ratio_retest_over_campaign"] = {
        m: round(again.isolated[m]["step_time_ms"] / campaign.isolated[m]["step_time_ms"], 4)
        for m in models}
    return {"log_slowdown_directed_pairs": pairs, "log_isolated_step_time": alone,
            "note": "differences are retest minus campaign; sigma_one_measurement = "
                    "sd_difference / sqrt(2), the noise of one measured log slowdown"}


def asymmetry(campaign: Campaign, sd_difference: float) -> dict[str, Any]:
    """Who slows whom is directional: a symmetric score (a curve of the pair's summed
    utilisation) cannot rank pairs whose two directions differ beyond the noise."""
    logs = campaign.log_slowdowns()
    rows = sorted(((abs(logs[a, b] - logs[b, a]), a, b) for a, b in logs if a < b),
                  reverse=True)
    # |log s_ab - log s_ba| of a symmetric pair is a difference of two measurements, as a
    # retest difference is: its noise sd is sd_difference (= sigma * sqrt(2)).
    threshold, strict = 2 * sd_difference, 2 * sd_difference * math.sqrt(2)
    return {"unordered_pairs": len(rows),
            "threshold_2_sigma_sqrt2": round(threshold, 4),
            "beyond_noise": sum(d > threshold for d, _, _ in rows),
            "threshold_strict_2_sd_difference_sqrt2": round(strict, 4),
            "beyond_strict": sum(d > strict for d, _, _ in rows),
            "median_abs_log_difference": round(float(np.median([d for d, _, _ in rows])), 4),
            "largest": [{"a": a, "b": b, "s_a_beside_b": round(campaign.pairs[a, b]["slowdown"], 4),
                         "s_b_beside_a": round(campaign.pairs[b, a]["slowdown"], 4),
                         "abs_log_difference": round(d, 4)} for d, a, b in rows[:5]]}


# ---- models of log slowdown ------------------------------------------------------------
def tandem_curve(points: list[tuple[float, float]]) -> InterferenceCurve:
    """tandem's own fit (``predictor.curves.fit_curve``, what ``fit-curves`` writes)."""
    return fit_curve("h100", [u for u, _ in points], [s for _, s in points]).curve


def log_curve(points: list[tuple[float, float]]) -> InterferenceCurve:
    """The same piecewise form fitted by least squares on log slowdown (the best curve by
    the measure reported here), started from tandem's fit."""
    u, y = np.array([p[0] for p in points]) / 100.0, np.log([p[1] for p in points])
    start = tandem_curve(points)

    def residual(p: np.ndarray) -> np.ndarray:
        over = np.maximum(u - 1, 0)
        cost = p[0] + p[1] * np.minimum(u, 1) + p[2] * over + p[3] * over * over
        return np.log(np.maximum(1 + cost, 1e-6)) - y

    p0 = np.clip([start.intercept, start.slope, start.over_slope, start.over_quadratic],
                 [-0.98, 0, 0, 0], [9, 9, 9, 9])  # inside the bounds, as least_squares needs
    p = least_squares(residual, p0, bounds=([-0.99, 0, 0, 0], [10, 10, 10, 10])).x
    return InterferenceCurve(slope=p[1], over_slope=p[2], over_quadratic=p[3], intercept=p[0])


def curve_points(campaign: Campaign, keys: list[Pair]) -> list[tuple[float, float]]:
    return [(campaign.pairs[k]["cumulative_isolated_util_percent"], campaign.pairs[k]["slowdown"])
            for k in keys]


def two_factor(logs: dict[Pair, float], models: list[str]) -> tuple[float, np.ndarray, np.ndarray]:
    """``log s_ab = c + sens_a + aggr_b`` by least squares; factors centred on 0."""
    n = len(models)
    x = np.zeros((len(logs), 1 + 2 * n))
    for row, (a, b) in enumerate(logs):
        x[row, 0] = x[row, 1 + models.index(a)] = x[row, 1 + n + models.index(b)] = 1
    beta = np.linalg.lstsq(x, np.array(list(logs.values())), rcond=None)[0]
    sens, aggr = beta[1:1 + n], beta[1 + n:]
    return float(beta[0] + sens.mean() + aggr.mean()), sens - sens.mean(), aggr - aggr.mean()


def two_factor_matrix(logs: dict[Pair, float], models: list[str]) -> np.ndarray:
    """The slowdowns the two-factor fit to ``logs`` gives every directed pair."""
    c, sens, aggr = two_factor(logs, models)
    return np.exp(c + sens[:, None] + aggr[None, :])


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    return round(1 - float(np.sum((y - predicted) ** 2) / np.sum((y - y.mean()) ** 2)), 4)


Predictor = Callable[[Pair], float]  # a fitted model: the log slowdown of a directed pair


def curve_model(fit: Callable[[list[tuple[float, float]]], InterferenceCurve]
                ) -> Callable[[Campaign, list[Pair]], Predictor]:
    """A curve fit as a model of log slowdown (one figure for both directions of a pair)."""
    def model(campaign: Campaign, keys: list[Pair]) -> Predictor:
        curve = fit(curve_points(campaign, keys))
        return lambda k: math.log(curve.slowdown(
            campaign.pairs[k]["cumulative_isolated_util_percent"]))
    return model


def two_factor_model(campaign: Campaign, keys: list[Pair]) -> Predictor:
    """The two-factor fit on ``keys`` as a model of log slowdown."""
    logs = campaign.log_slowdowns()
    fit = two_factor_matrix({k: logs[k] for k in keys}, campaign.models)
    index = {m: i for i, m in enumerate(campaign.models)}
    return lambda k: math.log(fit[index[k[0]], index[k[1]]])


def r2(campaign: Campaign, model: Callable[[Campaign, list[Pair]], Predictor]
       ) -> dict[str, float]:
    """In sample (a model's best case) and for each pair fitted without both its
    directions (what a scheduler needs of a pair it has not measured)."""
    keys = sorted(campaign.pairs)
    y = np.array([math.log(campaign.pairs[k]["slowdown"]) for k in keys])
    full = model(campaign, keys)
    held = [model(campaign, [j for j in keys if set(j) != set(k)])(k) for k in keys]
    return {"r2_in_sample": _r2(y, np.array([full(k) for k in keys])),
            "r2_leave_one_pair_out": _r2(y, np.array(held))}


def variance_explained(campaign: Campaign, sigma: float) -> dict[str, Any]:
    """How much of who-slows-whom each model captures, against the share that is noise
    (no model of one measurement can explain its noise: ``1 - share`` is the ceiling)."""
    keys = sorted(campaign.pairs)
    total = float(np.var([math.log(campaign.pairs[k]["slowdown"]) for k in keys], ddof=1))
    out: dict[str, Any] = {"directed_pairs": len(keys), "total_variance": round(total, 5)}
    for name, fit in (("tandem_fit_curve", tandem_curve), ("curve_log_least_squares", log_curve)):
        coefficients = fit(curve_points(campaign, keys)).to_config()
        out[name] = {"coefficients": {k: round(v, 4) for k, v in coefficients.items()},
                     **r2(campaign, curve_model(fit))}
    out["two_factor"] = {"parameters": 1 + 2 * (len(campaign.models) - 1),
                         **r2(campaign, two_factor_model)}
    share = sigma ** 2 / total
    out["noise"] = {"noise_variance_sigma_squared": round(sigma ** 2, 5),
                    "noise_share": round(share, 4), "r2_ceiling": round(1 - share, 4)}
    return out


# ---- placements ------------------------------------------------------------------------
def matchings(n: int) -> np.ndarray:
    """Every perfect matching of ``n`` jobs, as an ``(count, n // 2, 2)`` index array."""
    def extend(left: tuple[int, ...]) -> list[list[tuple[int, int]]]:
        if not left:
            return [[]]
        first, rest = left[0], left[1:]
        return [[(first, other), *tail] for i, other in enumerate(rest)
                for tail in extend(rest[:i] + rest[i + 1:])]
    return np.array(extend(tuple(range(n))), dtype=int).reshape(-1, n // 2, 2)


def values(slowdowns: np.ndarray, every: np.ndarray) -> np.ndarray:
    """Each matching's mean over its GPUs of ``1/s_ab + 1/s_ba``."""
    w = 1 / slowdowns + 1 / slowdowns.T
    return w[every[..., 0], every[..., 1]].mean(axis=1)


def _percent(value: float, best: float) -> float:
    return round(100 * value / best, 2)


def judge(predicted: np.ndarray, worth: np.ndarray, every: np.ndarray, models: list[str]
          ) -> dict[str, Any]:
    """A method's choice on the measured values ``worth``: its value, its share of the
    optimum, the share of matchings worth less, how well it ranks them all, its pairs."""
    ranked = values(predicted, every)
    pick = int(np.argmax(ranked))
    value, best = float(worth[pick]), float(worth.max())
    return {"value": round(value, 4), "percent_of_optimum": _percent(value, best),
            "share_of_matchings_worth_less": round(float(np.mean(worth < value - 1e-12)), 4),
            "spearman_over_all_matchings": _rho(ranked, worth, spearmanr),
            "pairs": [[models[i], models[j]] for i, j in every[pick]]}


def curve_matrix(curve: InterferenceCurve, campaign: Campaign) -> np.ndarray:
    u = [campaign.isolated[m]["util_mean_percent"] for m in campaign.models]
    return np.array([[curve.slowdown(a + b) for b in u] for a in u])


def random_matchings(worth: np.ndarray) -> dict[str, float]:
    """What placing without a model gets: every matching equally likely (exact, no draws)."""
    best, mean = float(worth.max()), float(worth.mean())
    return {"value": round(mean, 4), "percent_of_optimum": _percent(mean, best),
            **{f"p{q}_percent_of_optimum": _percent(float(np.percentile(worth, q)), best)
               for q in (5, 95)},
            "worst_percent_of_optimum": _percent(float(worth.min()), best)}


def noisy_matrix(measured: np.ndarray, every: np.ndarray, sd: float, draws: int,
                 rng: np.random.Generator) -> dict[str, float]:
    """How much of a perfect matrix's value survives measurement noise: the choice of the
    measured matrix times lognormal noise of ``sd``, valued on the measured matrix."""
    worth = values(measured, every)
    best, logs = float(worth.max()), np.log(measured)
    got = np.array([worth[int(np.argmax(values(np.exp(logs + rng.normal(0, sd, logs.shape)),
                                               every)))] for _ in range(draws)])
    return {"sd": round(sd, 4), "mean_percent_of_optimum": _percent(float(got.mean()), best),
            "min_percent_of_optimum": _percent(float(got.min()), best),
            "share_of_draws_at_optimum": round(float(np.mean(np.isclose(got, best))), 3)}


def decisions(campaign: Campaign, again: Campaign, sd_difference: float, draws: int,
              seed: int) -> dict[str, Any]:
    """Models are for placing jobs: what each one's placement is worth on the measured
    matrix says more than its fit, and noise says how much a perfect matrix keeps."""
    measured = campaign.matrix()
    every = matchings(len(campaign.models))
    worth = values(measured, every)
    points = curve_points(campaign, sorted(campaign.pairs))
    predicted = {
        "tandem_fit_curve": curve_matrix(tandem_curve(points), campaign),
        "curve_log_least_squares": curve_matrix(log_curve(points), campaign),
        "two_factor_in_sample": two_factor_matrix(campaign.log_slowdowns(), campaign.models),
        "two_factor_fitted_on_retest": two_factor_matrix(again.log_slowdowns(), campaign.models),
    }
    rng = np.random.default_rng(seed)
    return {
        "matchings": len(every), "gpus": len(campaign.models) // 2,
        "optimum": judge(measured, worth, every, campaign.models),
        "methods": {name: judge(s, worth, every, campaign.models)
                    for name, s in predicted.items()},
        "note": "a two-factor (product) model values x_a*y_b + x_b*y_a with x = exp(-sens), "
                "y = exp(-aggr); with sens and aggr rising together it favours pairing like "
                "with like, so it can fit well and still rank matchings backwards",
        "random": random_matchings(worth),
        "noisy_matrix": {name: noisy_matrix(measured, every, sd, draws, rng) for name, sd in (
            ("sd_difference", sd_difference),
            ("sigma_one_measurement", sd_difference / math.sqrt(2)))},
        "draws": draws, "seed": seed,
    }


# ---- what an agent sees, what is known of a job alone, three to a GPU -------------------
def _rmse(x: np.ndarray, y: np.ndarray) -> float:
    return round(float(np.sqrt(np.mean((x - y) ** 2))), 4)


def signal(campaign: Campaign) -> dict[str, Any]:
    """A node agent learns from NVML: if a time-sliced job's own figure were its share of
    the GPU it would fall with slowdown; the figures test whether it does (and whether
    the GPU's figure ``g`` in place of the job's own ``o`` tells as much)."""
    keys, rows = sorted(campaign.pairs), campaign.pairs
    u, o, s, g = (np.array([rows[k][name] for k in keys], dtype=float) for name in (
        "isolated_util_percent", "process_util_mean_percent", "slowdown", "util_mean_percent"))
    summed = np.array([(rows[a, b]["process_util_mean_percent"]
                        + rows[b, a]["process_util_mean_percent"])
                       / rows[a, b]["util_mean_percent"] for a, b in keys if a < b])
    alone = max(abs(r["process_util_mean_percent"] - r["util_mean_percent"])
                for r in campaign.isolated.values())
    return {"directed_pairs": len(keys),
            "own_figures_sum_over_gpu_util": {"n": len(summed), **{
                k: round(float(f(summed)), 4)
                for k, f in (("min", np.min), ("median", np.median), ("max", np.max))}},
            "rmse_log_own_figure_vs": {
                "proportional_u_over_s": _rmse(np.log(o), np.log(u / s)),
                "sub_proportional_u_over_sqrt_s": _rmse(np.log(o), np.log(u / np.sqrt(s))),
                "gpu_util_time_sliced": _rmse(np.log(o), np.log(g))},
            "pearson_log_u_over_o_vs_log_s": _rho(np.log(u / o), np.log(s)),
            "spearman_log_u_over_o_vs_log_s": _rho(np.log(u / o), np.log(s), spearmanr),
            "pearson_log_u_over_g_vs_log_s": _rho(np.log(u / g), np.log(s)),
            "isolated_max_abs_process_minus_gpu_util": round(alone, 4)}


def features(campaign: Campaign) -> dict[str, Any]:
    """Whether a job's figures alone (what tandem has before it ever shares) rank its
    fitted sensitivity and aggressiveness; with 12 jobs only a strong link would show."""
    _, sens, aggr = two_factor(campaign.log_slowdowns(), campaign.models)
    out: dict[str, Any] = {"n": len(campaign.models),
                           "note": "Spearman over 12 jobs: |rho| < 0.58 is not significant "
                                   "at 5% (two-sided); 10 tests, no correction"}
    for name, factor in (("sensitivity", sens), ("aggressiveness", aggr)):
        out[name] = {}
        for feature in FEATURES:
            x = [float(campaign.isolated[m][feature]) for m in campaign.models]
            rho, p = spearmanr(x, factor)
            out[name][feature] = {"rho": round(float(rho), 4), "p": float(f"{p:.2g}")}
    out["factors"] = {m: {"sensitivity": round(float(sens[i]), 4),
                          "aggressiveness": round(float(aggr[i]), 4)}
                      for i, m in enumerate(campaign.models)}
    return out


def triples(campaign: Campaign) -> dict[str, Any]:
    """tandem predicts a job's slowdown among several from its pairs (1 + the sum of the
    extras: ``lab.simulator.pairwise.job_slowdowns``, called here, which holds each
    pair at >= 1); the measured triples test that rule against the product and the max
    of the same pair figures."""
    table = PairTable({a: {b: r["slowdown"] for (x, b), r in campaign.pairs.items() if x == a}
                       for a in campaign.models})
    out: list[dict[str, Any]] = []
    errors: dict[str, list[float]] = {"sum": [], "product": [], "max": []}
    for rows in campaign.triples:
        names = [r["model"] for r in rows]
        tandem = job_slowdowns(table, names, lambda i, j: math.nan)
        members = []
        for r, summed in zip(rows, tandem, strict=True):
            pairs = [campaign.pairs[r["model"], o]["slowdown"] for o in names if o != r["model"]]
            held = [max(1.0, p) for p in pairs]
            rule = {"sum": summed, "product": math.prod(held), "max": max(held)}
            for k, v in rule.items():
                errors[k].append(abs(math.log(v / r["slowdown"])))
            members.append({"model": r["model"], "measured": round(r["slowdown"], 4),
                            "pair_slowdowns": [round(p, 4) for p in pairs],
                            **{k: round(v, 4) for k, v in rule.items()}})
        out.append({"models": names, "members": members})
    return {"triples": out, "tandem_rule": "sum",
            "mean_abs_log_error": {k: round(float(np.mean(v)), 4) for k, v in errors.items()}}


def measured_on(campaign: Campaign, path: Path) -> dict[str, Any]:
    """Where and how the figures were measured, from the run's provenance."""
    p = campaign.provenance
    return {"data": str(path.relative_to(_common.ROOT)) if path.is_relative_to(_common.ROOT)
            else str(path), **p.get("hardware", {}),
            "pytorch": p.get("software", {}).get("pytorch"),
            "started_at": p.get("started_at"), "finished_at": p.get("finished_at"),
            "command": p.get("command"), "sharing": "time-slicing (compute mode Default), no MPS",
            "simulated": p.get("simulated")}


def analyse(campaign: Campaign, again: Campaign, draws: int = 200, seed: int = 0
            ) -> dict[str, Any]:
    """Every section of the report (module docstring)."""
    noise = retest(campaign, again)
    sd = noise["log_slowdown_directed_pairs"]["sd_difference"]
    sigma = noise["log_slowdown_directed_pairs"]["sigma_one_measurement"]
    return {"retest": noise, "asymmetry": asymmetry(campaign, sd),
            "variance_explained": variance_explained(campaign, sigma),
            "decisions": decisions(campaign, again, sd, draws, seed),
            "signal": signal(campaign), "features": features(campaign),
            "triples": triples(campaign)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--retest", type=Path, default=RETEST)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    _common.add_out_option(parser, "h100_colocation")
    args = parser.parse_args()
    campaign, again = load(args.data), load(args.retest)
    result: dict[str, Any] = {
        "benchmark": "h100_colocation",
        "measured_on": {"campaign": measured_on(campaign, args.data),
                        "retest": measured_on(again, args.retest)},
        "analysed_on": "CPU, from the committed CSVs (no GPU used by this program); "
                       "machine below",
        "jobs": campaign.models, **analyse(campaign, again, args.draws, args.seed),
        **_common.context(("numpy", "scipy"))}
    _common.write_result(result, args.out)


if __name__ == "__main__":
    main()
