"""The whole data path on CPU, as the GPU session will run it, with the explicit sim: backend.

``tandem profile plan|run --backend sim:FILE`` -> ``training_data``-shaped tmp dir ->
``tandem predictor train --allow-simulated`` -> ``evaluate`` (RMSLE per held-out
family) -> ``fit-curves`` -> ``predict MODEL.onnx --json`` with the trained
artifacts, all through the same Typer commands ``tandem/cli.py`` mounts.
Every number here is SYNTHETIC (tests/data/profiling/sim-dryrun.yaml).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import typer
import yaml
from typer.testing import CliRunner

from predictor.commands import app as predictor_app
from predictor.profiling.commands import profile_command

SIM_FILE = Path(__file__).parents[1] / "data" / "profiling" / "sim-dryrun.yaml"
GPU = "SIM DRYRUN GPU 16GB"
FAMILIES = {"resnet", "vgg", "lstm", "mlp"}

# The root CLI's wiring for these two commands (tandem/cli.py), without the
# extender's and agent's imports.
tandem = typer.Typer()
tandem.command("profile")(profile_command)
tandem.add_typer(predictor_app, name="predictor")
runner = CliRunner()


def _tandem(*args: str, code: int = 0) -> Any:
    result = runner.invoke(tandem, [str(a) for a in args])
    assert result.exit_code == code, f"{args}: {result.output}"
    return json.loads(result.stdout.splitlines()[-1]) if "--json" in args else result


def test_profile_train_evaluate_fit_curves_predict_on_a_simulated_gpu(tmp_path: Path) -> None:
    data, art = tmp_path / "training_data", tmp_path / "artifacts"
    campaign = ["--backend", f"sim:{SIM_FILE}", "--out", data, "--batch-sizes", "2,8,32",
                "--pairs", "10", "--triples", "8", "--seed", "0", "--json"]  # fmt: skip

    plan = _tandem("profile", "plan", *campaign)
    assert plan["isolated"]["remaining"] == 4 * 2 * 3 and plan["isolated"]["families"] == sorted(
        FAMILIES
    )
    run = _tandem("profile", "run", *campaign, "--no-progress")
    gpu_dir = Path(run["gpu_dir"])
    assert run["state"] == "complete" and gpu_dir == data / "sim-dryrun-gpu-16gb"
    assert run["statuses"]["oom"] >= 1 and run["colocated_run"] == 18
    assert json.loads((gpu_dir / "provenance.json").read_text())["simulated"] is True
    again = _tandem("profile", "plan", *campaign)  # resuming would run nothing
    assert again["isolated"]["remaining"] == 0 and again["colocated"]["done"] == 18

    # Synthetic rows never train anything by accident.
    refused = _tandem("predictor", "train", "--data", data, "--out", art, "--json", code=2)
    assert refused["reason"] == "simulated_data" and not art.exists()

    trained = _tandem("predictor", "train", "--data", data, "--out", art, "--no-baselines",
                      "--allow-simulated", "--json")  # fmt: skip
    with (gpu_dir / "isolated.csv").open(newline="") as fh:
        ok_isolated = sum(r["status"] == "ok" for r in csv.DictReader(fh))
    assert trained["simulated"] is True and trained["n_rows"] == ok_isolated == 24 - 1
    card = json.loads((art / "model_card.json").read_text())
    assert card["simulated"] is True and card["gpu_types"] == [GPU]
    assert set(card["families"]) == FAMILIES

    evaluation = _tandem("predictor", "evaluate", "--data", data, "--out-dir", tmp_path / "eval",
                         "--no-baselines", "--allow-simulated", "--json")  # fmt: skip
    per_family = evaluation["metrics"]["xgboost"]["rmsle_per_family"]
    assert set(per_family) == FAMILIES and all(v >= 0 for v in per_family.values())
    assert evaluation["simulated"] is True
    saved = json.loads((tmp_path / "eval" / "predictor_evaluation.json").read_text())
    assert saved["metrics"]["xgboost"]["rmsle_per_family"] == per_family

    curves = _tandem("predictor", "fit-curves", "--data", data, "--out", art / "curves.yaml",
                     "--allow-simulated", "--json")  # fmt: skip
    assert set(curves["r2"]) == {GPU} and curves["simulated"] is True
    written = yaml.safe_load((art / "curves.yaml").read_text())
    assert written["fit"][GPU]["n_above"] > 0 and written["simulated"] is True
    assert written["curves"][GPU] == curves["cost_curves"][GPU]

    exported = _tandem("predictor", "export-zoo", "--out", tmp_path / "zoo", "--models", "mlp",
                       "--json")  # fmt: skip
    model = exported["files"][0]
    pred = _tandem("predictor", "predict", model, "--gpu-type", GPU, "--artifacts", art,
                   "--batch-size", "8", "--json")  # fmt: skip
    assert 0 <= pred["gpu_util_percent"] <= 100 and pred["gpu_mem_mib"] > 0
    assert pred["source"].startswith(f"xgboost:{card['model_digest'][:12]},simulated")
    # the sim backend's rows say framework "sim", so no PyTorch overhead is fitted from them
    assert pred["source"].endswith("+mem:no-overhead")
    overheads = json.loads((art / "memory_overhead.json").read_text())
    assert {o["framework"] for o in overheads["overheads"]} == {"sim"}
    assert overheads["meta"]["simulated"] is True
