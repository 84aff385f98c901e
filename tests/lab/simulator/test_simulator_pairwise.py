"""Measured pairwise interference in the simulator's truth: format, rules, importer, engine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from contracts.interferencefile import PairTable
from extender.core.snapshot import NodeName, Placement, PodUid
from lab.simulator.cluster import uniform_cluster
from lab.simulator.engine import Engine, JobRun, SchedulingContext
from lab.simulator.jobs import SimJob
from lab.simulator.pairwise import GavelError, gavel_model_name, import_gavel, job_slowdowns
from lab.simulator.signal import SignalModel
from lab.simulator.truth import Truth, TruthError, parse_truth, truth_document
from tandem.cli import app

P100 = "NVIDIA-Tesla-P100"
GAVEL = Path("/work/shared/data/interference/gavel-p100-k80.json")
DOC = {"interference": {P100: {
    "slowdown": {"LM-bs5": {"ResNet-50-bs64": 3.56}, "ResNet-50-bs64": {"LM-bs5": 1.25}},
    "cannot_share": [["LM-bs5", "CycleGAN"]]}}}


class FirstGpu:
    """Places every pending job on the first GPU at once (a test policy)."""

    name = "first-gpu"
    warmup_check_s = None

    def __init__(self) -> None:
        self.queue: list[JobRun] = []

    def enqueue(self, run: JobRun, now_s: float) -> None:
        self.queue.append(run)

    def pending(self) -> int:
        return len(self.queue)

    def should_evict(self, run: JobRun, slowdown: float) -> bool:
        return False

    def schedule(self, ctx: SchedulingContext) -> int:
        runs, self.queue = self.queue, []
        for run in runs:
            ctx.place(run, [Placement(PodUid(run.job.id), run.job.id, NodeName("gpu-node-1"),
                                      (0,), run.pred_util, run.pred_mem)])
        return len(runs)


def _run(truth: Truth, models: list[str], duration_s: float = 100.0) -> Engine:
    jobs = [SimJob(f"j{i}", 0.0, duration_s, util_percent=40.0, mem_mib=1000.0, model=m)
            for i, m in enumerate(models)]
    nodes = uniform_cluster(1, 1, P100, 16384)
    return Engine(nodes, jobs, FirstGpu(), truth=truth).run()


def test_the_truth_format_reads_back_and_keeps_direction() -> None:
    truth = parse_truth(DOC)
    table = truth.interference[P100]
    assert table.listed("LM-bs5", "ResNet-50-bs64") == 3.56
    assert table.listed("ResNet-50-bs64", "LM-bs5") == 1.25
    assert not table.can_share("CycleGAN", "LM-bs5")  # either order
    again = parse_truth(yaml.safe_load(yaml.safe_dump(truth_document(truth))))
    assert again.interference == truth.interference


def test_bad_interference_sections_name_every_problem() -> None:
    raw = {"interference": {P100: {"slowdown": {"a": {"b": -1, "c": "x"}, "d": 3},
                                   "cannot_share": [["a"], "b"], "colour": 1}},
           "signal": {"model": "cubic", "warmup_s": 5}}
    with pytest.raises(TruthError) as err:
        parse_truth(raw, "t")
    text = "\n".join(err.value.problems)
    for where in (f"t.interference.{P100}.slowdown.a.b:", f"t.interference.{P100}.slowdown.a.c:",
                  f"t.interference.{P100}.slowdown.d:", f"t.interference.{P100}.cannot_share[0]:",
                  f"t.interference.{P100}.cannot_share[1]:", f"t.interference.{P100}.colour:",
                  "t.signal.model:", "t.signal.warmup_s: unknown key"):
        assert where in text


def test_a_shared_gpu_slows_each_job_by_its_own_measured_figure() -> None:
    engine = _run(parse_truth(DOC), ["LM-bs5", "ResNet-50-bs64"])
    lm, resnet = engine.runs
    # ResNet finishes after 125 s (1.25x); LM has done 125/3.56 s of work by then, alone after.
    assert resnet.finish_s == pytest.approx(125.0)
    assert lm.finish_s == pytest.approx(125.0 + (100.0 - 125.0 / 3.56))


def test_three_jobs_add_their_neighbours_extra_time_and_unlisted_pairs_use_the_curve() -> None:
    table = PairTable({"a": {"b": 1.5, "c": 2.0}})

    def curve(i: int, j: int) -> float:
        return 1.1

    # a: 1 + 0.5 + 1.0; b: unlisted beside a and c -> 1 + 0.1 + 0.1; c likewise
    assert job_slowdowns(table, ["a", "b", "c"], curve) == pytest.approx([2.5, 1.2, 1.2])
    assert job_slowdowns(table, ["a"], curve) == [1.0]


def test_a_pair_that_cannot_share_fails_to_start_and_waits() -> None:
    engine = _run(parse_truth(DOC), ["LM-bs5", "CycleGAN"])
    first, second = engine.runs
    assert engine.cannot_share_events >= 1 and second.ooms >= 1
    assert second.start_s >= first.finish_s  # it only ran once the GPU was free of LM


def test_without_an_entry_for_the_type_the_curve_model_is_unchanged() -> None:
    other = {"interference": {"NVIDIA-Tesla-K80": DOC["interference"][P100]}}
    with_pairs = _run(parse_truth(other), ["LM-bs5", "ResNet-50-bs64"])
    plain = _run(Truth(), ["LM-bs5", "ResNet-50-bs64"])
    assert [r.finish_s for r in with_pairs.runs] == [r.finish_s for r in plain.runs]


def test_gavel_import_turns_throughputs_into_slowdowns_and_cannot_share() -> None:
    raw = {"gpus": {"p100": {
        "LM (batch size 5)": {"alone": 10.0, "with": {"ResNet-50 (batch size 64)": [2.5, 4.0],
                                                       "CycleGAN": [0.0, 0.0]}},
        "ResNet-50 (batch size 64)": {"alone": 5.0, "with": {"LM (batch size 5)": [4.0, 2.5]}}}}}
    gpu_type, table = import_gavel(raw, "P100")
    assert gpu_type == P100
    assert table.listed("LM-bs5", "ResNet-50-bs64") == 4.0
    assert table.listed("ResNet-50-bs64", "LM-bs5") == 1.25
    assert not table.can_share("CycleGAN", "LM-bs5")
    assert gavel_model_name("ResNet-50 (batch size 64)") == "ResNet-50-bs64"
    broken = {"gpus": {"p100": {"A3C": {"alone": 1.0, "with": {"LM": "fast"}}}}}
    with pytest.raises(GavelError, match="with.LM"):
        import_gavel(broken, "p100")
    with pytest.raises(GavelError, match="no 'gpus'"):
        import_gavel([], "p100")


@pytest.mark.skipif(not GAVEL.exists(), reason="shared Gavel data not present")
def test_import_command_writes_a_truth_the_simulator_reads(tmp_path: Path) -> None:
    out = tmp_path / "truth.yaml"
    result = CliRunner().invoke(app, ["import-interference", "--gavel", str(GAVEL),
                                      "--gpu", "p100", "-o", str(out)])
    assert result.exit_code == 0, result.output
    truth = parse_truth(yaml.safe_load(out.read_text()))
    lm = truth.interference[P100].listed("LM-bs5", "ResNet-50-bs64")
    assert lm == pytest.approx(3.56, abs=0.01)
    bad = CliRunner().invoke(app, ["import-interference", "--gavel", str(GAVEL), "--gpu", "v9",
                                   "-o", str(out)])
    assert bad.exit_code == 2 and "not in the file" in bad.output


def test_models_truth_draws_seeded_models_from_the_truth(tmp_path: Path) -> None:
    truth_file = tmp_path / "t.yaml"
    truth_file.write_text(yaml.safe_dump(DOC))
    args = ["simulate", "--workload", "w-small", "--policy", "fifo", "--json", "--truth",
            str(truth_file), "--models", "truth", "--cluster", "testbed"]
    a = CliRunner().invoke(app, args)
    b = CliRunner().invoke(app, args)
    assert a.exit_code == 0, a.output
    assert json.loads(a.output) == json.loads(b.output)
    assert "3 models of the truth" in json.loads(a.output)["trace"]
    bad = CliRunner().invoke(app, args[:-5] + ["--models", "truth"])
    assert bad.exit_code == 2


def test_signal_models_show_utilisation_over_slowdown_or_its_root() -> None:
    prop, sub = SignalModel(), SignalModel("sub-proportional")
    assert prop.shown(60.0, 1.0, 4.0) == pytest.approx(15.0)
    assert sub.shown(60.0, 1.0, 4.0) == pytest.approx(30.0)
    assert prop.shown(60.0, 0.5, None) == pytest.approx(30.0)  # alone: its share only
    assert sub.shown(60.0, 1.0, 0.5) == pytest.approx(60.0)  # below 1 reads as 1
    sliced = SignalModel("time-sliced")  # as measured on an H100: the GPU's busy figure
    assert sliced.shown(20.0, 1.0, 4.0, 93.0) == pytest.approx(93.0)
    assert sliced.shown(20.0, 1.0, None, 93.0) == pytest.approx(20.0)  # alone: its own


@pytest.mark.parametrize(("signal", "power"), [("proportional", 1.0), ("sub-proportional", 0.5)])
def test_agents_show_the_signal_model_and_the_learner_learns_what_it_shows(
        signal: str, power: float) -> None:
    """The same learner, never told the setting, learns util / s or util / sqrt(s)."""
    from extender.config.sections import LearningConfig
    from extender.learning.learner import Learner
    from lab.simulator.agents import SimAgents, SimClock

    truth = replace(parse_truth({**DOC, "noise": {"util_stddev_percent": 0}}),
                    signal=SignalModel(signal))
    clock = SimClock()
    learner = Learner(LearningConfig(pairs=True), clock=clock, wall_clock=clock)
    agents = SimAgents(truth, learner, clock)
    jobs = [SimJob("lm-alone", 0.0, 400.0, util_percent=40.0, model="LM-bs5"),
            SimJob("rn-alone", 500.0, 400.0, util_percent=60.0, model="ResNet-50-bs64"),
            SimJob("lm", 1000.0, 1000.0, util_percent=40.0, model="LM-bs5"),
            SimJob("rn", 1000.0, 1000.0, util_percent=60.0, model="ResNet-50-bs64")]
    Engine(uniform_cluster(1, 1, P100, 16384), jobs, FirstGpu(), truth=truth,
           agents=agents).run()
    model = learner.pairs.model()
    assert model is not None
    lm, source = model.figure(P100, "LM-bs5", "ResNet-50-bs64", 1.0)
    assert source.startswith("pair:")
    # shrunk a little toward the profile, which two pairs put near the pair itself
    resnet, _ = model.figure(P100, "ResNet-50-bs64", "LM-bs5", 1.0)
    assert lm == pytest.approx(3.56 ** power, rel=0.05)
    assert resnet == pytest.approx(1.25 ** power, rel=0.05)  # each job its own figure
    assert learner.pairs.stats()["samples"] >= 2


def test_time_sliced_figures_teach_no_interference_and_raise_no_estimate() -> None:
    """Agents that show each co-located process the GPU's busy figure (as an H100 did):
    taken as shares, LM beside ResNet would read 40/100, a speed-up, and its estimate
    would rise to 100%. Set aside, they teach nothing; the alone runs still teach."""
    from extender.config.sections import LearningConfig
    from extender.learning.learner import Learner
    from lab.simulator.agents import SimAgents, SimClock

    truth = replace(parse_truth({**DOC, "noise": {"util_stddev_percent": 0}}),
                    signal=SignalModel("time-sliced"))
    clock = SimClock()
    learner = Learner(LearningConfig(pairs=True), clock=clock, wall_clock=clock)
    agents = SimAgents(truth, learner, clock)
    jobs = [SimJob("lm-alone", 0.0, 400.0, util_percent=40.0, model="LM-bs5"),
            SimJob("lm", 1000.0, 1000.0, util_percent=40.0, model="LM-bs5"),
            SimJob("rn", 1000.0, 1000.0, util_percent=60.0, model="ResNet-50-bs64")]
    Engine(uniform_cluster(1, 1, P100, 16384), jobs, FirstGpu(), truth=truth,
           agents=agents).run()
    stats = learner.stats()
    assert learner.pairs.stats()["samples"] == 0
    assert stats["rejected"]["per-process-not-shares"] > 0
    view = learner.store.view()
    assert view["colocated"] == []  # no co-located floor from the GPU's figure
    assert len(view["alone"]) == 1  # LM alone, from the GPU's utilisation


def test_simulate_takes_a_matrix_prior_from_the_config_and_refuses_a_bad_one(
        tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(DOC))
    (tmp_path / "prior.yaml").write_text(yaml.safe_dump(DOC))  # a truth file serves as a prior
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"learning": {"pairs": True, "pair_prior": "prior.yaml"}}))
    args = ["simulate", "--workload", "w-small", "--policy", "tandem", "--json", "--truth",
            str(tmp_path / "t.yaml"), "--models", "truth", "--cluster", "testbed",
            "--config", str(config)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    learned = body["truth"]["learning"]["tandem"]
    assert body["finished"] > 0 and {"pair_samples", "group_samples"} <= learned.keys()
    (tmp_path / "prior.yaml").write_text("interference: {P100: {slowdown: {a: {b: 0}}}}\n")
    bad = CliRunner().invoke(app, args)
    assert bad.exit_code == 2 and "learning.pair_prior" in bad.output, bad.output
