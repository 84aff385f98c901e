"""benchmarks/learning.py: on W-Small, where the priors are optimistic, online learning
beats them and its utilisation error falls; every truth has a curve to compare; the
intervals over seeds are computed as stated."""

from __future__ import annotations

import pytest
from bench_modules import load

load("_common")  # the benchmark's own first import, found beside it when run as a script
learning = load("learning")


def test_optimistic_truth_on_w_small_is_learned():
    from lab.simulator.workloads import generate, with_models

    jobs = with_models(generate("w-small", 1), 10)
    result = learning.scenario("w-small", jobs, "testbed", 1, "optimistic")
    runs, curve = result["runs"], result["learning_curve"]
    assert set(runs) == {"online", "prior", "oracle"}
    assert runs["online"]["makespan_s"] < 0.9 * runs["prior"]["makespan_s"]
    assert runs["oracle"]["makespan_s"] <= runs["prior"]["makespan_s"]
    assert curve[-1]["completed_jobs"] == len(jobs)
    assert curve[-1]["mean_abs_error_points"] < result["prior_mean_abs_error_points"] / 4
    # the learned curve never moves away from the truth (a refit must beat the curve in
    # force on held-out points; at one point per GPU a minute W-Small gives few)
    assert curve[-1]["curve_error_slowdown"] <= runs["prior"]["curve_error_slowdown"]
    assert result["truth"]["phases"]["warmup_seconds"] == 60.0  # the agents see warm-ups


def test_every_truth_has_a_curve_to_compare():
    truth = learning.make_truth("random", ["a", "b"], ["T1", "T2"], seed=3)
    assert set(truth.curves) == {"T1", "T2"} and truth.curves["T1"] != truth.curves["T2"]
    assert truth.phases == learning.PHASES


def test_intervals_over_seeds_are_student_t():
    found = learning.interval([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, sd 1.5811, t(0.975, 4) = 2.7764: half-width 1.9632
    assert found["n"] == 5 and found["mean"] == 3.0
    assert found["low"] == pytest.approx(1.0368, abs=1e-4)
    assert found["high"] == pytest.approx(4.9632, abs=1e-4)
    assert learning.interval([None, 2.0])["low"] is None  # one value: no interval


def test_the_unpaired_interval_is_welchs_and_wider_than_the_paired_one():
    prior = [100.0, 200.0, 300.0, 400.0, 500.0]
    online = [p - 10.0 for p in prior]
    found = learning.unpaired(online, prior)
    # diff of means -10; se sqrt(2 * 25000 / 5) = 100; Welch dof 8, t = 2.3060
    assert found["mean"] == pytest.approx(-10 / 300, abs=1e-4)
    assert found["high"] == pytest.approx((-10 + 230.60) / 300, abs=1e-3)
    paired = learning.interval([o / p - 1 for o, p in zip(online, prior, strict=True)])
    assert paired["high"] < 0 < found["high"]  # the same seed's runs move together
