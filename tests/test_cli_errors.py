"""Failures a user can cause: one line naming the fix, non-zero exit, no traceback."""

from __future__ import annotations

import errno
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
import yaml
from onnx import TensorProto, helper
from typer.testing import CliRunner

from extender.cluster.sim import DEFAULT_CLUSTER
from tandem.cli import app
from tandem.errors import explain

runner = CliRunner()


@pytest.fixture
def no_kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No kubeconfig anywhere and not inside a cluster."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    return {"KUBECONFIG": str(tmp_path / "missing-kubeconfig"), "HOME": str(tmp_path)}


@pytest.fixture
def quiet_config(tmp_path: Path) -> Path:
    """Loopback, no predictor (so no warning is logged before the failure)."""
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump({"server": {"host": "127.0.0.1"},
                                    "predictor": {"enabled": False}}))
    return file


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def one_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


@pytest.mark.parametrize("argv", [
    pytest.param(["extender", "serve"], id="serve"),
    pytest.param(["extender", "queue-gate", "--once"], id="queue-gate"),
])
def test_missing_kubeconfig_says_how_to_get_one(argv: list[str], no_kube: dict[str, str],
                                                quiet_config: Path) -> None:
    result = runner.invoke(app, [*argv, "--config", str(quiet_config)], env=no_kube)
    assert result.exit_code != 0
    line = one_line(result.output)
    assert "KUBECONFIG" in line and "--cluster sim:FILE" in line


def test_debug_lets_the_traceback_through(no_kube: dict[str, str], quiet_config: Path) -> None:
    result = runner.invoke(app, ["--debug", "extender", "serve", "--config", str(quiet_config)],
                           env=no_kube)
    assert result.exit_code != 0
    assert type(result.exception).__name__ == "ConfigException"


# cheroot drops the socket of a failed bind without closing it; the process exits right after.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_busy_port_fails_before_serving(busy_port: int, quiet_config: Path) -> None:
    result = runner.invoke(app, ["extender", "serve", "--config", str(quiet_config),
                                 "--cluster", f"sim:{DEFAULT_CLUSTER}",
                                 "--port", str(busy_port)])
    assert result.exit_code != 0
    line = one_line(result.output)  # in particular, no "serving" log line before it
    assert f"127.0.0.1:{busy_port}" in line and "--port" in line


def test_missing_predictor_artifacts_still_estimate_memory_and_name_the_path(
        tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    missing = tmp_path / "no-artifacts"
    result = runner.invoke(app, ["predictor", "predict", str(tmp_path / "m.onnx"),
                                 "--artifacts", str(missing)])
    assert result.exit_code == 0  # the memory estimate needs no trained model
    assert "gpu_util_percent unknown" in result.output
    assert str(missing) in result.output and "tandem predictor train" in result.output
    as_json = runner.invoke(app, ["predictor", "predict", str(tmp_path / "m.onnx"),
                                  "--artifacts", str(missing), "--json"])
    doc = json.loads(as_json.stdout)
    assert doc["gpu_util_percent"] is None and doc["source"] == "unknown+mem:no-overhead"


@pytest.mark.parametrize(("exc", "needle"), [
    (OSError(errno.EADDRINUSE, "cannot listen on 0.0.0.0:8443: Address already in use"),
     "choose another with --port"),
    (FileNotFoundError(errno.ENOENT, "No such file", "/x/y.yaml"), "/x/y.yaml"),
    (RuntimeError("boom\nsecond line"), "tandem --debug"),
])
def test_explain_gives_one_line(exc: BaseException, needle: str) -> None:
    text = explain(exc)
    assert needle in text and "\n" not in text
