"""Simulated training data: refused by default, and marked wherever it is let in.

Directories whose provenance.json says ``"simulated": true`` come from the
profiler's ``sim:`` backend. ``train``, ``evaluate`` and ``fit-curves`` refuse
them without ``--allow-simulated``; with it, the model card, evaluation JSON,
curves file and every ``Prediction.source`` say ``simulated``. All rows here are
SYNTHETIC (see test_predictor_training.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from predictor_fixtures import FAST, GPU, write_dataset
from predictor_fixtures import tiny_model as _tiny_model
from typer.testing import CliRunner

from predictor.api import Predictor
from predictor.commands import app as predictor_app
from predictor.dataset import MissingProvenance, SimulatedData, load_training_data
from predictor.store import ModelStore, StoreConfig
from predictor.training import fit_all, load_artifacts, save_artifacts

runner = CliRunner()


def _mark(root: Path, simulated: object, gpu: str = GPU) -> Path:
    prov_path = root / gpu / "provenance.json"
    prov = json.loads(prov_path.read_text())
    prov["simulated"] = simulated
    prov_path.write_text(json.dumps(prov))
    return root


def _args(command: str, root: Path, out: Path) -> list[str]:
    outputs = {
        "train": ["--out", str(out / "art"), "--no-baselines"],
        "evaluate": ["--out-dir", str(out / "eval"), "--no-baselines"],
        "fit-curves": ["--out", str(out / "art" / "curves.yaml")],
    }
    return [command, "--data", str(root), *outputs[command], "--json"]


COMMANDS = ["train", "evaluate", "fit-curves"]


@pytest.mark.parametrize("command", COMMANDS)
def test_simulated_data_is_refused_without_the_flag(command: str, tmp_path: Path) -> None:
    root = _mark(write_dataset(tmp_path / "data"), True)
    result = runner.invoke(predictor_app, _args(command, root, tmp_path))
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout.splitlines()[0])["reason"] == "simulated_data"
    assert "--allow-simulated" in result.stderr
    assert not (tmp_path / "art").exists() and not (tmp_path / "eval").exists()


@pytest.mark.parametrize(
    ("simulated", "allow", "want"),
    [(True, True, True), (None, False, False), (False, True, False)],
    ids=["simulated-allowed", "no-key-is-real", "real-with-flag-stays-real"],
)
@pytest.mark.parametrize("command", COMMANDS)
def test_outputs_say_whether_they_came_from_simulated_data(
    command: str, simulated: bool | None, allow: bool, want: bool, tmp_path: Path
) -> None:
    root = write_dataset(tmp_path / "data")
    if simulated is not None:
        _mark(root, simulated)
    args = _args(command, root, tmp_path) + (["--allow-simulated"] if allow else [])
    result = runner.invoke(predictor_app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["simulated"] is want
    assert ("SIMULATED" in result.stderr) is want
    written = {
        "train": tmp_path / "art" / "model_card.json",
        "evaluate": tmp_path / "eval" / "predictor_evaluation.json",
        "fit-curves": tmp_path / "art" / "curves.yaml",
    }[command]
    assert yaml.safe_load(written.read_text())["simulated"] is want  # JSON is YAML too


@pytest.mark.parametrize("value", ["false", 1, None], ids=["string", "number", "null"])
def test_simulated_must_be_a_json_boolean(value: object, tmp_path: Path) -> None:
    root = _mark(write_dataset(tmp_path / "data"), value)
    with pytest.raises(MissingProvenance, match="simulated: must be true or false"):
        load_training_data(root, allow_simulated=True)


def test_one_simulated_directory_taints_the_whole_model(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "data")
    other = tmp_path / "other"
    write_dataset(other)
    (other / GPU).rename(root / "SIM-GPU")
    _mark(root, True, "SIM-GPU")
    with pytest.raises(SimulatedData, match="SIM-GPU"):
        load_training_data(root)
    datasets = load_training_data(root, allow_simulated=True)
    assert [d.simulated for d in datasets] == [True, False]
    est, card, overheads, _ = fit_all(datasets, ("xgboost",), FAST)
    assert card["simulated"] is True


@pytest.mark.parametrize(
    ("simulated", "gpu_type", "want_prefix", "want_parts"),
    [
        (True, GPU, ",simulated", ["+mem:fitted"]),
        (True, "OTHER-GPU", ",simulated", [",gpu=max", "+mem:fitted"]),
        (False, GPU, "", ["+mem:fitted"]),
    ],
    ids=["simulated", "simulated-unknown-gpu", "real"],
)
def test_every_prediction_source_says_simulated(
    simulated: bool, gpu_type: str, want_prefix: str, want_parts: list[str], tmp_path: Path
) -> None:
    root = _mark(write_dataset(tmp_path / "data"), simulated)
    est, card, overheads, _ = fit_all(load_training_data(root, True), ("xgboost",), FAST)
    artifacts = load_artifacts(save_artifacts(tmp_path / "art", est, card, overheads))
    assert artifacts.simulated is simulated
    store = tmp_path / "store"
    store.mkdir()
    _tiny_model(store / "tiny.onnx")
    source = (
        Predictor(artifacts, ModelStore(StoreConfig(root=store)))
        .predict("tiny.onnx", 4, gpu_type, "training")
        .source
    )
    digest = artifacts.card["model_digest"][:12]
    assert source.startswith(f"xgboost:{digest}{want_prefix}")
    assert ("simulated" in source) is simulated
    assert all(part in source for part in want_parts)
    overhead_meta = json.loads((tmp_path / "art" / "memory_overhead.json").read_text())["meta"]
    assert overhead_meta["simulated"] is simulated
