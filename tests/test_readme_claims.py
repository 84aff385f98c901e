"""README's positioning and headline figures: the comparison names each alternative,
the papers are cited, and the simulation figures are the ones its results file holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SIMULATION = json.loads((ROOT / "benchmarks/results/simulation.json").read_text())


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


@pytest.mark.parametrize("name", ["gpushare", "HAMi", "KAI", "time-slicing", "MPS", "MIG",
                                  "tandem"])
def test_the_comparison_has_a_row_for(name: str) -> None:
    rows = [ln for ln in section("How it compares").splitlines() if ln.startswith("| ")]
    assert rows[0].split("|")[2:5] == [" shares a GPU by ", " enforces ", " predicts "]
    assert any(name in row.split("|")[1] for row in rows[1:]), name


@pytest.mark.parametrize("paper", ["Horus", "Nexus", "Olympian", "Harpagon"])
def test_each_paper_is_cited(paper: str) -> None:
    cites = section("How it compares")
    assert re.search(rf"\*\*{paper}\*\*: [A-Z]\. .+?\*{paper}:", cites, re.S), paper


@pytest.mark.parametrize(("workload", "figure"), [("w-small", "19.4%"), ("w-large", "16.9%")])
def test_tandem_vs_fifo_figures_are_the_results_files(workload: str, figure: str) -> None:
    measured = SIMULATION["testbed"][f"{workload}/curve"]["vs_fifo"]["tandem"]
    assert f"{measured['makespan_reduction_percent']}%" == figure
    row = next(ln for ln in README.splitlines() if ln.startswith("| tandem's default vs FIFO"))
    assert figure in row and "5 seeds" in row
    assert "--seed 1" in row  # the one-seed command beside it, with its own figure


def test_the_first_two_commands_stay() -> None:
    blocks = re.findall(r"```bash\n(.+?)\n```", README, re.S)
    assert blocks[:2] == [
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/tandem demo",
        "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/pytest -n 2 -q"]
