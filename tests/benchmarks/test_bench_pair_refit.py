"""benchmarks/pair_refit.py: its learners reach the sizes it names, and both solvers agree."""

from __future__ import annotations

from bench_modules import load

load("_common")  # the benchmark's own first import, found beside it when run as a script
bench = load("pair_refit")


def test_a_small_learner_is_timed_and_the_general_solver_gives_the_same_pairs() -> None:
    learner = bench._learner(12, 100, 150, seed=1)
    assert learner.stats()["groups"] == 150 and learner.stats()["pairs"]
    assert bench._read(learner) >= 0.0
    assert bench._time(learner, solve=True) >= 0.0
    ours = learner.model().types["NVIDIA-A100"].inferred
    bench.pairs_module.least_squares = bench._general
    try:
        bench._time(learner, solve=True)
        theirs = learner.model().types["NVIDIA-A100"].inferred
    finally:
        bench.pairs_module.least_squares = bench._ORIGINAL
    assert ours.keys() == theirs.keys() and ours
    assert max(abs(ours[k][0] - theirs[k][0]) for k in ours) < 1e-3
