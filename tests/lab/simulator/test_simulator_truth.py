"""Ground truth apart from belief in ``tandem simulate``: parsing, reproduction, learning."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from extender.config.loader import load_config
from lab.simulator.agents import MAX_REPORTS_PER_INTERVAL, REPORT_PERIOD_S, report_times
from lab.simulator.belief import SimWorld
from lab.simulator.cluster import RTX_2080, builtin_cluster, uniform_cluster
from lab.simulator.engine import JobRun
from lab.simulator.interference import PAPER_COEFFICIENTS, SlowdownModel
from lab.simulator.jobs import SimJob
from lab.simulator.policies import tandem_cost
from lab.simulator.runner import simulate
from lab.simulator.truth import (
    Truth,
    TruthError,
    factor_truth,
    load_truth,
    parse_truth,
    truth_document,
)
from lab.simulator.workloads import generate, with_models
from predictor.curves import InterferenceCurve
from tandem.cli import app

runner = CliRunner()
RTX = "NVIDIA-GeForce-RTX-2080"
# `tandem simulate --workload w-small --json` before the truth existed (makespan, JCT, wait).
W_SMALL_RECORDED = {
    "fifo": (13498.367, 4350.0, 3050.653), "obp": (13033.182, 3106.085, 804.475),
    "pab": (14665.452, 3849.79, 1811.023), "horus": (14993.173, 3086.666, 774.738),
    "horus-f": (14993.173, 3066.708, 783.471), "tandem": (12403.499, 2723.888, 938.816)}


def test_every_problem_of_a_truth_file_is_reported_with_its_path() -> None:
    raw = {"extra": 1,
           "noise": {"util_stddev_percent": -1, "seed": "x", "colour": 2},
           "models": {"a": {"util_percent": 150}, "b": {"util_percent": 40, "util_factor": 2},
                      "c": {"util_factor": 0}, "d": {"mem_mib": {RTX: "big"}, "size": 1},
                      "e": 7},
           "curves": {RTX: {"slope": "steep", "bend": 1}}}
    with pytest.raises(TruthError) as err:
        parse_truth(raw, "t.yaml")
    problems = "\n".join(err.value.problems)
    for path in ("t.yaml.extra: unknown key", "t.yaml.noise.util_stddev_percent:",
                 "t.yaml.noise.seed:", "t.yaml.noise.colour: unknown key",
                 "t.yaml.models.a.util_percent:", "t.yaml.models.b: give util_percent or",
                 "t.yaml.models.c.util_factor:", f"t.yaml.models.d.mem_mib.{RTX}:",
                 "t.yaml.models.d.size: unknown key", "t.yaml.models.e: must be a mapping",
                 f"t.yaml.curves.{RTX}.slope:", f"t.yaml.curves.{RTX}.bend: unknown key"):
        assert path in problems, path
    assert len(err.value.problems) == 12


def test_truth_file_errors_reach_the_command_line(tmp_path: Path) -> None:
    bad = tmp_path / "truth.yaml"
    bad.write_text("models: {m: {util_percent: 101}}\n")
    result = runner.invoke(app, ["simulate", "--workload", "w-small", "--truth", str(bad)])
    assert result.exit_code == 2
    assert f"--truth: {bad}.models.m.util_percent: must be within [0, 100]" in result.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [\n")
    with pytest.raises(TruthError, match="not valid YAML"):
        load_truth(broken)
    twice = tmp_path / "twice.yaml"  # a key written twice would silently keep the last
    twice.write_text("models:\n  m: {util_percent: 40}\n  m: {util_percent: 90}\n")
    with pytest.raises(TruthError, match="not valid YAML.*m"):
        load_truth(twice)
    result = runner.invoke(app, ["simulate", "--workload", "w-small", "--knowledge", "oracle"])
    assert result.exit_code == 2 and "--knowledge needs --truth" in result.output


def test_truth_document_round_trips() -> None:
    truth = parse_truth({"noise": {"util_stddev_percent": 1.5, "seed": 4},
                         "models": {"a": {"util_percent": {RTX: 30.0}, "mem_mib": 900},
                                    "b": {"util_factor": 1.25}},
                         "curves": {RTX: {"slope": 0.2, "over_slope": 0.4}}})
    again = parse_truth(yaml.safe_load(yaml.safe_dump(truth_document(truth))))
    assert again == truth


def test_truth_numbers_override_the_trace_per_model_and_type() -> None:
    truth = parse_truth({"models": {"a": {"util_percent": {RTX: 30.0}, "mem_mib": 900},
                                    "b": {"util_factor": 1.5}}})
    a = SimJob("1", 0.0, 60.0, util_percent=50.0, mem_mib=100.0, model="a")
    b = SimJob("2", 0.0, 60.0, util_percent=80.0, model="b")
    plain = SimJob("3", 0.0, 60.0, util_percent=70.0, mem_mib=5.0)
    assert truth.util_of(a, RTX) == 30.0 and truth.util_of(a, "other") == 50.0
    assert truth.mem_of(a, "other") == 900.0
    assert truth.util_of(b, RTX) == 100.0  # 80 x 1.5, capped
    assert (truth.util_of(plain, RTX), truth.mem_of(plain, RTX)) == (70.0, 5.0)


def test_a_truth_curve_in_config_form_matches_the_paper_model_it_converts() -> None:
    a, b, c, cap = PAPER_COEFFICIENTS[RTX]
    curve = InterferenceCurve(slope=a + b + c - 1, over_slope=2 * a + b, over_quadratic=a)
    types = [RTX]
    paper = SlowdownModel.for_types("curve", types)
    truth = Truth(curves={RTX: curve}).slowdown_model("curve", types)
    util = np.array([10.0, 60.0, 100.0, 130.0, 150.0])
    jobs = np.array([2, 2, 2, 2, 1])
    ids = np.zeros(5, dtype=np.int64)
    want = paper.slowdown(util, jobs, ids)
    assert np.all(want < cap)  # below the paper's cap the two forms must agree
    np.testing.assert_allclose(truth.slowdown(util, jobs, ids), want, rtol=1e-12)
    assert truth.slowdown(util, jobs, ids)[-1] == 1.0  # alone: no interference


def test_without_truth_w_small_reproduces_the_recorded_figures() -> None:
    result = runner.invoke(app, ["simulate", "--workload", "w-small", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)["policies"]
    got = {n: (p["makespan_s"], p["avg_jct_s"], p["avg_wait_s"]) for n, p in body.items()}
    assert got == W_SMALL_RECORDED


def test_an_empty_truth_changes_nothing(tmp_path: Path) -> None:
    """The default truth is the trace: a truth naming no model leaves every figure alone.

    Without noise the online estimates equal the priors too, so even learning changes
    no decision."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("noise: {seed: 3, util_stddev_percent: 0}\n")
    args = ["simulate", "--workload", "w-small", "--models", "10", "--json"]
    plain = json.loads(runner.invoke(app, args).output)["policies"]
    for mode in ("online", "prior", "oracle"):
        out = runner.invoke(app, [*args, "--truth", str(empty), "--knowledge", mode])
        assert out.exit_code == 0, out.output
        body = json.loads(out.output)
        assert body["policies"] == plain, mode
        assert body["truth"]["learning"]["tandem"]["samples"] > 0


def _mean_error(world: SimWorld, jobs: list[SimJob]) -> float:
    reps = {j.model: j for j in jobs}
    errors = []
    for job in reps.values():
        found = world.knowledge.demand(JobRun(0, job)).for_type(RTX)
        assert found is not None
        errors.append(abs(found.util_percent - world.truth.util_of(job, RTX)))
    return float(np.mean(errors))


def test_online_learning_reduces_the_error_on_a_small_workload() -> None:
    jobs = with_models(generate("w-small", 1), 5)
    truth = factor_truth([j.model for j in jobs], 0.5, 1.5, seed=3)
    cfg = load_config(None, environ={}).learning
    nodes = builtin_cluster("testbed")
    online = SimWorld.build(truth, "online", cfg, [RTX])
    before = _mean_error(online, jobs)
    simulate(jobs, nodes, "tandem", world=online)
    after = _mean_error(online, jobs)
    assert before > 10.0  # the priors are far from this truth
    assert after < 3.0 and after < before / 4
    sources = {online.knowledge.demand(JobRun(0, j)).for_type(RTX).source  # type: ignore[union-attr]
               for j in jobs}
    assert any(s.startswith("observed:") for s in sources)
    prior = SimWorld.build(truth, "prior", cfg, [RTX])
    simulate(jobs, nodes, "tandem", world=prior)
    assert _mean_error(prior, jobs) == pytest.approx(before)  # the prior never learns


def test_agents_attribute_samples_alone_and_colocated() -> None:
    """Two jobs on one GPU report their truth over the GPU's slowdown; alone, the truth."""
    truth = parse_truth({"noise": {"util_stddev_percent": 0},
                         "models": {"a": {"util_percent": 70}, "b": {"util_percent": 50}}})
    jobs = [SimJob("a", 0.0, 100.0, util_percent=10, mem_mib=100, model="a"),
            SimJob("b", 0.0, 300.0, util_percent=10, mem_mib=100, model="b")]
    nodes = uniform_cluster(1, 1, *RTX_2080)
    world = SimWorld.build(truth, "prior", load_config(None, environ={}).learning, [RTX])
    simulate(jobs, nodes, "obp", world=world)
    view = world.agents.learner.store.view()
    alone = {e["model"]: e["util_percent"] for e in view["alone"]}
    colocated = {e["model"]: e["util_percent"] for e in view["colocated"]}
    # one GPU: both share it until a ends; each job's progress (and utilisation) drops by
    # the GPU's slowdown at 120% with two jobs (the engine's paper interference)
    slowdown = float(SlowdownModel.for_types("curve", [RTX]).slowdown(
        np.array([120.0]), np.array([2]), np.array([0]))[0])
    assert slowdown > 1.2
    assert colocated == pytest.approx({"a": 70 / slowdown, "b": 50 / slowdown}, abs=1e-3)
    assert alone == pytest.approx({"b": 50.0})  # then b runs alone
    # as many reports per interval as an agent pushes in it (one a period, capped), spread
    # over it: a's 100 s of work take 100 x slowdown shared, then b's last 200 s run alone;
    # each pod's reports in its first learning.warmup_seconds (60 s) give no sample
    shared_end = 100.0 * slowdown
    assert report_times(0.0, shared_end) == pytest.approx(
        [shared_end / 3 * k for k in (1, 2, 3)])  # ceil(167.6 / 60) = 3 reports
    first = shared_end / 3
    counted = [t for t in report_times(0.0, shared_end) if t - first >= 60.0]
    alone_reports = min(MAX_REPORTS_PER_INTERVAL, math.ceil(200.0 / REPORT_PERIOD_S))
    assert world.agents.samples == 2 * len(counted) + alone_reports


def test_online_knowledge_refits_the_curve_from_simulated_colocation() -> None:
    """--knowledge online: co-located reports refit the GPU type's curve toward the truth's."""
    base = tandem_cost()
    prior = base.curve_for(RTX)
    flat = InterferenceCurve(prior.slope / 2, prior.over_slope / 2, prior.over_quadratic / 2)
    jobs = with_models(generate("w-small", 1), 5)
    truth = replace(factor_truth([j.model for j in jobs], 0.5, 0.5, seed=3), curves={RTX: flat})
    cfg = replace(load_config(None, environ={}).learning, curve_min_points=5,
                  curve_refit_interval_seconds=0.0, min_observations=1)
    world = SimWorld.build(truth, "online", cfg, [RTX])
    simulate(jobs, builtin_cluster("testbed"), "tandem", world=world)
    (row,) = world.agents.learner.curves.view()
    assert row["gpu_type"] == RTX and row["refits"] >= 1 and row["points"] >= 5
    assert row["r2"] is not None
    # the policy decides with the learned curve (the extender's overlay), not the prior
    learned = world.knowledge.policy(base).curve_for(RTX)
    assert learned != prior
    assert learned.to_config() == pytest.approx(row["curve"])
    # prior and oracle knowledge never learn curves: prior keeps the configured, oracle the truth
    assert SimWorld.build(truth, "prior", cfg, [RTX]).knowledge.policy(base) is base
    oracle = SimWorld.build(truth, "oracle", cfg, [RTX]).knowledge.policy(base)
    assert oracle.curve_for(RTX) == flat


def test_phases_are_what_a_1_hz_agent_averages_over_a_window() -> None:
    from lab.simulator.agents import phase_factor
    from lab.simulator.truth import Phases, parse_truth, truth_document

    p = Phases(warmup_seconds=60, warmup_util_factor=0.05, eval_every_seconds=600,
               eval_seconds=30, eval_util_factor=0.2)
    assert phase_factor(p, 0, 60) == pytest.approx(0.05)  # all warm-up
    assert phase_factor(p, 0, 120) == pytest.approx((60 * 0.05 + 60) / 120)
    assert phase_factor(p, 630, 660) == pytest.approx(0.2)  # the first evaluation phase
    assert phase_factor(p, 60, 660) == pytest.approx((570 + 30 * 0.2) / 600)
    assert phase_factor(Phases(), 0, 1000) == 1.0
    truth = parse_truth({"phases": {"warmup_seconds": 60, "warmup_util_factor": 0.05}})
    assert truth.phases == Phases(warmup_seconds=60, warmup_util_factor=0.05)
    assert parse_truth(truth_document(truth)) == truth
    with pytest.raises(TruthError) as err:
        parse_truth({"phases": {"warmup_util_factor": 2, "bogus": 1}})
    assert len(err.value.problems) == 2
