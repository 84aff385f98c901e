"""`tandem agent device-plugin --list`: what the plugin would advertise, for checking a
node by hand (beside `nvidia-smi -L`), without a kubelet or an extender."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from tandem.cli import app

SIM = Path(__file__).parents[2] / "data" / "agent" / "sim_cluster.yaml"


def test_list_shows_each_gpu_its_shares_health_and_cdi_name(tmp_path: Path) -> None:
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": "GPU-sim-gpu-node-1-1", "containerEdits": {}}]}
    (tmp_path / "nvidia.yaml").write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(app, ["agent", "device-plugin", "--list", "--gpus",
                                      f"sim:{SIM}", "--node", "gpu-node-1", "--shares", "3",
                                      "--cdi-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.output)
    assert listing["resource"] == "tandem.io/gpu" and listing["shares_per_gpu"] == 3
    gpus = listing["gpus"]
    assert [g["index"] for g in gpus] == sorted(g["index"] for g in gpus) and len(gpus) >= 2
    assert all(g["healthy"] and g["devices"] == 3 for g in gpus)
    assert {g["uuid"] for g in gpus if g["cdi"]} == {"GPU-sim-gpu-node-1-1"}


def test_serving_still_needs_the_extender() -> None:
    result = CliRunner().invoke(app, ["agent", "device-plugin", "--gpus", f"sim:{SIM}",
                                      "--node", "gpu-node-1"])
    assert result.exit_code == 2
    assert "--extender is required" in result.output
