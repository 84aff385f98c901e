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
    # the fixed-prior mode does not read the agents; the oracle's pods name a progress
    # counter only where the signal is not time-sliced, and pods without one are never
    # judged by pair figures (docs/interference.md, "Pods without progress")
    assert sliced["prior"] == shares["prior"]


def test_offline_pairings_are_valued_on_the_measured_matrix() -> None:
    out = bench.offline(2)
    assert out["jobs"] == 12
    shares = [out["best_curve_of_matrix"], out["random"]["of_matrix"],
              out["retest_alone_of_matrix"],
              *(v["of_matrix"] for name in ("learner", "learner_with_retest")
                for v in out[name].values())]  # fmt: skip
    assert all(0.8 < s <= 1.0 for s in shares)  # nothing pairs better than the matrix itself
    assert out["learner"].keys() == {"k=1", "k=2", "k=3"}
