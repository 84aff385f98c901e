"""`tandem predictor train` learns from the fleet's observed.csv rows too (or not, when told)."""

from __future__ import annotations

import json
from pathlib import Path

from predictor_fixtures import GPU, synthetic_isolated, tiny_model, write_dataset
from typer.testing import CliRunner

from predictor.commands import app
from predictor.dataset import load_training_data
from predictor.observed import OBSERVED_FILE, write_observed
from predictor.training import build_table

runner = CliRunner()


def _observed(root: Path, tiny: Path) -> None:
    """Fleet rows: six profiled models seen far busier, one local file, one unreadable URL."""
    profiled = [r for r in synthetic_isolated() if r["workload"] == "training"][:6]
    rows = [{"model": r["model"], "workload": "training", "batch_size": r["batch_size"],
             "gpu_product": GPU, "util_mean_percent": min(100.0, r["util_mean_percent"] + 30),
             "util_stddev_percent": 2.0, "n_samples": 40, "updated_at": 1.0, "model_digest": ""}
            for r in profiled]
    for model in (str(tiny), "https://nowhere.example/x.onnx"):
        rows.append({**rows[0], "model": model, "batch_size": 4, "util_mean_percent": 12.0})
    write_observed(rows, root)


def _train(data: Path, out: Path, *extra: str) -> dict:
    result = runner.invoke(app, ["train", "--data", str(data), "--out", str(out), "--json",
                                 *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_training_with_observations_changes_the_model_and_its_card(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "td")
    _observed(root, tiny_model(tmp_path / "tiny.onnx"))
    with_fleet = _train(root, tmp_path / "a")
    without = _train(root, tmp_path / "b", "--no-observed")
    assert with_fleet["n_rows_by_source"] == {"profiled": 36, "observed": 7}
    assert with_fleet["observed_rows_skipped"] == 1  # the URL was never downloaded
    assert without["n_rows_by_source"] == {"profiled": 36, "observed": 0}
    assert with_fleet["n_rows"] == 43 and without["n_rows"] == 36
    card_a = json.loads((tmp_path / "a" / "model_card.json").read_text())
    card_b = json.loads((tmp_path / "b" / "model_card.json").read_text())
    assert card_a["n_rows_by_source"]["observed"] == 7
    assert card_a["model_digest"] != card_b["model_digest"]  # the fleet moved the model


def test_observed_rows_take_features_from_profiled_rows_or_the_file(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "td")
    _observed(root, tiny_model(tmp_path / "tiny.onnx"))
    datasets = load_training_data(root)
    assert len(datasets[0].observed) == 8
    from predictor.observed import local_featurise

    table = build_table(datasets, featurise=local_featurise())
    fleet = [r for r, s in zip(table.rows, table.sources, strict=True) if s == "observed"]
    by_model = {r["model"]: r for r in fleet}
    donor = next(r for r in synthetic_isolated() if r["model"] == fleet[0]["model"]
                 and r["batch_size"] == fleet[0]["batch_size"])
    assert fleet[0]["flops"] == donor["flops"] and fleet[0]["family"] == donor["family"]
    tiny = by_model[str(tmp_path / "tiny.onnx")]
    assert tiny["family"] == "fleet:tiny" and tiny["flops"] > 0
    # without a featuriser the unprofiled local file is skipped too; --no-observed: none
    assert build_table(datasets).observed_skipped == 2
    assert "observed" not in build_table(datasets, observed=False).sources


def test_export_writes_provenance_so_an_observed_only_directory_trains(tmp_path: Path) -> None:
    doc = {"version": 2, "colocated": [], "alone": [
        {"model": "sha256:abc", "reference": "m.onnx", "batch_size": 32, "workload": "training",
         "gpu_type": "NVIDIA-L4", "util_percent": 40.0, "stddev_percent": 1.0, "samples": 9,
         "updated_at": 5.0}]}
    src = tmp_path / "observations.json"
    src.write_text(json.dumps(doc))
    result = runner.invoke(app, ["export-observations", str(src), "--out", str(tmp_path / "td")])
    assert result.exit_code == 0, result.output
    gpu_dir = tmp_path / "td" / "NVIDIA-L4"
    assert (gpu_dir / OBSERVED_FILE).is_file()
    provenance = json.loads((gpu_dir / "provenance.json").read_text())
    assert provenance["command"] == "tandem predictor export-observations"
    (ds,) = load_training_data(tmp_path / "td")
    assert ds.observed[0]["model"] == "m.onnx" and ds.observed[0]["model_digest"] == "abc"
