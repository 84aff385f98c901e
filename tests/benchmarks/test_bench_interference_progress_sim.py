"""benchmarks/interference_progress_sim.py: one small seed of each signal runs every mode
and says what the progress learner had by the end."""

from __future__ import annotations

import json

import pytest
from bench_modules import load

load("_common")
bench = load("interference_progress_sim")

pytestmark = pytest.mark.skipif(not bench._gavel.DATA.exists(),
                                reason="shared Gavel data not present")


def test_a_seed_runs_every_mode_and_reports_what_was_learned() -> None:
    raw = json.loads(bench._gavel.DATA.read_text())
    progress = bench._seed_runs(raw, 8, bench.LEARNERS, ("p100", "w-small", "progress", 1))
    assert set(progress) == set(bench.MODES["progress"])
    for mode in bench.LEARNERS:
        assert set(bench.LEARNED) <= set(progress[mode])
    assert progress["pair-aware"]["reverts"] == 0  # only the revert mode moves pods
    sliced = bench._seed_runs(raw, 8, bench.LEARNERS, ("p100", "w-small", "time-sliced", 1))
    assert sliced["pair-aware"]["progress_samples"] == 0
    # the signal changes what pair-aware learns from, never curve-only
    assert sliced["curve-only"]["avg_jct_s"] == progress["curve-only"]["avg_jct_s"]


def test_signals_and_seeds_are_chosen() -> None:
    raw = json.loads(bench._gavel.DATA.read_text())
    out = bench.run(raw, 1, 1, jobs=4, first_seed=101, signals=("time-sliced",))
    assert sorted(out) == sorted(f"{g}/{w}/time-sliced" for g in bench.GPUS
                                 for w in bench.WORKLOADS)
    other = bench._seed_runs(raw, 4, bench.LEARNERS, ("p100", "w-small", "time-sliced", 101))
    assert out["p100/w-small/time-sliced"]["per_seed"]["curve-only"]["avg_jct_s"] == \
        [other["curve-only"]["avg_jct_s"]]


def test_the_learner_modes_are_chosen_and_each_task_reports_as_it_ends(
        capsys: pytest.CaptureFixture[str]) -> None:
    raw = json.loads(bench._gavel.DATA.read_text())
    out = bench._seed_runs(raw, 4, ("pair-aware+revert",), ("p100", "w-small", "progress", 101))
    assert set(out) == {"curve-only", "pair-aware+revert", "pair-oracle"}
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["task"] == ["p100", "w-small", "progress", 101] and line["modes"] == out
    assert line["cpu_s"] >= 0


def test_an_earlier_runs_learner_mode_is_kept_only_where_curve_only_reproduces() -> None:
    raw = json.loads(bench._gavel.DATA.read_text())
    before = bench.run(raw, 1, 1, jobs=4, first_seed=101, signals=("progress",),
                       learners=("pair-aware",))
    now = bench.run(raw, 1, 1, jobs=4, first_seed=101, signals=("progress",),
                    learners=(bench.REVERT,), kept=before)
    entry = now["p100/w-small/progress"]
    assert entry["per_seed"]["pair-aware"] == before["p100/w-small/progress"]["per_seed"][
        "pair-aware"]
    assert set(entry["capture_of_oracle_gain_avg_jct"]) == {"pair-aware", bench.REVERT}
    assert "pair_aware_minus_revert_paired" in entry
    with pytest.raises(SystemExit, match="curve-only differs"):  # other seeds
        bench.run(raw, 1, 1, jobs=4, first_seed=102, signals=("progress",),
                  learners=(bench.REVERT,), kept=before)


def test_the_costliest_tasks_start_first() -> None:
    tasks = [(g, w, s, seed) for g in bench.GPUS for w in bench.WORKLOADS
             for s in ("progress", "time-sliced") for seed in (1, 2)]
    order = bench._longest_first(tasks)
    assert sorted(order) == list(range(len(tasks)))
    ran = [tasks[i] for i in order]
    assert ran[:2] == [("k80", "w-large", "progress", 1), ("k80", "w-large", "progress", 2)]
    assert {t[2] for t in ran[:8]} == {"progress"} and ran[-1][:3] == ("p100", "w-small",
                                                                        "time-sliced")


def test_the_matrix_mode_is_the_product_configured_with_the_other_gpus_matrix() -> None:
    raw = json.loads(bench._gavel.DATA.read_text())
    here = bench._gavel.setting(raw, "w-small", "p100", "progress", 101)
    world = bench._world(here.truth, bench.MATRIX, here.gpu_type, here.other)
    cfg = world.knowledge.cfg
    assert cfg.pairs and dict(cfg.pair_prior_tables) == here.other  # learning.pair_prior
    assert here.gpu_type not in here.other  # never the truth's own matrix
    assert type(world.knowledge) is bench.SimKnowledge  # a product mode, not a diagnostic


def test_the_hindsight_diagnostic_reads_the_truth_of_measured_pairs_only() -> None:
    raw = json.loads(bench._gavel.DATA.read_text())
    here = bench._gavel.setting(raw, "w-small", "p100", "progress", 101)
    table = here.truth.interference[here.gpu_type]
    a, b, c = table.models()[:3]
    measured = [(a, b), (b, a), (a, c)]
    tp = bench._measured_truth(table, measured)
    assert set(tp.progress) == set(measured)
    truth = [bench.math.log(max(table.slowdown[x][y], 1.0)) for x, y in measured]
    assert [tp.progress[p][0] for p in measured] == truth
    assert tp.unseen == pytest.approx(sum(truth) / 3)  # a pair never measured: their mean
    assert bench._measured_truth(table, measured[:2]).unseen is None  # too few: the curve's


def test_the_campaign_modes_are_the_product_given_its_own_types_campaign() -> None:
    raw = json.loads(bench._gavel.DATA.read_text())
    here = bench._gavel.setting(raw, "w-small", "k80", "progress", 101)
    table = here.truth.interference[here.gpu_type]
    world = bench._world(here.truth, "pair-aware+campaign-k3", here.gpu_type, here.other,
                         here.jobs)
    cfg = world.knowledge.cfg
    assert cfg.pairs and set(cfg.pair_prior_tables) == {here.gpu_type}  # its own type only
    prior = cfg.pair_prior_tables[here.gpu_type]
    measured = sum(len(row) for row in prior.slowdown.values()) + 2 * len(prior.cannot_share)
    assert measured == 2 * 39  # 26 models x 3 partners / 2 pairs, both ways
    assert prior.slowdown != {a: {b: table.slowdown[a][b] for b in row}
                              for a, row in prior.slowdown.items()}  # measured with noise
    assert type(world.knowledge) is bench.SimKnowledge  # a product mode, not a diagnostic
    both = bench._world(here.truth, "pair-aware+matrix+campaign-k2", here.gpu_type,
                        here.other, here.jobs).knowledge.cfg.pair_prior_tables
    assert set(both) == {here.gpu_type, *here.other}
    assert sum(len(r) for r in both[here.gpu_type].slowdown.values()) \
        + 2 * len(both[here.gpu_type].cannot_share) == 2 * 26
    cost = bench._campaign_cost(raw, "pair-aware+campaign-k3")
    assert cost["p100"]["pairs"] == 39 and cost["p100"]["runs"] == 26 + 39


def test_the_capture_has_a_paired_bootstrap_interval_and_learners_are_compared() -> None:
    curve = [1000.0, 1200.0, 900.0, 1100.0, 1050.0]
    oracle = [c - g for c, g in zip(curve, [100.0, 300.0, 50.0, 200.0, 150.0], strict=True)]
    half = [(c + o) / 2 for c, o in zip(curve, oracle, strict=True)]
    noisy = [h + d for h, d in zip(half, [40.0, -60.0, 10.0, 30.0, -20.0], strict=True)]
    runs = {"curve-only": {"avg_jct_s": curve}, "pair-oracle": {"avg_jct_s": oracle},
            "pair-aware": {"avg_jct_s": half}, "pair-aware+campaign-k3": {"avg_jct_s": noisy}}
    exact = bench.capture_interval(runs, "pair-aware")
    assert exact == {"capture": 0.5, "ci95_low": 0.5, "ci95_high": 0.5}
    spread = bench.capture_interval(runs, "pair-aware+campaign-k3")
    assert spread["ci95_low"] < spread["capture"] < spread["ci95_high"]
    results = {"p100/w-small/progress": {"per_seed": runs}}
    bench.summarise(results)
    entry = results["p100/w-small/progress"]
    assert set(entry["capture_interval"]) == {"pair-aware", "pair-aware+campaign-k3"}
    diff = entry["learner_differences_paired"]["pair-aware_minus_pair-aware+campaign-k3"]
    assert diff["mean"] == pytest.approx(-0.0) and diff["n"] == 5


def test_capture_is_none_where_the_oracle_gains_nothing() -> None:
    # A short run can leave the oracle exactly as curve-only: no capture to divide out.
    runs = {"curve-only": {"avg_jct_s": [100.0, 120.0]},
            "pair-oracle": {"avg_jct_s": [100.0, 120.0]},
            "pair-aware": {"avg_jct_s": [90.0, 125.0]}}
    assert bench.capture_interval(runs, "pair-aware") == {
        "capture": None, "ci95_low": None, "ci95_high": None}
    runs["pair-oracle"]["avg_jct_s"] = [80.0, 120.0]  # one seed gains: resamples without it
    out = bench.capture_interval(runs, "pair-aware")  # are left out, no division by zero
    assert out["capture"] == 0.25 and out["ci95_low"] <= out["ci95_high"]
