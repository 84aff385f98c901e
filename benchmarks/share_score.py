"""Lucid-style share score on measured pairs: does refusing by it avoid pairs that lose
without refusing pairs that win, beyond what the curve alone refuses?

Data: twelve training jobs on one H100, time-sliced, each alone and in every pair
(``training_data/nvidia-h100-80gb-hbm3/``, 66 pairs), and the retest minutes later on
the same machine (``benchmarks/results/h100_pairs_retest/``, 39 pairs). The only
measured pairs with each job's alone utilisation and memory (Gavel's matrices have none).

A decision: a GPU runs job ``a``, job ``b`` arrives; it either **shares** (worth the
measured combined normalised progress ``1/s_ab + 1/s_ba``) or **takes turns** (worth
``1 + m``: exclusive GPUs, ``m`` the margin sharing must clear; ``m = 0`` is the question
asked: a pair *loses* when its combined progress is below 1). Methods, each a rule on the
alone utilisations (measured alone, or as predicted: times ``exp(N(0, 0.13))``, the
predictor's RMSLE):

- ``share_all``: every pair shares;
- ``curve``: tandem's co-location rule with the shipped H100 curve
  (``extender.core.cost.colocation_gain``, gain margin ``100 m`` percent);
- ``score_tuned``: the curve, plus ``extender.core.share_score`` with the tiers and limit
  (or none: off) that do best on the tuning pairs;
- ``score_shipped``: the curve plus the module's tiers (thirds of the GPU) at Lucid's limit 2;
- ``random``: the curve plus as many refusals as ``score_shipped`` adds, drawn at random.

Held-out: (a) per seed, the twelve jobs split at random into halves; tuned on the pairs
within one half, judged on the pairs within the other (mean and 95% t interval over
seeds); (b) tuned on the first campaign, judged on the retest (bootstrap over its pairs).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import numpy as np
from scipy.stats import spearmanr

from extender.config.loader import load_config
from extender.core.cost import CostPolicy, colocation_gain, curve_coefficients
from extender.core.share_score import TIERS, over_limit, share_score
from lab.simulator.profiled import import_profiled

_gavel = _common.sibling("interference")
interval = _gavel.interval
CAMPAIGN = _common.ROOT / "training_data" / "nvidia-h100-80gb-hbm3"
RETEST = _common.RESULTS / "h100_pairs_retest"
UTIL_SD = 0.13
"""Log spread of predicted utilisation (Horus's predictor RMSLE): the ``predicted`` view."""
GRID_TIERS = [(float(a), float(b)) for a in range(10, 100, 10) for b in range(a + 10, 101, 10)]
LIMITS = (0, 1, 2, 3)
"""Score limits tried (two jobs of tiers 0..2 sum to 0..4: 4 never refuses)."""
Rule = tuple[tuple[float, ...], int] | None
"""Tiers and limit of the share score; None: off."""


@dataclass(frozen=True)
class Pairs:
    """Measured pairs of one campaign: names, alone utilisations, combined progress."""

    gpu_type: str
    names: list[tuple[str, str]]
    util_a: np.ndarray
    util_b: np.ndarray
    combined: np.ndarray
    mem_share: float
    """The largest alone memory of a job, as a share of the GPU's 80 GB."""

    def subset(self, keep: np.ndarray, util_a: np.ndarray | None = None,
               util_b: np.ndarray | None = None) -> Pairs:
        return Pairs(self.gpu_type, [n for n, k in zip(self.names, keep, strict=True) if k],
                     (self.util_a if util_a is None else util_a)[keep],
                     (self.util_b if util_b is None else util_b)[keep], self.combined[keep],
                     self.mem_share)


def load_pairs(directory: Path) -> Pairs:
    """Every pair measured both ways in ``directory`` (a ``tandem profile run`` output)."""
    gpu_type, table, models = import_profiled(directory)
    names, ua, ub, comb = [], [], [], []
    for a, b in itertools.combinations(sorted(models), 2):
        s_ab, s_ba = table.slowdown.get(a, {}).get(b), table.slowdown.get(b, {}).get(a)
        if s_ab is None or s_ba is None:
            continue
        names.append((a, b))
        ua.append(models[a].util_percent[gpu_type])
        ub.append(models[b].util_percent[gpu_type])
        comb.append(1.0 / s_ab + 1.0 / s_ba)
    mem = max(m.mem_mib[gpu_type] for m in models.values()) / 81559.0
    return Pairs(gpu_type, names, np.array(ua), np.array(ub), np.array(comb), mem)


def curve_shares(pairs: Pairs, policy: CostPolicy, margin: float) -> np.ndarray:
    """The curve's co-location rule: ``b`` joins ``a`` if the GPU's rate grows by > margin."""
    coeffs = curve_coefficients(policy, [pairs.gpu_type])
    n = pairs.util_a.size
    gain = colocation_gain(pairs.util_a, pairs.util_b, np.ones(n), coeffs)
    return gain > margin


def score_refuses(pairs: Pairs, rule: Rule) -> np.ndarray:
    """Where the share score refuses ``b`` joining ``a`` (the extender's own function)."""
    if rule is None:
        return np.zeros(pairs.util_a.size, dtype=bool)
    tiers, limit = rule
    return np.array([over_limit(limit, b, [a], tiers)
                     for a, b in zip(pairs.util_a.tolist(), pairs.util_b.tolist(), strict=True)])


def outcome(pairs: Pairs, shares: np.ndarray, margin: float) -> dict[str, float]:
    """Mean value per decision, and losing pairs shared / winning pairs refused."""
    c = pairs.combined
    value = np.where(shares, c, 1.0 + margin)
    lose = c < 1.0 + margin
    return {"value": float(value.mean()), "best": float(np.maximum(c, 1.0 + margin).mean()),
            "losers_shared": int((shares & lose).sum()),
            "winners_refused": int((~shares & ~lose).sum()), "refused": int((~shares).sum())}


def tune(pairs: Pairs, curve: np.ndarray, margin: float) -> Rule:
    """The rule (or off) with the best value on ``pairs``; ties: the fewest refusals, off first."""
    best: tuple[float, int] = (outcome(pairs, curve, margin)["value"], 0)
    chosen: Rule = None
    for tiers, limit in itertools.product([*GRID_TIERS, TIERS], LIMITS):
        refused = score_refuses(pairs, (tiers, limit))
        got = outcome(pairs, curve & ~refused, margin)
        key = (got["value"], -int(refused.sum()))
        if key[0] > best[0] + 1e-12 or (abs(key[0] - best[0]) <= 1e-12 and key[1] > best[1]):
            best, chosen = key, (tiers, limit)
    return chosen


def methods(pairs: Pairs, policy: CostPolicy, margin: float, rule: Rule,
            rng: np.random.Generator, draws: int = 200) -> dict[str, dict[str, float]]:
    """Every method's outcome on ``pairs`` (``random``: the mean of ``draws`` draws)."""
    curve = curve_shares(pairs, policy, margin)
    shipped = curve & ~score_refuses(pairs, (TIERS, 2))
    extra = int((curve & ~shipped).sum())
    candidates = np.flatnonzero(curve)
    randoms = []
    for _ in range(draws):
        shares = curve.copy()
        shares[rng.choice(candidates, size=extra, replace=False)] = False
        randoms.append(outcome(pairs, shares, margin))
    return {"share_all": outcome(pairs, np.ones_like(curve), margin),
            "curve": outcome(pairs, curve, margin),
            "score_tuned": outcome(pairs, curve & ~score_refuses(pairs, rule), margin),
            "score_shipped": outcome(pairs, shipped, margin),
            "random": {k: float(np.mean([r[k] for r in randoms])) for k in randoms[0]}}


def _noisy(pairs: Pairs, rng: np.random.Generator, sd: float) -> tuple[np.ndarray, np.ndarray]:
    """Alone utilisations as predicted: each job's figure times one lognormal draw."""
    jobs = sorted({j for pair in pairs.names for j in pair})
    factor = dict(zip(jobs, np.exp(rng.normal(0.0, sd, len(jobs))), strict=True))
    return (pairs.util_a * np.array([factor[a] for a, _ in pairs.names]),
            pairs.util_b * np.array([factor[b] for _, b in pairs.names]))


def split_seeds(pairs: Pairs, policy: CostPolicy, margin: float, seeds: int,
                sd: float) -> dict[str, Any]:
    """(a): tuned within one random half of the jobs, judged within the other."""
    jobs = sorted({j for pair in pairs.names for j in pair})
    per: dict[str, list[dict[str, float]]] = {}
    rules: list[str] = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        ua, ub = _noisy(pairs, rng, sd) if sd > 0 else (pairs.util_a, pairs.util_b)
        half = set(rng.permutation(jobs)[: len(jobs) // 2].tolist())
        inside = np.array([a in half and b in half for a, b in pairs.names])
        outside = np.array([a not in half and b not in half for a, b in pairs.names])
        tuning, held = pairs.subset(inside, ua, ub), pairs.subset(outside, ua, ub)
        rule = tune(tuning, curve_shares(tuning, policy, margin), margin)
        rules.append("off" if rule is None else f"tiers {rule[0]} limit {rule[1]}")
        for name, got in methods(held, policy, margin, rule, rng).items():
            per.setdefault(name, []).append(got)
    out: dict[str, Any] = {name: {k: interval([r[k] for r in runs]) for k in runs[0]}
                           for name, runs in per.items()}
    out["score_tuned_minus_curve"] = interval([s["value"] - c["value"] for s, c in
                                               zip(per["score_tuned"], per["curve"], strict=True)])
    out["score_shipped_minus_random"] = interval(
        [s["value"] - r["value"] for s, r in zip(per["score_shipped"], per["random"],
                                                 strict=True)])
    out["rules_chosen"] = {r: rules.count(r) for r in sorted(set(rules))}
    return out


def retest(first: Pairs, second: Pairs, policy: CostPolicy, margin: float,
           boots: int) -> dict[str, Any]:
    """(b): tuned on the first campaign, judged on the retest; bootstrap over its pairs."""
    rule = tune(first, curve_shares(first, policy, margin), margin)
    rng = np.random.default_rng(0)
    got = methods(second, policy, margin, rule, rng)
    curve = curve_shares(second, policy, margin)
    values = {name: np.where(curve & ~score_refuses(second, r), second.combined, 1.0 + margin)
              for name, r in (("score_tuned", rule), ("score_shipped", (TIERS, 2)))}
    base = np.where(curve, second.combined, 1.0 + margin)
    diffs = {}
    for name, v in values.items():
        idx = rng.integers(0, v.size, size=(boots, v.size))
        d = (v[idx] - base[idx]).mean(axis=1)
        diffs[f"{name}_minus_curve"] = {"mean": round(float((v - base).mean()), 4),
                                        "ci95": [round(float(np.quantile(d, q)), 4)
                                                 for q in (0.025, 0.975)]}
    return {"rule_chosen": "off" if rule is None else f"tiers {rule[0]} limit {rule[1]}",
            **got, **diffs}


def ranking(pairs: Pairs) -> dict[str, float]:
    """Spearman correlation of combined progress with minus each pair figure (all pairs)."""
    summed = pairs.util_a + pairs.util_b
    scores = np.array([share_score(a) + share_score(b)
                       for a, b in zip(pairs.util_a, pairs.util_b, strict=True)])
    return {"summed_utilisation": round(float(spearmanr(-summed, pairs.combined)[0]), 3),
            "share_score_sum": round(float(spearmanr(-scores, pairs.combined)[0]), 3)}


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 4) if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    return obj


def main() -> None:
    """Run both held-out schemes for each margin and write the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--margins", default="0,0.1,0.2")
    parser.add_argument("--boots", type=int, default=2000)
    _common.add_out_option(parser, "share_score")
    args = parser.parse_args()
    started = time.perf_counter()
    policy = load_config(None).policy
    first, second = load_pairs(CAMPAIGN), load_pairs(RETEST)
    report: dict[str, Any] = {
        "data": {"campaign_pairs": len(first.names), "retest_pairs": len(second.names),
                 "losing_pairs": {"campaign": int((first.combined < 1).sum()),
                                  "retest": int((second.combined < 1).sum())},
                 "combined_min_max": [round(float(first.combined.min()), 3),
                                      round(float(first.combined.max()), 3)],
                 "largest_alone_memory_share": round(first.mem_share, 3)},
        "shipped_rule": {"tiers": [round(t, 2) for t in TIERS], "limit": 2},
        "ranking_spearman": ranking(first)}
    for margin in (float(m) for m in args.margins.split(",")):
        report[f"margin={margin:g}"] = {
            "split_measured": split_seeds(first, policy, margin, args.seeds, 0.0),
            "split_predicted": split_seeds(first, policy, margin, args.seeds, UTIL_SD),
            "tuned_campaign_judged_retest": retest(first, second, policy, margin, args.boots)}
    report["seconds"] = round(time.perf_counter() - started, 1)
    report.update(_common.context(("numpy", "scipy")))
    _common.write_result(_rounded(report), args.out)


if __name__ == "__main__":
    main()
