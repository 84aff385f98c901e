"""``tandem demo`` end to end (real cheroot server on loopback, simulated cluster)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from extender.demo import demo_command, render, run_demo


def test_demo_places_mixed_pods_and_explains_rejections():
    result = run_demo()
    by_pod = {p["pod"]: p for p in result["placements"]}
    assert by_pod["train-resnet50"]["outcome"] == "placed"
    assert by_pod["train-gpt-small"]["node"] == "h100-node-1"  # only H100 has 60 GB free
    serving = {by_pod[n]["node"] + "/" + by_pod[n]["gpu_index"]
               for n in ("serve-resnet50", "serve-resnet50-b")}
    assert len(serving) == 1  # best fit packs sessions onto one serving GPU
    assert int(by_pod["serve-resnet50"]["batch"]) >= 1
    assert "tandem.io/gpu-util" in by_pod["train-typo"]["reason"]
    assert "GPU memory smaller" in by_pod["train-huge"]["reason"]
    summary = result["summary"]
    assert summary["pods_rejected"] == len(summary["rejected"]) >= 3
    for gpu in summary["gpus"]:
        training = any(by_pod[p]["workload"] == "training" for p in gpu["pods"])
        inference = any(by_pod[p]["workload"] == "inference" for p in gpu["pods"])
        assert not (training and inference)  # serving GPUs get no training jobs
    assert "REJECTED" in render(result)


def test_demo_cli_json():
    import typer

    app = typer.Typer()
    app.command()(demo_command)
    out = CliRunner().invoke(app, ["--json"])
    assert out.exit_code == 0
    doc = json.loads(out.stdout)
    assert set(doc) == {"placements", "summary", "agents", "elapsed_seconds"}
