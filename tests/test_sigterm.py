"""Every long-running tandem server exits 0 within its grace period of SIGTERM (real processes).

The inference server (``tandem agent serve``) and the session proxy (``tandem agent
session``) are covered the same way in tests/test_server_shutdown.py; here are the
others: the extender (simulated and against a loopback API server), the admission
webhook (which once stayed up until SIGKILL), the node agent, the device plugin and
the queue gate.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_modules import fake_kube_api

ROOT = Path(__file__).resolve().parents[1]
TANDEM = Path(sys.executable).with_name("tandem")
SIM_GPUS = ROOT / "tests" / "data" / "agent" / "sim_cluster.yaml"
EXIT_SECONDS = 10.0
"""Well inside the 30 s terminationGracePeriodSeconds of manifests/, on a busy 2-core machine."""
START_SECONDS = 60.0


def _kubeconfig(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
    return path


@pytest.fixture()
def api() -> Iterator[str]:
    server = fake_kube_api.FakeKubeApi()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def _run_until_ready_then_term(args: list[str], ready: str, env: dict[str, str]) -> tuple[
        int, float, list[str]]:
    """Start ``tandem ARGS``, wait for the log line whose msg is ``ready``, send SIGTERM;
    (exit code, seconds from SIGTERM to exit, stderr lines)."""
    if not TANDEM.is_file():
        pytest.skip("the tandem console script is not installed beside this Python")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    popen = subprocess.Popen([str(TANDEM), *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=full_env)
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert popen.stderr is not None
        for line in popen.stderr:
            lines.append(line)
            if line.startswith("{") and json.loads(line).get("msg") == ready:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not seen.wait(START_SECONDS):
            raise AssertionError(f"no {ready!r} line; stderr: {''.join(lines)}")
        popen.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            code = popen.wait(timeout=EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{args[:2]} still running {EXIT_SECONDS} s after SIGTERM; "
                                 f"stderr: {''.join(lines)}") from None
        took = time.monotonic() - sent
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(timeout=5)
        reader.join(timeout=5)
        if popen.stderr is not None:
            popen.stderr.close()
    return code, took, lines


def _assert_clean(code: int, took: float, lines: list[str], last: str) -> None:
    assert code == 0, "".join(lines)
    assert took < EXIT_SECONDS
    messages = [json.loads(line)["msg"] for line in lines]  # every line is JSON
    assert last in messages, messages


def test_webhook_exits_on_sigterm() -> None:
    result = _run_until_ready_then_term(["extender", "webhook", "--port", "0"],
                                        "webhook serving", {})
    _assert_clean(*result, "webhook stopped")


def test_simulated_extender_exits_on_sigterm() -> None:
    result = _run_until_ready_then_term(
        ["extender", "serve", "--cluster", f"sim:{ROOT / 'extender' / 'demo_cluster.yaml'}",
         "--port", "0"], "serving", {})
    _assert_clean(*result, "shutting down: server stopped")


def test_kube_extender_exits_on_sigterm(api: str, tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(_kubeconfig(tmp_path, api)), "POD_NAMESPACE": "tandem-system",
           "TANDEM_SIGNING_KEY": "sigterm-test-signing-key-0123456",
           "TANDEM_AGENT_TOKEN": "agent-token"}
    result = _run_until_ready_then_term(["extender", "serve", "--port", "0"], "serving", env)
    _assert_clean(*result, "shutting down: server stopped")


def test_queue_gate_exits_on_sigterm(api: str, tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(_kubeconfig(tmp_path, api)), "POD_NAMESPACE": "tandem-system"}
    result = _run_until_ready_then_term(
        ["extender", "queue-gate", "--metrics-port", "0", "--interval-seconds", "0.2"],
        "queue gate running", env)
    _assert_clean(*result, "queue gate stopped")


def test_agent_exits_on_sigterm() -> None:
    result = _run_until_ready_then_term(
        ["agent", "run", f"--gpus=sim:{SIM_GPUS}", "--node=gpu-node-1", "--metrics-port=0",
         "--no-sessions", "--interval-seconds=0.2"], "agent started", {})
    _assert_clean(*result, "agent stopped")


def test_device_plugin_exits_on_sigterm(tmp_path: Path) -> None:
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    result = _run_until_ready_then_term(
        ["agent", "device-plugin", "--extender=http://127.0.0.1:9", f"--gpus=sim:{SIM_GPUS}",
         "--node=gpu-node-1", f"--plugin-dir={plugins}",
         f"--pod-resources-socket={tmp_path / 'kubelet.sock'}"],
        "device plugin started", {"TANDEM_AGENT_TOKEN": "agent-token"})
    _assert_clean(*result, "device plugin stopped")
