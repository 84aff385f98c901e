"""``tandem plan``: the DESIGN.md ``--json`` keys, exit codes, errors with paths, Nexus files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli import app

DESIGN_EXAMPLE = {
    "gpu_types": {"titanx": {"memory_mib": 12288}},
    "profiles": [
        {
            "model": "A",
            "gpu_type": "titanx",
            "linear": {"alpha_ms": 3.125, "beta_ms": 37.5},
            "memory_mib": 500,
        },
        {
            "model": "B",
            "gpu_type": "titanx",
            "table": [[4, 50], [8, 90], [16, 125]],
            "memory_mib": 500,
        },
    ],
    "sessions": [
        {"name": "a", "model": "A", "slo_ms": 200, "rate_rps": 64},
        {"name": "b", "model": "B", "slo_ms": 250, "rate_rps": 32},
    ],
}

runner = CliRunner()


def _write(tmp_path: Path, doc: object, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc, encoding="utf-8")
    return path


def _run(*args: str):
    return runner.invoke(app, ["plan", *args])


def test_json_has_the_design_keys_and_every_session_is_served(tmp_path: Path) -> None:
    result = _run(str(_write(tmp_path, DESIGN_EXAMPLE)), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["gpu_count"] == len(out["gpus"]) == 1
    gpu = out["gpus"][0]
    assert {"gpu_type", "duty_cycle_ms", "occupancy", "sessions"} <= set(gpu)
    assert {s["name"] for s in gpu["sessions"]} == {"a", "b"}
    for s in gpu["sessions"]:
        assert {"name", "batch", "rate_rps"} <= set(s)
        assert s["worst_case_ms"] <= s["slo_ms"]


def test_table_output_lists_each_gpu(tmp_path: Path) -> None:
    result = _run(str(_write(tmp_path, DESIGN_EXAMPLE)))
    assert result.exit_code == 0
    assert result.stdout.startswith("GPUs: 1")
    assert "a b" in result.stdout


def test_unplaceable_session_exits_1_with_its_reason(tmp_path: Path) -> None:
    doc = {**DESIGN_EXAMPLE, "sessions": [{"name": "x", "model": "A", "slo_ms": 50, "rate_rps": 5}]}
    result = _run(str(_write(tmp_path, doc)), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["unplaced"][0]["reason"] == "SloTooTight"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("gpu_types: [unclosed", "not valid YAML"),
        ({"sessions": []}, "plan.gpu_types: required"),
        (
            {**DESIGN_EXAMPLE, "sessions": [{"name": "a", "model": "A", "slo_ms": -1}]},
            "sessions[0].slo_ms: must be > 0",
        ),
        (
            {**DESIGN_EXAMPLE, "profiles": [{"gpu_type": "titanx", "nexus_profile": "nope.txt"}]},
            "profiles[0].nexus_profile: cannot read nope.txt",
        ),
    ],
    ids=["not-yaml", "no-gpu-types", "negative-slo", "missing-nexus-file"],
)
def test_bad_files_exit_2_naming_the_file_and_path(tmp_path: Path, doc, expected: str) -> None:
    path = _write(tmp_path, doc)
    result = _run(str(path), "--json")
    assert result.exit_code == 2
    assert str(path) in result.stderr
    assert expected in result.stderr


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = _run(str(tmp_path / "absent.yaml"))
    assert result.exit_code == 2
    assert "cannot read" in result.stderr


def test_nexus_profile_key_loads_a_real_profile(tmp_path: Path, nexus_profiles_dir: Path) -> None:
    source = nexus_profiles_dir / "titanx-pascal_caffe_vgg_s_1.txt"
    (tmp_path / "vgg_s.txt").write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    doc = {
        "gpu_types": {"titanx": {"memory_mib": 12288}},
        "profiles": [{"gpu_type": "titanx", "nexus_profile": "vgg_s.txt"}],
        "sessions": [{"name": "cam", "model": "vgg_s", "slo_ms": 100, "rate_rps": 300}],
    }
    result = _run(str(_write(tmp_path, doc)), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    alloc = out["gpus"][0]["sessions"][0]
    assert alloc["name"] == "cam" and alloc["worst_case_ms"] <= 100


def test_corrupt_nexus_profile_is_a_problem_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_text(
        "caffe:x:1\nGPU\nForward latency\nbatch,latency(us),std(us),memory(B)\n1,abc\n"
    )
    doc = {**DESIGN_EXAMPLE, "profiles": [{"gpu_type": "titanx", "nexus_profile": "bad.txt"}]}
    result = _run(str(_write(tmp_path, doc)))
    assert result.exit_code == 2
    assert "profiles[0].nexus_profile: bad.txt:5" in result.stderr
