"""The real-GPU capture procedure (benchmarks/agent_gpu_capture.sh), run without a GPU.

Device time is scarce, so the script a GPU session runs must work the first time.
Here it runs end to end against scripted GPUs: ``pynvml`` answers from the
FakeNvml fixture (tests/data/agent/fake_nvml_site/sitecustomize.py) and a fake
``nvidia-smi`` reports the same GPUs. The model load has no CUDA here, so it must
refuse to run on the CPU and the script must say so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "agent_gpu_capture_summary", ROOT / "benchmarks" / "agent_gpu_capture_summary.py")
assert _spec is not None and _spec.loader is not None
_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_summary)
metric, read_smi, summarise = _summary.metric, _summary.read_smi, _summary.summarise
SITE = ROOT / "tests" / "data" / "agent" / "fake_nvml_site"
FIXTURE = ROOT / "tests" / "data" / "agent" / "nvml_two_gpus.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path,
                                                                Path]:  # fmt: skip
    dest = tmp_path_factory.mktemp("capture")
    device_out = tmp_path_factory.mktemp("device_out")
    env = {**os.environ, "PATH": f"{SITE}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": f"{SITE}{os.pathsep}{ROOT / 'tests'}", "TANDEM_FAKE_NVML": str(FIXTURE),
           "PYTHON": sys.executable, "LOAD_SECONDS": "3", "WARMUP_SECONDS": "2",
           "METRICS_PORT": str(_free_port()), "DEVICE_OUT": str(device_out),
           "NODE_NAME": "capture-test"}  # fmt: skip
    proc = subprocess.run(["bash", "benchmarks/agent_gpu_capture.sh", str(dest)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    return proc, dest, device_out


def test_a_load_without_cuda_is_refused_and_is_the_only_failure(capture) -> None:
    proc, dest, _ = capture
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = (dest / "errors.txt").read_text().splitlines()
    assert errors == ["load: exit 1"]
    assert "no GPU load" in (dest / "load.log").read_text()


def test_report_metrics_and_nvidia_smi_line_up(capture) -> None:
    _, dest, _ = capture
    summary = json.loads((dest / "summary.json").read_text())
    first, second = summary["gpus"]
    # The fixture's NVML answers, through the agent's report and its dcgm-style gauges.
    assert first["agent_report_memory_used_mib"] == 10240
    assert first["metrics_DCGM_FI_DEV_FB_USED"] == 10240.0
    assert first["nvidia_smi_memory_used_mib"] == [10240.0, 10240.0]
    assert first["nvidia_smi_compute_pids"] == [101, 104]
    assert [p["pid"] for p in first["agent_processes"]] == [101, 104]
    assert first["metrics_DCGM_FI_DEV_GPU_UTIL"] == first["agent_report_util_percent"]
    assert second["agent_processes"] == [] and second["nvidia_smi_compute_pids"] == []
    assert summary["all_agree"] is True
    # The load ran (and refused the CPU) but was never a GPU process.
    assert summary["load_pid"] is not None and summary["load_attributed_to_gpu"] is None


def test_agent_stops_cleanly_and_the_gpu_test_ran(capture) -> None:
    _, dest, _ = capture
    assert "agent exit on SIGTERM: 0" in (dest / "agent-stderr.log").read_text()
    assert "1 passed" in (dest / "pytest-gpu.txt").read_text()
    once = json.loads((dest / "report-once.json").read_text())
    assert [g["uuid"][:12] for g in once["gpus"]] == ["GPU-11111111", "GPU-66666666"]


def test_device_bundle_fits_what_the_device_tool_brings_back(capture) -> None:
    _, dest, device_out = capture
    files = sorted(p.name for p in device_out.iterdir())
    assert files == ["agent_gpu_capture.tar.gz", "agent_gpu_capture_summary.json"]
    with tarfile.open(device_out / "agent_gpu_capture.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {p.name for p in dest.iterdir()} <= names | {"summary.json"}
    assert {"report-during.json", "metrics-during.txt", "nvidia-smi-during.csv"} <= names


def test_summary_flags_disagreement_and_unattributed_processes(tmp_path: Path) -> None:
    header = ("timestamp, index, uuid, name, memory.total [MiB], memory.used [MiB], "
              "utilization.gpu [%]")  # fmt: skip
    (tmp_path / "nvidia-smi-during.csv").write_text(
        f"{header}\n2026/11/21 17:00:00.000, 0, GPU-a, H100, 81559, 20000, 95\n")
    (tmp_path / "compute-apps-during.csv").write_text(
        "pid, gpu_uuid, used_memory [MiB]\n7, GPU-a, 19000\n")
    (tmp_path / "load.log").write_text("pid 7\nload: torch\n")
    report = {"gpus": [{"index": 0, "uuid": "GPU-a", "product": "H100",
                        "utilization_percent": 40.0, "memory_used_mib": 20100,
                        "processes": []}]}  # fmt: skip
    (tmp_path / "report-during.json").write_text(json.dumps(report))
    gpu = summarise(tmp_path)["gpus"][0]
    assert gpu["util_outside_smi_range_points"] == 55.0
    assert gpu["memory_outside_smi_range_mib"] == 100.0
    assert gpu["agent_pids_match_nvidia_smi"] is False
    assert gpu["agrees"] is False


def test_smi_and_metric_parsing(tmp_path: Path) -> None:
    (tmp_path / "smi.csv").write_text("index, utilization.gpu [%]\n0, 5\n1, [N/A]\n")
    rows = read_smi(tmp_path / "smi.csv")
    assert rows == [{"index": "0", "utilization.gpu [%]": "5"},
                    {"index": "1", "utilization.gpu [%]": "[N/A]"}]  # fmt: skip
    text = ('DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b"} 7.0\n'
            'DCGM_FI_DEV_GPU_UTIL{gpu="10",UUID="GPU-c"} 9.0\n')
    assert metric(text, "DCGM_FI_DEV_GPU_UTIL", 1) == 7.0
    assert metric(text, "DCGM_FI_DEV_GPU_UTIL", 0) is None

