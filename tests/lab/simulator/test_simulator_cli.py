"""``tandem simulate`` end to end through the root Typer app."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from extender.config.schema import build_config
from lab.simulator.jobs import dump_trace
from lab.simulator.workloads import generate
from tandem.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    file = tmp_path_factory.mktemp("trace") / "small.json"
    file.write_text(dump_trace(generate("w-small", 2)[:30]))
    return file


def test_single_policy_json_has_the_design_keys(trace: Path) -> None:
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "testbed",
                                 "--policy", "horus", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    for key in ("makespan_s", "avg_gpu_util", "avg_jct_s", "avg_wait_s", "oom_events"):
        assert isinstance(body[key], (int, float))
    assert body["policy"] == "horus" and body["jobs"] == 30


def test_several_policies_report_per_policy(trace: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "testbed",
                                 "--policy", "fifo", "--policy", "tandem", "--json",
                                 "--timeline", str(tmp_path / "t.csv")])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert list(body["policies"]) == ["fifo", "tandem"]
    assert body["policies"]["fifo"]["avg_slowdown"] == 1.0
    header = (tmp_path / "t.csv").read_text().splitlines()[0]
    assert header == "policy,t_s,gpu,util_percent,mem_mib,jobs"


def test_sweep_writes_a_valid_extender_config_snippet(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "best.yaml"
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "testbed",
                                 "--sweep", "--grid", "w_util=1,4;max_pods_per_gpu=1,3",
                                 "--sweep-out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert len(body["settings"]) == 4
    makespans = [s["makespan_s"] for s in body["settings"]]
    assert makespans == sorted(makespans) and body["best"]["makespan_s"] == makespans[0]
    doc = yaml.safe_load(out.read_text())
    config = build_config(doc)
    assert config.policy.max_pods_per_gpu == int(body["best"]["max_pods_per_gpu"])


def test_sweep_switches_the_colocation_rule_off_and_on(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "best.yaml"
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "testbed",
                                 "--sweep", "--grid", "min_colocation_gain_percent=off,10",
                                 "--sweep-out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert sorted(s["min_colocation_gain_percent"] is None for s in body["settings"]) == [
        False, True]
    config = build_config(yaml.safe_load(out.read_text()))
    assert config.policy.min_colocation_gain_percent == body["best"][
        "min_colocation_gain_percent"]


def test_plots_are_written(trace: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "testbed",
                                 "--policy", "fifo", "--plots", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    for name in ("utilisation.png", "jct_cdf.png", "wait_cdf.png"):
        assert (tmp_path / "p" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--workload", "w-small", "--policy", "sjf"], "valid: fifo", id="policy"),
        pytest.param([], "exactly one of", id="no-input"),
        pytest.param(["--workload", "nope"], "valid: w-small", id="workload"),
        pytest.param(["--workload", "w-small", "--interference", "cubic"], "valid: curve",
                     id="interference"),
        pytest.param(["--workload", "w-small", "--sweep", "--grid", "gamma=1"], "KEY=V1",
                     id="grid"),
        pytest.param(["--workload", "w-small", "--sweep", "--grid", "w_mem=off"],
                     "must be numbers", id="grid-off-for-a-required-key"),
        pytest.param(["--workload", "w-small", "--cluster", "sim:/nonexistent.yaml"],
                     "cannot read", id="cluster"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["simulate", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_plots_are_titled_and_their_paths_printed(trace: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from lab.simulator import plots

    titles: list[str] = []
    real_save = plots._save

    def save(fig: Any, path: Path, plt: Any) -> Path:
        titles.append(fig.axes[0].get_title())
        return real_save(fig, path, plt)

    monkeypatch.setattr(plots, "_save", save)
    out = tmp_path / "p"
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "testbed",
                                 "--policy", "fifo", "--policy", "horus", "--plots", str(out),
                                 "--interference", "linear"])
    assert result.exit_code == 0, result.output
    for name in ("utilisation.png", "jct_cdf.png", "wait_cdf.png"):
        assert f"plot written to {out / name}" in result.output
    assert len(titles) == 3
    assert all(str(trace) in t and "interference linear" in t and "policies: fifo, horus" in t
               for t in titles)


def test_text_table_fits_80_columns_and_jct_is_wait_plus_run(trace: Path) -> None:
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "testbed"])
    assert result.exit_code == 0, result.output
    table = result.output.splitlines()[1:]  # the first line names the trace's path
    assert len(table) == 7 and max(len(line) for line in table) <= 80
    body = json.loads(runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster",
                                          "testbed", "--json"]).output)
    for r in body["policies"].values():
        assert r["avg_jct_s"] == pytest.approx(r["avg_wait_s"] + r["avg_run_s"], abs=0.01)
        assert r["avg_run_s"] > 0


def test_progress_proxy_counts_every_job_and_changes_no_decision(trace: Path) -> None:
    from lab.simulator.cluster import builtin_cluster
    from lab.simulator.jobs import load_trace
    from lab.simulator.progress import ProgressPolicy
    from lab.simulator.runner import simulate

    jobs, nodes = load_trace(trace), builtin_cluster("testbed")
    ticks: list[int] = []
    proxies: list[ProgressPolicy] = []

    def wrap(policy: Any) -> ProgressPolicy:
        proxies.append(ProgressPolicy(policy, ticks.append, clock=itertools.count().__next__))
        return proxies[-1]

    plain = simulate(jobs, nodes, "tandem")
    wrapped = simulate(jobs, nodes, "tandem", wrap=wrap)
    assert wrapped.summary() == plain.summary()
    proxies[0].flush()
    assert sum(ticks) == len(jobs) and len(ticks) > 1  # reported as the run went


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("enabled", "stream", "shown"), [
    (True, _Tty(), True), (False, _Tty(), False), (True, io.StringIO(), False)])
def test_progress_bars_only_on_a_terminal_and_not_with_json(enabled: bool, stream: Any,
                                                            shown: bool) -> None:
    from lab.simulator.progress import wanted

    assert wanted(enabled, stream) is shown
