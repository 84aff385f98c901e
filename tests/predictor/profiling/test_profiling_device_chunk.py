"""The device procedure of the real campaign (device_chunk.sh), run without a GPU.

The script is what a GPU session runs, chunk after chunk, and device time is
scarce: it must run the profiler resumably, bring back only real (non-simulated)
GPU directories, and stay within what the device tool returns (8 files, 2
folders down). The ``sim:`` backend stands in for ``cuda`` through BACKEND.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = "predictor/profiling/campaigns/device_chunk.sh"
FAKE_SMI = ROOT / "tests" / "data" / "agent" / "fake_nvml_site"
SPEC = """
workloads: [training, inference]
batch_sizes: {training: [8], inference: [1]}
pairs: 2
triples: 1
measure: {warmup_seconds: 0.1, measure_seconds: 0.1, sample_interval_ms: 100}
"""


def _chunk(tmp: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    out.mkdir(exist_ok=True)
    full_env = {**os.environ, "OUT": str(out), "DATA_ROOT": str(tmp / "data"),
                "BACKEND": "sim:tests/data/profiling/sim-dryrun.yaml", "PYTHON": sys.executable,
                "PATH": f"{FAKE_SMI}{os.pathsep}{os.environ['PATH']}", **env}  # fmt: skip
    return subprocess.run(["bash", SCRIPT, "120", str(tmp / "spec.yaml")], cwd=ROOT,
                          env=full_env, capture_output=True, text=True, timeout=120)  # fmt: skip


def _returned(out: Path) -> list[Path]:
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())


def test_chunk_runs_resumably_and_returns_only_real_gpu_directories(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC)
    first = _chunk(tmp_path, tmp_path / "out1")
    assert first.returncode == 0, first.stdout + first.stderr
    summary = json.loads((tmp_path / "out1" / "summary.json").read_text())
    assert summary["state"] == "complete"
    log = (tmp_path / "out1" / "log.txt").read_text()
    assert log.startswith("NVIDIA H100 80GB HBM3, 81559 MiB")
    # The sim directory is test data: it never travels back as if measured.
    (gpu_dir,) = [p for p in (tmp_path / "data").iterdir() if p.is_dir()]
    assert _returned(tmp_path / "out1") == [Path("log.txt"), Path("summary.json")]

    # A second chunk resumes: nothing is measured twice.
    rows = (gpu_dir / "isolated.csv").read_text()
    second = _chunk(tmp_path, tmp_path / "out2")
    assert second.returncode == 0, second.stdout + second.stderr
    assert (gpu_dir / "isolated.csv").read_text() == rows


def test_real_directory_comes_back_within_the_device_limits(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for slug in ("nvidia-h100-80gb-hbm3", "nvidia-a100-sxm4-40gb"):
        gpu_dir = data / slug
        gpu_dir.mkdir(parents=True)
        (gpu_dir / "provenance.json").write_text(json.dumps({"simulated": False}, indent=2))
        for name in ("isolated.csv", "colocated.csv", "batching.csv"):
            (gpu_dir / name).write_text("model\n")
    other = data / "artifacts"  # no provenance: not a GPU directory
    other.mkdir()
    (other / "model.json").write_text("{}")
    (tmp_path / "spec.yaml").write_text(SPEC)
    # The profiler itself is not the point here: a script printing the summary of a run
    # that wrote the H100 directory stands in for it. The A100 directory is real data
    # already there (committed, say): it is not this chunk's and must not come back.
    fake = tmp_path / "fake_profiler"
    fake.write_text(f"#!/bin/sh\necho '{{\"gpu_dir\": \"{data}/nvidia-h100-80gb-hbm3\"}}'\n")
    fake.chmod(0o755)
    done = _chunk(tmp_path, tmp_path / "out", PYTHON=str(fake))
    assert done.returncode == 0, done.stdout + done.stderr
    returned = _returned(tmp_path / "out")
    assert [p for p in returned if p.parent != Path(".")] == [
        Path("nvidia-h100-80gb-hbm3") / n
        for n in ("batching.csv", "colocated.csv", "isolated.csv", "provenance.json")]
    assert len(returned) <= 8 and all(len(p.parts) <= 3 for p in returned)


def test_specs_share_the_budget_in_turn_and_each_is_summarised(tmp_path: Path) -> None:
    # The breadth-first chunk: a first spec with a few models, then the whole plan,
    # which resumes and measures only what the first did not.
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "first.yaml").write_text(SPEC.replace("pairs: 2", "models: [mlp]\npairs: 0")
                                         .replace("triples: 1", "triples: 0"))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "DATA_ROOT": str(tmp_path / "data"),
           "BACKEND": "sim:tests/data/profiling/sim-dryrun.yaml", "PYTHON": sys.executable,
           "PATH": f"{FAKE_SMI}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    done = subprocess.run(["bash", SCRIPT, "120", str(tmp_path / "first.yaml"),
                           str(tmp_path / "spec.yaml")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    first, whole = (json.loads(line) for line in (out / "summary.json").read_text().splitlines())
    assert first["isolated_run"] == 2 and first["colocated_run"] == 0
    assert whole["isolated_existing"] == 2 and whole["isolated_run"] > 0
    assert whole["colocated_run"] == 3
    log = (out / "log.txt").read_text()
    assert log.count("device_chunk: ") == 2

    # No budget left: the spec is named in the log and not started.
    again = subprocess.run(["bash", SCRIPT, "10", str(tmp_path / "spec.yaml")], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert again.returncode == 0
    assert "not started, 10s of the budget left" in (out / "log.txt").read_text()
    assert (out / "summary.json").read_text() == ""
