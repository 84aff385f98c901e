"""benchmarks/h100_colocation.py: on the committed H100 campaign its figures keep their
structural truths (no method beats the measured optimum, per-process figures are not
shares), and on hand-made matrices it finds the answers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from bench_modules import load

load("_common")  # the benchmark's own first import, found beside it when run as a script
bench = load("h100_colocation")

on_data = pytest.mark.skipif(not (bench.DATA.is_dir() and bench.RETEST.is_dir()),
                             reason="H100 campaign or its retest not present")


@pytest.fixture(scope="module")
def runs() -> tuple:
    return bench.load(bench.DATA), bench.load(bench.RETEST)


@pytest.fixture(scope="module")
def report(runs: tuple) -> dict:
    return bench.analyse(*runs, draws=20, seed=0)


@on_data
def test_the_retest_compares_every_directed_pair_both_runs_measured(runs: tuple,
                                                                    report: dict) -> None:
    campaign, again = runs
    assert len(campaign.models) == 12 and len(campaign.pairs) == 132
    assert len(campaign.triples) == 2 and all(len(t) == 3 for t in campaign.triples)
    noise = report["retest"]["log_slowdown_directed_pairs"]
    assert noise["n"] == len(set(campaign.pairs) & set(again.pairs)) == 2 * 39
    assert noise["sigma_one_measurement"] == pytest.approx(noise["sd_difference"] / math.sqrt(2),
                                                           abs=1e-4)
    assert report["retest"]["log_isolated_step_time"]["n"] == 12
    ceiling = report["variance_explained"]["noise"]
    assert 0 < ceiling["noise_share"] < 1
    assert ceiling["r2_ceiling"] == pytest.approx(1 - ceiling["noise_share"], abs=1e-4)


@on_data
def test_no_placement_is_worth_more_than_the_measured_optimum(runs: tuple, report: dict) -> None:
    decided = report["decisions"]
    best = decided["optimum"]["value"]
    assert decided["matchings"] == 10395 and decided["gpus"] == 6
    assert sorted(m for pair in decided["optimum"]["pairs"] for m in pair) == runs[0].models
    assert decided["optimum"]["percent_of_optimum"] == 100.0
    for method in decided["methods"].values():
        assert method["value"] <= best and method["percent_of_optimum"] <= 100.0
    chance = decided["random"]
    assert chance["value"] < best
    assert chance["worst_percent_of_optimum"] <= chance["p5_percent_of_optimum"] \
        <= chance["percent_of_optimum"] <= chance["p95_percent_of_optimum"] < 100.0
    for noisy in decided["noisy_matrix"].values():
        assert noisy["min_percent_of_optimum"] <= noisy["mean_percent_of_optimum"] <= 100.0


@on_data
def test_per_process_figures_on_a_time_sliced_gpu_are_not_shares(report: dict) -> None:
    sig = report["signal"]
    assert sig["own_figures_sum_over_gpu_util"]["n"] == 66
    assert sig["own_figures_sum_over_gpu_util"]["min"] >= 1.5
    rmse = sig["rmse_log_own_figure_vs"]
    assert rmse["gpu_util_time_sliced"] < rmse["sub_proportional_u_over_sqrt_s"] \
        < rmse["proportional_u_over_s"]


@on_data
def test_a_linear_model_predicts_unseen_pairs_no_better_than_seen_ones(report: dict) -> None:
    # Least squares: a held-out row's error is its in-sample residual scaled up by (I - H)^-1.
    fit = report["variance_explained"]["two_factor"]
    assert fit["r2_leave_one_pair_out"] <= fit["r2_in_sample"]
    features = report["features"]
    assert features["n"] == 12
    assert all(-1 <= v["rho"] <= 1 for f in ("sensitivity", "aggressiveness")
               for v in features[f].values())


@on_data
def test_asymmetry_counts_and_the_triples_sum_rule(runs: tuple, report: dict) -> None:
    asym = report["asymmetry"]
    assert asym["beyond_strict"] <= asym["beyond_noise"] <= asym["unordered_pairs"] == 66
    gaps = [row["abs_log_difference"] for row in asym["largest"]]
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] >= asym["median_abs_log_difference"]
    for triple in report["triples"]["triples"]:
        for member in triple["members"]:
            extra = sum(max(1.0, p) - 1 for p in member["pair_slowdowns"])
            assert member["sum"] == pytest.approx(1 + extra, abs=2e-4)
            assert member["max"] <= member["sum"] <= member["product"] + 1e-4


def _four_jobs() -> np.ndarray:
    """Matchings {0,1}{2,3}: (1/2 + 1/2 + 1 + 1) / 2 = 1.5; {0,2}{1,3}: 2/1.25 = 1.6;
    {0,3}{1,2}: 2/1.6 = 1.25. The best is {0,2}{1,3}."""
    s = np.ones((4, 4))
    for (a, b), v in {(0, 1): 2.0, (2, 3): 1.0, (0, 2): 1.25, (1, 3): 1.25, (0, 3): 1.6,
                      (1, 2): 1.6}.items():
        s[a, b] = s[b, a] = v
    return s


def test_four_jobs_by_hand() -> None:
    every = bench.matchings(4)
    assert every.shape == (3, 2, 2)
    assert all(sorted(m.ravel().tolist()) == [0, 1, 2, 3] for m in every)
    assert len(bench.matchings(12)) == 10395  # 11 * 9 * 7 * 5 * 3
    measured = _four_jobs()
    worth = bench.values(measured, every)
    assert sorted(worth.tolist()) == pytest.approx([1.25, 1.5, 1.6])
    best = bench.judge(measured, worth, every, ["a", "b", "c", "d"])
    assert best["value"] == pytest.approx(1.6) and best["pairs"] == [["a", "c"], ["b", "d"]]
    wrong = np.full((4, 4), 2.0)
    wrong[0, 1] = wrong[1, 0] = wrong[2, 3] = wrong[3, 2] = 1.0  # ranks {0,1}{2,3} first
    chosen = bench.judge(wrong, worth, every, ["a", "b", "c", "d"])
    assert chosen["value"] == pytest.approx(1.5)
    assert chosen["percent_of_optimum"] == pytest.approx(93.75)
    assert chosen["share_of_matchings_worth_less"] == pytest.approx(1 / 3, abs=1e-4)
    assert bench.random_matchings(worth)["value"] == pytest.approx(1.45)
    exact = bench.noisy_matrix(measured, every, 0.0, 5, np.random.default_rng(0))
    assert exact["mean_percent_of_optimum"] == 100.0 and exact["share_of_draws_at_optimum"] == 1


def test_two_factor_recovers_factors_it_was_built_from() -> None:
    models = ["a", "b", "c", "d"]
    sens, aggr = np.array([0.1, -0.1, 0.3, -0.3]), np.array([-0.2, 0.2, 0.05, -0.05])
    logs = {(a, b): 0.2 + sens[i] + aggr[j] for i, a in enumerate(models)
            for j, b in enumerate(models) if a != b}
    c, got_sens, got_aggr = bench.two_factor(logs, models)
    assert c == pytest.approx(0.2) and got_sens == pytest.approx(sens, abs=1e-9)
    assert got_aggr == pytest.approx(aggr, abs=1e-9)


def test_asymmetry_against_the_noise_by_hand() -> None:
    figures = {("a", "b"): 1.0, ("b", "a"): 1.5, ("a", "c"): 1.1, ("c", "a"): 1.1,
               ("b", "c"): 1.2, ("c", "b"): 1.0}
    run = bench.Campaign(["a", "b", "c"], {}, {k: {"slowdown": v} for k, v in figures.items()})
    # |log| gaps 0.405, 0.182, 0; thresholds 2 * 0.08 = 0.16 and 0.16 * sqrt(2) = 0.226
    asym = bench.asymmetry(run, 0.08)
    assert (asym["beyond_noise"], asym["beyond_strict"]) == (2, 1)
    assert asym["largest"][0]["a"] == "a" and asym["largest"][0]["b"] == "b"
    assert asym["largest"][0]["abs_log_difference"] == pytest.approx(math.log(1.5), abs=1e-4)
