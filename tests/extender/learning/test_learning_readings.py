"""Per-process figures that are not shares of their GPU are set aside
(:mod:`extender.learning.readings`)."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import pytest

from contracts.agentreport import ReportedProcess
from extender.core import GpuSpec
from extender.learning.readings import not_shares, shares_only
from extender.state.reports import DecodedReport

ROOT = Path(__file__).resolve().parents[3]
MEASURED = [ROOT / "training_data" / "nvidia-h100-80gb-hbm3",
            ROOT / "benchmarks" / "results" / "h100_pairs_retest"]


def _pairs(directory: Path) -> list[tuple[float, list[float]]]:
    combos: dict[str, list[dict[str, str]]] = defaultdict(list)
    with (directory / "colocated.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            combos[row["combo_id"]].append(row)
    return [(float(rows[0]["util_mean_percent"]),
             [float(r["process_util_mean_percent"]) for r in rows])
            for rows in combos.values()
            if all(r["process_util_mean_percent"] for r in rows)]  # fmt: skip


@pytest.mark.parametrize("directory", MEASURED, ids=["campaign", "retest"])
def test_every_measured_h100_pair_is_caught_and_no_run_alone(directory: Path) -> None:
    pairs = _pairs(directory)
    assert len(pairs) >= 39
    assert all(not_shares(gpu, figures) for gpu, figures in pairs)
    with (directory / "isolated.csv").open(newline="") as fh:
        alone = [(float(r["util_mean_percent"]), float(r["process_util_mean_percent"]))
                 for r in csv.DictReader(fh)]  # fmt: skip
    assert alone and all(abs(gpu - own) < 1.0 for gpu, own in alone)


def test_shares_pass_whatever_the_slowdown() -> None:
    # proportional (util / slowdown) and sub-proportional figures never sum past the GPU
    assert not not_shares(68.0, [16.0 / 1.13, 52.0 / 1.13])
    assert not not_shares(100.0, [60.0 / math.sqrt(1.3), 55.0 / math.sqrt(1.5)])
    assert not not_shares(80.0, [45.0, 44.0])  # sampling noise around the total
    assert not not_shares(50.0, [97.0])  # one process: nothing to compare
    assert not not_shares(math.nan, [97.0, 95.0])  # the GPU's figure was lost
    # past the GPU's figure but not each about it: not what the H100 showed, kept
    assert not not_shares(100.0, [95.0, 40.0, 38.0])


def _report(gpu_utils: list[float], figures: list[list[float | None]]) -> DecodedReport:
    gpus = tuple(GpuSpec(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559.0)
                 for i in range(len(gpu_utils)))  # fmt: skip
    procs = tuple(tuple(ReportedProcess(f"pod-{i}-{j}", 1000.0, u) for j, u in enumerate(fs))
                  for i, fs in enumerate(figures))  # fmt: skip
    return DecodedReport("node-a", gpus, tuple(gpu_utils), (0.0,) * len(gpus), procs)


def test_only_the_gpus_whose_figures_are_not_shares_lose_them() -> None:
    report = _report([89.5, 68.0], [[97.0, 87.9], [14.2, 46.0]])
    cleaned, flagged = shares_only(report)
    assert flagged == {0}
    assert [p.util_percent for p in cleaned.processes[0]] == [None, None]
    assert cleaned.processes[1] == report.processes[1]
    assert [p.pod_uid for p in cleaned.processes[0]] == ["pod-0-0", "pod-0-1"]  # kept
    same, none = shares_only(_report([68.0], [[14.2, 46.0]]))
    assert none == frozenset() and same.processes == _report([68.0], [[14.2, 46.0]]).processes
