"""``tandem predictor predict --gpu-type`` on a model trained for other GPUs says that the
utilisation is the largest over the trained types, instead of falling back silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from predictor_fixtures import FAST, GPU, tiny_model, write_dataset
from typer.testing import CliRunner

from predictor.dataset import load_training_data
from predictor.training import fit_all, save_artifacts
from tandem.cli import app


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_dataset(tmp_path_factory.mktemp("data"))
    est, card, overheads, _ = fit_all(load_training_data(root, True), ("xgboost",), FAST)
    return save_artifacts(tmp_path_factory.mktemp("art"), est, card, overheads)


def predict(artifacts: Path, tmp_path: Path, gpu_type: str) -> tuple[dict, str]:
    model = tiny_model(tmp_path / "m.onnx")
    result = CliRunner().invoke(app, ["predictor", "predict", str(model), "--gpu-type",
                                      gpu_type, "--artifacts", str(artifacts), "--json"])
    assert result.exit_code == 0, result.output
    out = [ln for ln in result.output.splitlines() if ln.startswith("{")]
    notes = "\n".join(ln for ln in result.output.splitlines() if ln.startswith("note:"))
    return json.loads(out[-1]), notes


def test_a_gpu_type_the_model_was_not_trained_for_is_named(artifacts: Path,
                                                           tmp_path: Path) -> None:
    doc, notes = predict(artifacts, tmp_path, "NVIDIA-H100-80GB-HBM3")
    assert doc["source"].split("+mem:")[0].endswith(",gpu=max")
    assert "--gpu-type NVIDIA-H100-80GB-HBM3 is not one the model was trained for" in notes
    assert GPU in notes


def test_a_trained_gpu_type_gives_no_note(artifacts: Path, tmp_path: Path) -> None:
    doc, notes = predict(artifacts, tmp_path, GPU)
    assert ",gpu=max" not in doc["source"] and notes == ""
