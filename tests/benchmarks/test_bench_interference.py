"""benchmarks/interference.py on Gavel's P100 data: the measured matrix pairs as published,
and the pair learner, after three random pairings per job, pairs better than chance."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_modules import load

from extender.core import CostPolicy

load("_common")  # the benchmark's own first import, found beside it when run as a script
bench = load("interference")

pytestmark = pytest.mark.skipif(not bench.DATA.exists(), reason="shared Gavel data not present")


def test_matrix_pairing_matches_the_published_figure_and_the_learner_beats_chance() -> None:
    raw = json.loads(bench.DATA.read_text())
    jobs, truth = bench.matrix(raw, "p100")
    assert len(jobs) == 26
    assert bench.pairing_value(truth, truth) == pytest.approx(1.299, abs=0.001)
    learned = [bench.pairing_value(bench.learner_predictions(
        jobs, truth, bench.seen_pairings(26, 3, np.random.default_rng(s))), truth)
        for s in range(3)]
    rng = np.random.default_rng(0)
    chance = [bench.pairing_value(rng.random(truth.shape) + 1, truth) for _ in range(3)]
    assert np.mean(learned) > np.mean(chance) + 0.02


def test_seen_pairs_carry_the_learner_and_the_pair_oracle_knows_every_pair() -> None:
    raw = json.loads(bench.DATA.read_text())
    jobs, truth = bench.matrix(raw, "p100")
    # The per-model profile fitted to every measured pair pairs worse than the learner that
    # has seen each job in three pairings: the pairs seen, not the profile, carry it.
    profile = bench.pairing_value(bench.profile_on_every_pair(jobs, truth), truth)
    learned = [bench.pairing_value(bench.learner_predictions(
        jobs, truth, bench.seen_pairings(26, 3, np.random.default_rng(s))), truth)
        for s in range(3)]
    assert profile < np.mean(learned) - 0.02
    gpu_type, table = bench.import_gavel(raw, "p100")
    k80_type, k80 = bench.import_gavel(raw, "k80")
    truth_file = bench.Truth(interference={gpu_type: table})
    worlds = {mode: bench._world(truth_file, mode, [gpu_type], {k80_type: k80})
              for mode in ("curve-only", "pair-oracle", "pair-aware+matrix")}
    online = worlds["curve-only"].knowledge.policy(CostPolicy())
    known = worlds["pair-oracle"].knowledge.policy(CostPolicy())
    assert online.pairs is None and known.pairs is not None
    # the other GPU's matrix decides on this one before any pair is seen
    prior = worlds["pair-aware+matrix"].knowledge.policy(CostPolicy()).pairs
    assert prior is not None
    k80_figure = k80.listed("LM-bs5", "ResNet-50-bs64")
    assert prior.figure(gpu_type, "LM-bs5", "ResNet-50-bs64", 1.0) == (
        pytest.approx(k80_figure), "matrix")
    lm, source = known.pairs.figure(gpu_type, "LM-bs5", "ResNet-50-bs64", 1.0)
    assert lm == pytest.approx(3.56, abs=0.01) and source.startswith("pair:")


def test_the_wrong_matrix_keeps_every_figure_under_other_names() -> None:
    raw = json.loads(bench.DATA.read_text())
    k80_type, k80 = bench.import_gavel(raw, "k80")
    wrong = bench.shuffled_names({k80_type: k80}, bench.WRONG_SEED)[k80_type]
    assert wrong.models() == k80.models()
    figures = sorted(v for row in k80.slowdown.values() for v in row.values())
    assert sorted(v for row in wrong.slowdown.values() for v in row.values()) == figures
    assert len(wrong.cannot_share) == len(k80.cannot_share)
    moved = sum(wrong.listed(a, b) != k80.listed(a, b)
                for a, row in k80.slowdown.items() for b in row)
    assert moved > 0.9 * len(figures)


def test_the_other_gpus_matrix_pairs_better_than_the_pairs_seen_alone() -> None:
    """After one pairing per job, the K80's matrix as the prior pairs the P100's jobs better."""
    raw = json.loads(bench.DATA.read_text())
    jobs, truth = bench.matrix(raw, "p100")
    k80_type, k80 = bench.import_gavel(raw, "k80")
    plain, prior = [], []
    for s in range(3):
        seen = bench.seen_pairings(26, 1, np.random.default_rng(s))
        plain.append(bench.pairing_value(bench.learner_predictions(jobs, truth, seen), truth))
        prior.append(bench.pairing_value(bench.learner_predictions(
            jobs, truth, seen, {k80_type: k80}), truth))
    assert np.mean(prior) > np.mean(plain) + 0.02


def test_two_only_modes_learn_only_from_gpus_shared_by_two() -> None:
    raw = json.loads(bench.DATA.read_text())
    gpu_type, table = bench.import_gavel(raw, "p100")
    k80_type, k80 = bench.import_gavel(raw, "k80")
    truth_file = bench.Truth(interference={gpu_type: table})
    for mode, groups in (("pair-aware", True), ("pair-aware:two-only", False),
                         ("pair-aware+matrix:two-only", False)):
        world = bench._world(truth_file, mode, [gpu_type], {k80_type: k80})
        learner = world.knowledge.learner
        assert learner.pairs.groups is groups and learner.cfg.pairs
        assert bool(learner.cfg.pair_prior_tables) is ("matrix" in mode)


def test_a_warm_mode_starts_from_what_an_earlier_workload_left_and_after_it() -> None:
    raw = json.loads(bench.DATA.read_text())
    gpu_type, table = bench.import_gavel(raw, "p100")
    truth = bench.Truth(interference={gpu_type: table}, seed=3)
    nodes = bench.uniform_cluster(1, 4, gpu_type, bench.MEMORY_MIB["p100"], prefix="n")
    history = bench.with_named_models(bench.generate("w-large", 3), table.models(), 3)[:16]
    world, start = bench._warm_world(truth, "pair-aware", [gpu_type], {}, history, nodes)
    pairs = world.knowledge.learner.pairs
    assert pairs.stats()["pairs"] > 0  # loaded from the earlier run's document
    assert pairs.samples_total == 0  # and nothing learned in this world yet
    assert start > max(j.arrival_s for j in history)
    cold = bench._world(truth, "pair-aware", [gpu_type], {})
    assert cold.knowledge.learner.pairs.model() is None


def _at_most_once(pairs: list[tuple[int, int]], n: int) -> bool:
    placed = [x for pair in pairs for x in pair]
    return len(set(placed)) == len(placed) and set(placed) <= set(range(n))


def test_a_learner_choosing_its_pairings_explores_within_the_bonus() -> None:
    """Each chosen pairing places every job once; the first, with a matrix, is the matrix's
    own best (every pair untried: the bonus lifts all alike), without one it is random; a
    later one gives up at most the bonus per GPU of predicted throughput to try new pairs."""
    raw = json.loads(bench.DATA.read_text())
    jobs, truth = bench.matrix(raw, "k80")
    p100_type, p100 = bench.import_gavel(raw, "p100")
    prior = {p100_type: p100}
    n, half = len(jobs), len(jobs) // 2
    (first, second), ran = bench.chosen_pairings(jobs, truth, 2, np.random.default_rng(0),
                                                 prior)
    # one pair of the K80's cannot share: at most 12 GPUs take two, every job at most once
    assert _at_most_once(first, n) and _at_most_once(second, n)
    assert len(first) == len(second) == half - 1
    figures, untried = bench.learner_figures(jobs, truth, [], prior)
    assert untried[~np.eye(n, dtype=bool)].all()
    weight = 1 / figures + 1 / figures.T
    assert set(first) == set(bench.best_pairs(weight, truth))
    assert ran == pytest.approx([bench.measured_value(first, truth),
                                 bench.measured_value(second, truth)])
    figures, untried = bench.learner_figures(jobs, truth, first, prior)
    weight = 1 / figures + 1 / figures.T
    greedy = sum(weight[i, j] for i, j in bench.best_pairs(weight, truth))
    explored = sum(weight[i, j] for i, j in second)
    assert explored >= greedy - bench.EXPLORE_BONUS * half - 1e-9
    assert any(untried[i, j] for i, j in second)  # it did try new pairs
    (cold,), _ = bench.chosen_pairings(jobs, truth, 1, np.random.default_rng(4))
    assert cold == bench.best_pairs(np.random.default_rng(4).random((n, n)), truth)
    assert all(np.isfinite(truth[i, j]) for i, j in cold)


def test_the_best_line_keeps_the_pairs_seen_and_orders_the_rest_as_the_matrix() -> None:
    raw = json.loads(bench.DATA.read_text())
    jobs, truth = bench.matrix(raw, "p100")
    _, other = bench.matrix(raw, "k80")
    seen = bench.seen_pairings(len(jobs), 1, np.random.default_rng(2))
    line = bench.best_line_with_seen(truth, other, seen)
    for i, j in seen:
        assert (line[i, j], line[j, i]) == (truth[i, j], truth[j, i])
    unseen = np.ones(truth.shape, dtype=bool)
    for i, j in seen:
        unseen[i, j] = unseen[j, i] = False
    unseen &= np.isfinite(other) & ~np.eye(len(jobs), dtype=bool)
    order = np.argsort(other[unseen])
    assert np.all(np.diff(line[unseen][order]) >= -1e-12)  # a line with a positive slope


def test_the_goals_say_whether_even_the_oracle_leads_curve_only() -> None:
    """A lead no learner can show: the oracle's own, paired per seed against curve-only."""
    runs = {"curve-only": {"avg_jct_s": [100.0, 104.0, 102.0], "makespan_s": [100, 200, 150]},
            "pair-aware": {"avg_jct_s": [95.0, 99.0, 97.0], "makespan_s": [130, 190, 150]},
            "oracle": {"avg_jct_s": [90.0, 93.0, 91.0], "makespan_s": [120, 170, 160]},
            "pair-oracle": {"avg_jct_s": [92.0, 95.0, 93.0], "makespan_s": [110, 180, 150]}}
    goals = bench._goals(runs, "pair-aware", "curve-only")
    jct, makespan = goals["avg_jct_s"], goals["makespan_s"]
    assert jct["oracle_ahead_of_curve_beyond_interval"] and jct["ahead_of_curve_beyond_interval"]
    assert jct["curve_minus_oracle_paired"]["mean"] == pytest.approx(32 / 3, abs=1e-3)
    assert not makespan["oracle_ahead_of_curve_beyond_interval"]
    assert not makespan["ahead_of_curve_beyond_interval"]


def test_pairings_for_goal_names_the_fewest_that_reach_it() -> None:
    raw = json.loads(bench.DATA.read_text())
    jobs, truth = bench.matrix(raw, "k80")
    p100_type, p100 = bench.import_gavel(raw, "p100")
    best = bench.pairing_value(truth, truth)
    found = bench.pairings_for_goal(jobs, truth, 2, best, {p100_type: p100})
    shares = {int(k.removeprefix("k=")): v for k, v in found["of_matrix"].items()}
    assert sorted(shares) == list(bench.MORE_KS) and all(0.9 < v <= 1.0 for v in shares.values())
    reaching = [k for k, v in shares.items() if v >= bench.GOAL_OF_MATRIX]
    assert found["first_k_reaching_goal"] == (min(reaching) if reaching else None)
