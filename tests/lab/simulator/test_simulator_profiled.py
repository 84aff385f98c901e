"""A profiling campaign's pairs become a truth (tandem import-interference --profiled)."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lab.simulator.profiled import ProfiledError, import_profiled
from lab.simulator.truth import parse_truth
from tandem.cli import app

ROOT = Path(__file__).resolve().parents[3]
H100 = ROOT / "training_data" / "nvidia-h100-80gb-hbm3"
RETEST = ROOT / "benchmarks" / "results" / "h100_pairs_retest"
TYPE = "NVIDIA-H100-80GB-HBM3"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def test_the_measured_h100_pairs_import_directed_with_the_models_alone() -> None:
    gpu_type, table, models = import_profiled(H100)
    assert gpu_type == TYPE and len(models) == 12
    assert sum(len(row) for row in table.slowdown.values()) == 132  # 66 pairs, both ways
    # asymmetric, as measured: shufflenet barely notices vgg11, vgg11 runs 1.68x slower
    shufflenet = table.slowdown["shufflenet_v2_1.0-bs32"]["vgg11-bs32"]  # listed() reads 1
    assert shufflenet == pytest.approx(0.81, abs=0.01)
    assert table.listed("vgg11-bs32", "shufflenet_v2_1.0-bs32") == pytest.approx(1.68, abs=0.01)
    assert models["vgg11-bs32"].util_percent[TYPE] == pytest.approx(92.0, abs=0.1)


def test_a_repeated_pair_is_averaged_in_log_and_an_oom_pair_cannot_share(tmp_path: Path) -> None:
    d = tmp_path / "nvidia-h100-80gb-hbm3"
    shutil.copytree(H100, d)
    rows = _rows(d / "colocated.csv")
    (first_id,) = {r["combo_id"] for r in rows if r["model"] == "mlp" and r["n_jobs"] == "2"
                   and {"mlp", "vgg11"} == {x["model"] for x in rows
                                            if x["combo_id"] == r["combo_id"]}}  # fmt: skip
    pair = [r for r in rows if r["combo_id"] == first_id]
    again = [r | {"run_id": "again", "slowdown": str(float(r["slowdown"]) * 4)} for r in pair]
    lm = [r for r in rows if r["model"] == "lstm" and r["n_jobs"] == "2"][0]["combo_id"]
    oom = [r | ({"status": "oom", "step_time_ms": "", "slowdown": "", "util_mean_percent": "",
                 "process_util_mean_percent": "", "mem_used_nvml_mib": ""}
                if r["combo_id"] == lm else {}) for r in rows]  # fmt: skip
    _write(d / "colocated.csv", oom + again)
    _, table, _ = import_profiled(d)
    mlp = next(r for r in pair if r["model"] == "mlp")
    assert table.listed("mlp-bs32", "vgg11-bs32") == pytest.approx(
        float(mlp["slowdown"]) * 2, rel=1e-3)  # geometric mean of s and 4s
    partner = {r["model"] for r in rows if r["combo_id"] == lm} - {"lstm"}
    assert not table.can_share("lstm-bs32", f"{partner.pop()}-bs32")


def test_the_command_writes_a_truth_the_simulator_reads_and_refuses_unclear_sources(
        tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "h100.yaml"
    result = CliRunner().invoke(app, ["import-interference", "--profiled", str(RETEST),
                                      "-o", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "78 measured pairs" in result.output  # the retest measured 39 of the 66 pairs
    truth = parse_truth(yaml.safe_load(out.read_text()))
    assert math.isclose(truth.models["mlp-bs32"].util_percent[TYPE], 15.0, abs_tol=0.1)
    assert truth.interference[TYPE].listed("vgg11-bs32", "mlp-bs32") is not None
    neither = CliRunner().invoke(app, ["import-interference", "-o", str(out)])
    both = CliRunner().invoke(app, ["import-interference", "--profiled", str(H100), "--gavel",
                                    str(out), "--gpu", "p100", "-o", str(out)])  # fmt: skip
    assert neither.exit_code == both.exit_code == 2
    with pytest.raises(ProfiledError, match="provenance"):
        import_profiled(tmp_path)
