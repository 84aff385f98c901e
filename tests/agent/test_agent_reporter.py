"""Report JSON (the architecture contract), push with backoff, and token hygiene."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import httpx
import pytest

from agent.errors import ConfigError, ExtenderUnavailable, ReportRejected
from agent.node.gpus import GpuInfo, GpuSample, NodeSample, ProcessSample
from agent.node.reporter import BackoffPolicy, Reporter, TokenSource, build_report

TOKEN = "s3cr3t-t0ken-value"

SAMPLE = NodeSample(timestamp=1763700000.25, interval_seconds=1.0, gpus=(
    GpuSample(info=GpuInfo(0, "GPU-8c1b", "NVIDIA H100 80GB HBM3", 81559, False),
              memory_used_mib=10240, utilization_percent=37.5, memory_utilization_percent=12.0,
              power_watts=250.04, temperature_c=41, xid_errors=0, last_xid=0,
              processes=(ProcessSample(4242, 5120, "6f1c-uid", "abc", 30.125),
                         ProcessSample(77, None))),
    GpuSample(info=GpuInfo(1, "GPU-lost", "NVIDIA H100 80GB HBM3", 81559, False),
              memory_used_mib=None, utilization_percent=None, memory_utilization_percent=None,
              power_watts=None, temperature_c=None, xid_errors=None, lost=True),
))


def test_report_matches_the_contract_exactly() -> None:
    assert build_report("gpu-node-1", SAMPLE) == {
        "node": "gpu-node-1", "timestamp": 1763700000.25, "interval_seconds": 1.0,
        "gpus": [
            {"index": 0, "uuid": "GPU-8c1b", "product": "NVIDIA H100 80GB HBM3",
             "memory_total_mib": 81559, "memory_used_mib": 10240,
             "utilization_percent": 37.5, "memory_utilization_percent": 12.0,
             "power_watts": 250.0, "temperature_c": 41, "xid_errors": 0, "mig_mode": False,
             "processes": [
                 {"pid": 4242, "used_memory_mib": 5120, "pod_uid": "6f1c-uid",
                  "container_id": "abc", "utilization_percent": 30.12},
                 {"pid": 77, "used_memory_mib": None, "pod_uid": None, "container_id": None,
                  "utilization_percent": None}]},
            {"index": 1, "uuid": "GPU-lost", "product": "NVIDIA H100 80GB HBM3",
             "memory_total_mib": 81559, "memory_used_mib": None, "utilization_percent": None,
             "memory_utilization_percent": None, "power_watts": None, "temperature_c": None,
             "xid_errors": None, "mig_mode": False, "processes": []},
        ]}
    json.dumps(build_report("n", SAMPLE), allow_nan=False)  # strict JSON


class FakeRng(random.Random):
    """``random()`` returns a fixed value so jitter is exact."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(("jitter_draw", "expected"), [
    pytest.param(0.0, [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0], id="no-jitter-draw"),
    pytest.param(1.0, [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0], id="full-jitter-draw"),
])
def test_backoff_schedule(jitter_draw: float, expected: list[float]) -> None:
    policy = BackoffPolicy(initial_seconds=0.1, multiplier=2.0, max_seconds=2.0, jitter_ratio=0.5)
    delays = [policy.delay_seconds(k, FakeRng(jitter_draw)) for k in range(7)]
    assert delays == pytest.approx(expected)


@pytest.mark.parametrize("kwargs", [
    pytest.param({"initial_seconds": 0}, id="zero-initial"),
    pytest.param({"multiplier": 0.5}, id="shrinking"),
    pytest.param({"max_attempts": 0}, id="no-attempts"),
    pytest.param({"jitter_ratio": 1.5}, id="jitter-above-one"),
])
def test_backoff_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        BackoffPolicy(**kwargs)


class Clock:
    """Monotonic clock advanced by the fake sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def make_reporter(handler, clock: Clock, token: TokenSource, **backoff: float) -> Reporter:
    return Reporter("http://extender:8888", token, transport=httpx.MockTransport(handler),
                    backoff=BackoffPolicy(**{"jitter_ratio": 0.0, **backoff}), sleep=clock.sleep,
                    monotonic=lambda: clock.now, rng=random.Random(0))


def env_token() -> TokenSource:
    return TokenSource(environ={"TANDEM_AGENT_TOKEN": TOKEN})


def test_push_sends_bearer_token_and_json_body() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    attempts = make_reporter(handler, Clock(), env_token()).push({"node": "n"}, 1.0)
    assert attempts == 1
    assert seen[0].url == "http://extender:8888/v1/agents/report"
    assert seen[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert json.loads(seen[0].content) == {"node": "n"}


@pytest.mark.parametrize(("answers", "attempts", "sleeps"), [
    pytest.param([503, 200], 2, [0.1], id="5xx-then-ok"),
    pytest.param([429, 502, 200], 3, [0.1, 0.2], id="429-and-5xx-then-ok"),
    pytest.param(["down", "down", 200], 3, [0.1, 0.2], id="connect-errors-then-ok"),
])
def test_push_retries_transient_failures(answers: list, attempts: int,
                                         sleeps: list[float]) -> None:
    queue, clock = list(answers), Clock()

    def handler(request: httpx.Request) -> httpx.Response:
        answer = queue.pop(0)
        if answer == "down":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(answer)

    assert make_reporter(handler, clock, env_token()).push({}, 10.0) == attempts
    assert clock.sleeps == pytest.approx(sleeps)


def test_push_gives_up_at_max_attempts() -> None:
    clock = Clock()
    reporter = make_reporter(lambda r: httpx.Response(500), clock, env_token(), max_attempts=3)
    with pytest.raises(ExtenderUnavailable) as info:
        reporter.push({}, 100.0)
    assert (info.value.attempts, info.value.last_error) == (3, "HTTP 500")
    assert clock.sleeps == pytest.approx([0.1, 0.2])


def test_push_stops_at_the_interval_deadline() -> None:
    clock = Clock()
    reporter = make_reporter(lambda r: httpx.Response(503), clock, env_token(), max_attempts=10)
    with pytest.raises(ExtenderUnavailable) as info:
        reporter.push({}, 0.5)
    assert clock.sleeps == pytest.approx([0.1, 0.2])  # a third pause (0.4) would pass 0.5 s
    assert info.value.attempts == 3


@pytest.mark.parametrize("status", [400, 401, 403, 413])
def test_permanent_rejection_is_not_retried(status: int) -> None:
    clock = Clock()
    with pytest.raises(ReportRejected) as info:
        make_reporter(lambda r: httpx.Response(status), clock, env_token()).push({}, 10.0)
    assert info.value.status_code == status and clock.sleeps == []


def test_token_never_appears_in_logs_errors_or_reprs(caplog: pytest.LogCaptureFixture,
                                                     tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token = TokenSource(token_file)

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused {request.headers}", request=request)

    reporter = make_reporter(handler, Clock(), token, max_attempts=3)
    with caplog.at_level(logging.DEBUG), pytest.raises(ExtenderUnavailable) as info:
        reporter.push({}, 10.0)
    assert token.get() == TOKEN  # the file's trailing newline is stripped
    assert len(caplog.records) >= 2  # the retries were logged...
    text = caplog.text + " ".join(str(vars(r)) for r in caplog.records)
    for blob in (text, str(info.value), repr(info.value), repr(token), repr(reporter)):
        assert TOKEN not in blob  # ...without the token


@pytest.mark.parametrize(("content", "environ", "message"), [
    pytest.param(None, {}, "TANDEM_AGENT_TOKEN", id="nothing-configured"),
    pytest.param("  \n", {}, "empty", id="empty-file"),
])
def test_token_source_fails_at_start(tmp_path: Path, content: str | None,
                                     environ: dict[str, str], message: str) -> None:
    path = None
    if content is not None:
        path = tmp_path / "token"
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        TokenSource(path, environ=environ)


def test_token_file_is_reread_for_rotation(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old")
    token = TokenSource(path)
    path.write_text("new")
    assert token.get() == "new"
