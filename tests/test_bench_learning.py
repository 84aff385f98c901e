"""benchmarks/learning.py on W-Small: where the priors are optimistic, online learning
beats them, its utilisation error falls, and the believed curve never moves away from the
truth."""

from __future__ import annotations

from bench_modules import load

load("_common")  # the benchmark's own first import, found beside it when run as a script
learning = load("learning")


def test_optimistic_truth_on_w_small_is_learned():
    from extender.simulator.workloads import generate, with_models

    jobs = with_models(generate("w-small", 1), 10)
    result = learning.scenario("w-small", jobs, "testbed", 1, "optimistic")
    runs, curve = result["runs"], result["learning_curve"]
    assert set(runs) == {"online", "prior", "oracle"}
    assert runs["online"]["makespan_s"] < 0.9 * runs["prior"]["makespan_s"]
    assert runs["oracle"]["makespan_s"] <= runs["prior"]["makespan_s"]
    assert curve[-1]["completed_jobs"] == len(jobs)
    assert curve[-1]["mean_abs_error_points"] < result["prior_mean_abs_error_points"] / 4
    # At the agents' real cadence (one curve point per GPU a minute) W-Small's shared GPUs
    # give too few points for a refit; a refit that does not beat the prior is not adopted.
    assert curve[-1]["curve_error_slowdown"] <= runs["prior"]["curve_error_slowdown"]


def test_the_random_truth_has_no_curve_to_compare():
    from extender.simulator.workloads import generate, with_models

    result = learning.scenario("w-small", with_models(generate("w-small", 1), 10), "testbed", 1,
                               "random")
    assert result["runs"]["prior"]["curve_error_slowdown"] is None
    assert all(p["curve_error_slowdown"] is None for p in result["learning_curve"])
