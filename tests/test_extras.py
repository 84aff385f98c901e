"""A feature that needs an optional extra says so before any work, with the pip line."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from contracts import extras
from tandem.cli import app

REAL_FIND_SPEC = importlib.util.find_spec


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else REAL_FIND_SPEC(name, *args)

    monkeypatch.setattr(extras.importlib.util, "find_spec", find_spec)


def test_an_installed_extra_is_not_missing() -> None:
    assert extras.missing_extra("plots", "--plots") is None  # the dev extra has it


def test_a_missing_extra_names_the_pip_line(no_matplotlib: None) -> None:
    assert extras.missing_extra("plots", "--plots") == (
        "--plots needs matplotlib, which is not installed: "
        "pip install 'tandem-scheduler[plots]'")


def test_every_extra_named_is_one_pyproject_declares() -> None:
    import tomllib

    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml")
                             .read_text())["project"]["optional-dependencies"]
    assert set(extras.EXTRAS) <= set(declared)
    assert any(extras.EXTRAS["plots"] in dep for dep in declared["plots"])


def test_simulate_plots_fails_before_simulating(no_matplotlib: None, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_: Any, **__: Any) -> None:
        raise AssertionError("the simulation ran")

    monkeypatch.setattr("lab.simulator.cli_support._simulate", never)
    result = CliRunner().invoke(app, ["simulate", "--workload", "w-small", "--policy", "fifo",
                                      "--plots", str(tmp_path / "plots")])
    assert result.exit_code == 2
    assert result.output.startswith("error: --plots needs matplotlib")
    assert "pip install 'tandem-scheduler[plots]'" in result.output


def test_simulate_errors_start_with_error() -> None:
    result = CliRunner().invoke(app, ["simulate", "--workload", "w-small", "--models", "-1"])
    assert result.exit_code == 2 and result.output.startswith("error: --models")


def test_fit_curves_says_before_the_work_that_no_plot_will_be_written(
        no_matplotlib: None, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["predictor", "fit-curves", "--data",
                                      str(tmp_path / "missing"), "--out",
                                      str(tmp_path / "curves.yaml")])
    lines = result.output.splitlines()
    assert lines[0].startswith("note: no plot:") and "[plots]" in lines[0]
    assert result.exit_code != 0  # then the missing data stops it
