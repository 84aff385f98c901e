"""Committed benchmark results name no directory of the machine they ran on: the result
writer makes paths relative to the repository (another checkout's venv keeps only
``.venv/...``, any other absolute path only its name), and the files say so."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from bench_modules import load

common = load("_common")
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|root|Users|srv|opt|mnt)/[\w./-]+")


@pytest.mark.parametrize("path", sorted(RESULTS.rglob("*.json")), ids=lambda p: p.name)
def test_committed_results_carry_no_machine_path(path: Path) -> None:
    assert MACHINE_PATH.findall(path.read_text()) == []


def test_the_writer_keeps_paths_relative(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    root = common.ROOT
    monkeypatch.setattr(sys, "executable", "/work/elsewhere/.venv/bin/python")
    monkeypatch.setattr(sys, "argv", [str(root / "benchmarks" / "learning.py"), "--seeds", "2",
                                      "--baseline", "/work/wt/old-checkout",
                                      "--out", str(root / "benchmarks/results/x.json")])
    line = common.command()
    assert line == (".venv/bin/python benchmarks/learning.py --seeds 2 --baseline "
                    ".../old-checkout --out benchmarks/results/x.json")
    out = tmp_path / "r.json"
    common.write_result({"data": f"{root}/training_data", "command": line}, out)
    assert MACHINE_PATH.findall(out.read_text()) == [] and "training_data" in out.read_text()
