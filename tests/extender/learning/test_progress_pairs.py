"""Progress samples, low-rank completion across GPU types, the share threshold and the
refusal of pairs measured to lose (extender.learning.progress_pairs, .completion)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from extender.learning.completion import DEFAULT_VAR, complete, fit
from extender.learning.progress_pairs import DEFAULT_NOISE_VAR, ProgressPairs

JOBS = [f"j{i}" for i in range(12)]


def _additive(seed: int) -> dict[tuple[str, str], float]:
    """A matrix of log slowdowns: sensitivity of a plus aggressiveness of b, plus a little."""
    rng = np.random.default_rng(seed)
    sens, aggr = rng.uniform(0.1, 0.8, len(JOBS)), rng.uniform(0.0, 0.6, len(JOBS))
    return {(a, b): float(sens[i] + aggr[j] + rng.normal(0, 0.03))
            for i, a in enumerate(JOBS) for j, b in enumerate(JOBS) if a != b}


def test_completion_predicts_unseen_pairs_from_a_few_seen_ones() -> None:
    truth = _additive(1)
    rng = np.random.default_rng(2)
    keys = sorted(truth)
    seen = [keys[i] for i in rng.choice(len(keys), 40, replace=False)]
    logs = fit([("t", a, b, truth[(a, b)], 1.0) for a, b in seen], JOBS, ["t"])
    unseen = [k for k in keys if k not in seen]
    errors = np.array([logs[("t", *k)] - truth[k] for k in unseen])
    spread = np.std([truth[k] for k in unseen])
    assert math.sqrt(float(np.mean(errors ** 2))) < 0.6 * spread


def test_another_gpu_types_matrix_informs_a_type_seen_little() -> None:
    here, there = _additive(3), {k: v + 0.2 for k, v in _additive(3).items()}
    seen = [k for k in sorted(here)][:6]
    entries = [("here", a, b, here[(a, b)], 1.0) for a, b in seen]
    alone = fit(entries, JOBS, ["here"])
    both = fit(entries + [("there", a, b, v, 2.0) for (a, b), v in there.items()], JOBS,
               ["here", "there"])
    unseen = [k for k in sorted(here) if k not in seen]

    def corr(logs: dict[tuple[str, str, str], float]) -> float:
        return float(np.corrcoef([logs[("here", *k)] for k in unseen],
                                 [here[k] for k in unseen])[0, 1])

    assert corr(both) > 0.8 > corr(alone)


def test_features_give_a_job_never_seen_the_figure_of_jobs_like_it() -> None:
    heavy = {j: [1.0] if i % 2 else [0.0] for i, j in enumerate(JOBS)}
    truth = {(a, b): (1.0 if heavy[b][0] else 0.2) for a in JOBS for b in JOBS if a != b}
    new = JOBS[-1]  # heavy, never seen
    entries = [("t", a, b, v, 1.0) for (a, b), v in truth.items() if new not in (a, b)]
    logs = fit(entries, JOBS, ["t"], features=heavy)
    assert logs[("t", JOBS[0], new)] > logs[("t", JOBS[0], JOBS[2])] + 0.3


def test_the_out_of_sample_variance_is_measured_and_floored() -> None:
    truth = _additive(4)
    entries = [("t", a, b, v, 1.0) for (a, b), v in sorted(truth.items())[:60]]
    done = complete(entries, JOBS, ["t", "u"], noise_var=0.0, learned=["t"])
    assert done.variance["u"] == DEFAULT_VAR  # nothing seen there: the default
    assert 0.0025 <= done.variance["t"] < DEFAULT_VAR


def test_noise_is_estimated_from_pairs_seen_twice() -> None:
    pairs = ProgressPairs()
    assert pairs.noise_var() == DEFAULT_NOISE_VAR  # nothing to pool yet
    rng = np.random.default_rng(5)
    for a, b in zip(JOBS, JOBS[1:], strict=False):
        for _ in range(4):
            pairs.add("t", a, b, 0.5 + rng.normal(0.0, 0.2))
    assert 0.02 < pairs.noise_var() < 0.07  # sd 0.2: variance 0.04


def test_a_few_lucky_repeats_cannot_make_measurements_look_precise() -> None:
    pairs = ProgressPairs()
    spread = math.sqrt(2 * 0.05 ** 2)  # six pairs seen twice: pooled variance 0.0025, sd 0.05
    for i in range(6):
        pairs.add("t", f"r{i}", f"s{i}", 0.3)
        pairs.add("t", f"r{i}", f"s{i}", 0.3 + spread)
    assert pairs.noise_var() > 0.5 * DEFAULT_NOISE_VAR  # six degrees of freedom: near the prior
    each = math.log(2 / 1.10)  # a pair measured once each way at combined 1.10
    pairs.add("t", "a", "b", each)
    pairs.add("t", "b", "a", each)
    # 1.10 is within the true noise (sd 0.066 per measurement) of a loser's 0.99: refused,
    # where the lucky 0.05 alone would have let it through
    assert ("t", frozenset(("a", "b"))) in pairs.losing()
    rng = np.random.default_rng(3)
    for i in range(100):  # many repeats: the estimate follows them
        for _ in range(3):
            pairs.add("t", f"u{i}", f"v{i}", 0.3 + rng.normal(0.0, 0.05))
    assert pairs.noise_var() < 0.5 * DEFAULT_NOISE_VAR


def test_a_seen_pair_is_its_samples_shrunk_toward_the_completion() -> None:
    pairs = ProgressPairs()
    for a in JOBS[:6]:
        for b in JOBS[:6]:
            if a != b:
                pairs.add("t", a, b, 0.3)
    pairs.add("t", JOBS[0], JOBS[7], 1.5)
    pairs.add("t", JOBS[7], JOBS[0], 0.3)
    figure = pairs.estimate().figure("t", JOBS[0], JOBS[7])
    assert figure is not None and figure.source == "progress:1"
    assert 0.3 < figure.log < 1.5
    unseen = pairs.estimate().figure("t", JOBS[1], JOBS[7])
    assert unseen is not None and unseen.source == "completed"


def test_share_only_above_one_plus_margin_with_the_uncertainty() -> None:
    pairs = ProgressPairs()
    for i in range(6):
        jitter = 0.15 * (-1) ** i  # the noise, estimated from these: sd 0.15
        pairs.add("t", "a", "b", math.log(1.25) + jitter)  # combined 1.6
        pairs.add("t", "b", "a", math.log(1.25) - jitter)
        pairs.add("t", "c", "d", math.log(1.9) + jitter)  # combined 1.05
        pairs.add("t", "d", "c", math.log(1.9) - jitter)
    est = pairs.estimate()
    assert est.shares("t", "a", "b")
    assert est.combined("t", "c", "d")[0] == pytest.approx(1.05, abs=0.08)
    assert not est.shares("t", "c", "d", margin=0.02, z=2.0)


def test_a_pair_measured_to_lose_is_refused_however_it_is_completed() -> None:
    pairs = ProgressPairs(priors={"other": {("a", "b"): 0.0, ("b", "a"): 0.0}})
    pairs.add("t", "a", "b", math.log(2.5))
    pairs.add("t", "b", "a", math.log(2.5))  # combined 0.8: worse than taking turns
    est = pairs.estimate()
    assert ("t", frozenset(("a", "b"))) in est.losing
    assert not est.shares("t", "a", "b", margin=-1.0, z=-10.0)


def test_bad_samples_are_ignored() -> None:
    pairs = ProgressPairs()
    pairs.add("t", "a", "b", math.nan)
    pairs.add("t", "a", "b", math.inf)
    assert pairs.stats == {}


def test_one_noisy_measurement_of_a_pair_must_show_it_winning_by_its_noise() -> None:
    pairs = ProgressPairs()
    for a, b, each in (("a", "b", 1.9), ("c", "d", 1.4)):  # combined 1.05 and 1.43
        pairs.add("t", a, b, math.log(each))
        pairs.add("t", b, a, math.log(each))
    losing = pairs.losing()
    assert ("t", frozenset(("a", "b"))) in losing  # within its noise of taking turns
    assert ("t", frozenset(("c", "d"))) not in losing
    assert pairs.estimate().losing == losing
    pairs.add("t", "e", "f", math.log(1.9))  # measured one way only: not judged yet
    assert ("t", frozenset(("e", "f"))) not in pairs.losing()


def test_a_type_learns_how_strongly_it_shows_another_types_pairs() -> None:
    there = _additive(4)
    mean = float(np.mean(list(there.values())))
    here = {k: 0.3 + 0.5 * (v - mean) for k, v in there.items()}  # half as spread out
    rng = np.random.default_rng(0)
    seen = [k for k in sorted(here) if rng.random() < 0.3]
    entries = [("here", a, b, here[k], 1.0) for k in seen for a, b in [k]]
    logs = fit(entries + [("there", a, b, v, 2.0) for (a, b), v in there.items()], JOBS,
               ["here", "there"])
    unseen = [k for k in sorted(here) if k not in seen]
    slope = np.polyfit([there[k] for k in unseen], [logs[("here", *k)] for k in unseen], 1)[0]
    assert 0.4 < slope < 0.6  # its scale, set by its own pairs (0.62 with the scale held)
    assert np.mean([abs(logs[("here", *k)] - here[k]) for k in unseen]) < 0.02


def test_a_type_never_seen_reads_most_of_another_types_spread() -> None:
    """With only another type's matrix, that matrix is explained by the shared part: the
    new type's figures keep nearly all of its spread (with the types' own terms as free as
    the shared ones, half of it stayed with the type it was seen on; 3 times less free,
    a quarter)."""
    there = _additive(5)
    logs = fit([("there", a, b, v, 2.0) for (a, b), v in there.items()], JOBS,
               ["here", "there"])
    keys = sorted(there)
    new = np.array([logs[("here", *k)] for k in keys])
    seen = np.array([there[k] for k in keys])
    assert np.std(new) > 0.9 * np.std(seen)  # 0.53 with the own terms as free, 0.76 at 3
    assert np.corrcoef(new, seen)[0, 1] > 0.95


def test_a_matrix_of_the_clusters_own_type_is_completed_before_any_pod_reports() -> None:
    """A profiling campaign of a few pairs on the cluster's GPU type: its other pairs read
    the completion from the start, not the curve (which reads measured pairs as far milder
    than they run, so the first placements would seek the pairs not measured)."""
    from contracts.interferencefile import PairTable
    from extender.learning.interference import PairLearner

    truth = _additive(3)
    ring = [(JOBS[i], JOBS[(i + d) % len(JOBS)]) for i in range(len(JOBS)) for d in (1, 6)]
    table = PairTable({a: {b: math.exp(truth[(a, b)]) for x, b in ring if x == a}
                       | {b: math.exp(truth[(b, a)]) for b, y in ring if y == a}
                       for a in JOBS}, frozenset())
    learner = PairLearner(1000, prior={"T": table})
    model = learner.model()
    assert model is not None
    a, b = "j0", "j3"  # never measured
    assert b not in table.slowdown[a]
    value, source = model.figure("T", a, b, curve=1.05)
    assert source == "completed" and value > 1.2  # the completion, not the curve's 1.05
    unlisted = [(x, y) for x in JOBS for y in JOBS if x != y and y not in table.slowdown[x]]
    errors = [math.log(model.figure("T", *p, 1.05)[0]) - truth[p] for p in unlisted]
    curve = [math.log(1.05) - truth[p] for p in unlisted]
    assert np.sqrt(np.mean(np.square(errors))) < 0.5 * np.sqrt(np.mean(np.square(curve)))
    # another type's matrix alone changes nothing on a type it does not list
    other = PairLearner(1000, prior={"U": table}).model()
    assert other is not None and other.figure("T", a, b, curve=1.05)[1] != "completed"
