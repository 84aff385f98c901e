"""benchmarks/interference_h100.py: on the measured H100 world, figures that are not shares
teach the pair learner nothing, and figures that are shares teach it."""

from __future__ import annotations

from bench_modules import load

load("_common")  # the benchmark's own first import, found beside it when run as a script
bench = load("interference_h100")


def test_time_sliced_figures_leave_pair_learning_idle_and_shares_feed_it() -> None:
    sliced = bench._seed_runs("w-small", ("time-sliced", 1))
    shares = bench._seed_runs("w-small", ("proportional", 1))
    assert sliced["pair-aware"]["pair_samples"] == 0 < sliced["pair-aware"]["not_shares"]
    # nothing learned beyond what curve-only learns: the same placements, the same times
    for key in bench.KEYS:
        assert sliced["pair-aware"][key] == sliced["curve-only"][key]
    assert shares["pair-aware"]["pair_samples"] > 0 == shares["pair-aware"]["not_shares"]
    # the fixed-prior and oracle modes do not read the agents
    assert sliced["oracle"] == shares["oracle"] and sliced["prior"] == shares["prior"]
