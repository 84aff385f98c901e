"""Shutdown of the inference server: the runtime answers everything it holds with a
503 ``shutdown``, and ``tandem agent serve`` exits 0 on SIGTERM (a real process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from agent.inference.clock import MonotonicClock
from agent.inference.errors import DropReason, ServerStopping
from agent.inference.executors.executors import SimExecutor
from agent.inference.http.app import create_app
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from predictor.batching import BatchingProfile

TANDEM = Path(sys.executable).with_name("tandem")
TOKEN = "shutdown-test-token"
SESSION = {"name": "s", "model": "tiny", "slo_ms": 2000, "rate_rps": 100}
EXIT_SECONDS = 8.0  # generous on a busy 2-core machine; the old code never exited
PROFILES = """\
profiles:
  - {model: tiny, gpu_type: sim, max_batch: 32, linear: {alpha_ms: 0.01, beta_ms: 0.05}}
"""


def make_runtime() -> ServingRuntime:
    clock = MonotonicClock()
    profiles = {
        "tiny": BatchingProfile.linear("tiny", "sim", 0.01, 0.05, max_batch=32),
        "heavy": BatchingProfile.linear("heavy", "sim", 5.0, 10.0, max_batch=8),
    }
    return ServingRuntime(SimExecutor(profiles, clock, "sim"), clock,
                          RuntimeConfig("sim", quantum_ms=1.0), post_workers=1)


def x() -> np.ndarray:
    return np.ones((1, 4), np.float32)


# ---- the runtime ------------------------------------------------------------------------

def test_queued_requests_are_answered_with_shutdown() -> None:
    rt = make_runtime()  # not started: requests stay queued until stop
    rt.add_slo_session("s", "tiny", 2000, 100)
    futures = [rt.submit_future("s", x()) for _ in range(3)]
    rt.stop()
    assert [f.result(timeout=5).reason for f in futures] == [DropReason.SHUTDOWN] * 3
    (entry,) = rt.snapshot()["sessions"]
    assert entry["drop_reasons"] == {"shutdown": 3}


def test_a_best_effort_job_between_segments_is_answered_with_shutdown() -> None:
    rt = make_runtime()
    rt.add_best_effort_session("be", "heavy")
    future = rt.submit_future("be", x())
    assert rt.step()  # the first segment of a ~15 ms job in 1 ms quanta
    assert not future.done()
    rt.stop()
    assert future.result(timeout=5).reason is DropReason.SHUTDOWN


def test_after_stop_requests_are_answered_at_once_and_sessions_refused() -> None:
    rt = make_runtime()
    rt.start()
    rt.add_slo_session("s", "tiny", 2000, 100)
    rt.stop()
    assert rt.submit_future("s", x()).result(timeout=1).reason is DropReason.SHUTDOWN
    with pytest.raises(ServerStopping):
        rt.add_slo_session("t", "tiny", 2000, 100)
    rt.remove_session("s")  # still answers, with no loop and no worker pool
    rt.stop()  # idempotent


def test_http_answers_during_shutdown_are_503_with_a_reason() -> None:
    rt = make_runtime()
    rt.start()
    client = create_app(rt).test_client()
    assert client.post("/v1/sessions", json=SESSION).status_code == 201
    rt.stop()
    infer = client.post("/v1/sessions/s/infer", json={"inputs": {"x": x().tolist()}})
    assert (infer.status_code, infer.json["reason"]) == (503, "shutdown")
    added = client.post("/v1/sessions", json={**SESSION, "name": "t"})
    assert (added.status_code, added.json["error"]) == (503, "ServerStopping")
    assert client.get("/readyz").status_code == 503


# ---- the real process -------------------------------------------------------------------

@dataclass
class Process:
    """A ``tandem`` child and the JSON event it announced on start."""

    popen: subprocess.Popen[str]
    started: dict

    def terminate_and_wait(self) -> int:
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=5)
            raise AssertionError(f"no exit within {EXIT_SECONDS} s of SIGTERM") from None


def spawn(args: list[str], event: str, stream: str) -> Process:
    """Start ``tandem ARGS`` and read lines until its ``event`` JSON line (bounded)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TANDEM_ADMIN_TOKEN", None)
    popen = subprocess.Popen([str(TANDEM), *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    pipe = popen.stdout if stream == "stdout" else popen.stderr
    assert pipe is not None
    seen = []
    for _ in range(200):  # a few log lines come before the event
        line = pipe.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("{") and json.loads(line).get("event") == event:
            return Process(popen, json.loads(line))
    popen.kill()
    _, err = popen.communicate(timeout=5)
    raise AssertionError(f"no {event!r} event; output: {''.join(seen)}{err}")


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Process]:
    if not TANDEM.is_file():
        pytest.skip("the tandem console script is not installed beside this Python")
    (tmp_path / "profiles.yaml").write_text(PROFILES)
    (tmp_path / "token").write_text(TOKEN)
    proc = spawn(["agent", "serve", "--executor=sim", f"--profiles={tmp_path}/profiles.yaml",
                  "--gpu-type=sim", "--port=0", "--threads=64", "--post-workers=1",
                  f"--admin-token-file={tmp_path}/token"], "serving", "stderr")
    yield proc
    if proc.popen.poll() is None:
        proc.popen.kill()
        proc.popen.wait(timeout=5)
    for pipe in (proc.popen.stdout, proc.popen.stderr):
        if pipe is not None:
            pipe.close()


def test_serve_exits_0_on_sigterm_after_serving(server: Process) -> None:
    base = f"http://127.0.0.1:{server.started['port']}"
    assert server.started["admin_auth"] is True
    with httpx.Client(base_url=base, timeout=10) as http:
        assert http.get("/readyz").status_code == 200
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert http.post("/v1/sessions", json=SESSION).status_code == 401
        # A modest rate: this test is about shutdown; a server started on a starved host
        # may refuse 100 requests/s from its start-up path figures (seen once in CI-like runs).
        added = http.post("/v1/sessions", json={**SESSION, "rate_rps": 5}, headers=auth)
        assert added.status_code == 201, added.text
        answer = http.post("/v1/sessions/s/infer", json={"inputs": {"x": x().tolist()}})
        assert answer.status_code == 200 and answer.json()["outputs"] == [x().tolist()]
    assert server.terminate_and_wait() == 0
    assert server.popen.stderr is not None
    tail = server.popen.stderr.read()
    assert '"event": "stopped"' in tail and '"reason": "signal"' in tail


def test_session_process_exits_0_on_sigterm_and_deregisters(
    server: Process, tmp_path: Path,
) -> None:
    base = f"http://127.0.0.1:{server.started['port']}"
    session = spawn(["agent", "session", "--model=tiny", "--name=default.web-1",
                     "--slo-ms=2000", "--rate-rps=100", f"--server={base}", "--listen=0",
                     "--listen-host=127.0.0.1", "--check-interval-seconds=0.1",
                     "--shutdown-delay-seconds=0", f"--admin-token-file={tmp_path}/token"],
                    "session serving", "stdout")
    try:
        with httpx.Client(timeout=10) as http:
            ready = f"http://127.0.0.1:{session.started['port']}/readyz"
            for _ in range(100):  # the checker registers within a few 0.1 s periods
                if http.get(ready).status_code == 200:
                    break
                threading_wait(0.05)
            assert http.get(ready).status_code == 200, http.get(ready).json()
            listed = http.get(f"{base}/v1/sessions").json()["sessions"]
            assert [s["name"] for s in listed] == ["default.web-1"]
            assert session.terminate_and_wait() == 0
            assert http.get(f"{base}/v1/sessions").json()["sessions"] == []
    finally:
        if session.popen.poll() is None:
            session.popen.kill()
        session.popen.communicate(timeout=5)
    assert server.terminate_and_wait() == 0


def threading_wait(seconds: float) -> None:
    import threading

    threading.Event().wait(seconds)
