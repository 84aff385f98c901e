"""The session process (``tandem agent session``) against the real inference server app.

The server is ``agent.inference.http.app.create_app`` over a sim-executor runtime, reached
through httpx's WSGI transport (a swappable app stands in for a server restart)
or, for the network paths, over loopback cheroot. The proxy's own HTTP side runs
on loopback cheroot where the wire matters and as a Flask test client elsewhere.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from agent.node.extender_view import PodPlacement
from agent.node.sessions import session_spec
from agent.session.http import ProxyConfig, ProxyServer, create_proxy_app
from agent.session.proxy import (
    ProxyConfigError,
    SessionLink,
    SessionRequest,
    parse_gpu_index,
    server_url,
    session_request,
)
from lab.fakes.session_upstream import SLO, Loopback, Upstream

NPY = "application/x-npy"
SERVER = "http://node-local:8700"


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.runtime.stop()


def link_to(up: Upstream, session: SessionRequest = SLO) -> SessionLink:
    return SessionLink(SERVER, session, transport=httpx.WSGITransport(app=up))


@pytest.fixture
def link(upstream: Upstream) -> Iterator[SessionLink]:
    ln = link_to(upstream)
    yield ln
    ln.close()


@pytest.fixture
def proxy(link: SessionLink) -> Any:
    return create_proxy_app(link, ProxyConfig(max_body_bytes=4096)).test_client()


# ---- the session's identity agrees with the agent's session sync ---------------------

@pytest.mark.parametrize(("kwargs", "annotations"), [
    pytest.param({"slo_ms": 100.0, "rate_rps": 200.0},
                 {"tandem.io/slo-ms": "100", "tandem.io/rate-rps": "200"}, id="slo"),
    pytest.param({"weight": 3}, {"tandem.io/weight": "3"}, id="weight"),
    pytest.param({"priority": 2}, {"tandem.io/priority": "2"}, id="priority"),
    pytest.param({}, {}, id="default-weight"),
    # Flags come from the annotations, so a mix binds and the agent registers one mode.
    pytest.param({"slo_ms": 50.0, "rate_rps": 5.0, "weight": 2},
                 {"tandem.io/slo-ms": "50", "tandem.io/rate-rps": "5", "tandem.io/weight": "2"},
                 id="slo-wins-over-weight"),
    pytest.param({"weight": 2, "priority": 1}, {"tandem.io/weight": "2", "tandem.io/priority": "1"},
                 id="priority-wins-over-weight"),
])
def test_body_and_name_equal_what_the_agent_registers(kwargs: dict, annotations: dict) -> None:
    ours = session_request("team-a.web-7d9f-x2", "m.onnx", 1, **kwargs)
    notes = {"tandem.io/workload": "inference", "tandem.io/model": "m.onnx", **annotations}
    agents = session_spec(PodPlacement("uid", "web-7d9f-x2", "team-a", 1, None, None,
                                       tuple(notes.items())))
    assert (ours.name, ours.json()) == (agents.name, agents.json())


@pytest.mark.parametrize("kwargs", [
    pytest.param({"name": "nodot"}, id="name-without-namespace"),
    pytest.param({"name": "Default.web"}, id="namespace-not-dns-label"),
    pytest.param({"name": "default."}, id="empty-pod"),
    pytest.param({"model": ""}, id="empty-model"),
    pytest.param({"slo_ms": 50.0}, id="slo-without-rate"),
    pytest.param({"rate_rps": 5.0}, id="rate-without-slo"),
    pytest.param({"weight": 5000}, id="weight-over-quanta-limit"),
    pytest.param({"slo_ms": -1.0, "rate_rps": 5.0}, id="negative-slo"),
    pytest.param({"weight": 0}, id="zero-weight"),
])
def test_invalid_session_flags_are_config_errors(kwargs: dict) -> None:
    args = {"name": "default.web", "model": "m.onnx", **kwargs}
    with pytest.raises(ProxyConfigError):
        session_request(args.pop("name"), args.pop("model"), 0, **args)


@pytest.mark.parametrize(("value", "index"), [("0", 0), ("3", 3), (" 7", 7)])
def test_gpu_index_from_the_annotation(value: str, index: int) -> None:
    assert parse_gpu_index(value) == index


@pytest.mark.parametrize("value", [None, "", "0,1", "x", "-1"],
                         ids=["unset", "empty", "two-gpus", "not-a-number", "negative"])
def test_gpu_index_must_be_exactly_one_gpu(value: str | None) -> None:
    with pytest.raises(ProxyConfigError):
        parse_gpu_index(value)


@pytest.mark.parametrize(("host", "index", "url"), [
    ("10.0.0.5", 0, "http://10.0.0.5:8700"),
    ("10.0.0.5", 3, "http://10.0.0.5:8703"),
    ("fd00::5", 1, "http://[fd00::5]:8701"),
])
def test_server_url_is_the_nodes_port_for_the_gpu(host: str, index: int, url: str) -> None:
    assert server_url(host, index) == url


# ---- registration --------------------------------------------------------------------

def test_registers_once_and_checks_are_idempotent(upstream: Upstream, link: SessionLink) -> None:
    assert link.state.registered is False
    for _ in range(3):
        state = link.ensure()
    assert state.registered and state.server_reachable and state.reason is None
    assert state.registrations == 1 and upstream.posts == 1
    entry = upstream.entry(SLO.name)
    assert (entry["model"], entry["slo_ms"], entry["rate_rps"]) == ("tiny", 2000.0, 100.0)


def test_session_the_agent_registered_first_is_adopted(upstream: Upstream,
                                                       link: SessionLink) -> None:
    with httpx.Client(transport=httpx.WSGITransport(app=upstream)) as agent:
        assert agent.post(f"{SERVER}/v1/sessions", json=SLO.json()).status_code == 201
    state = link.ensure()
    assert state.registered and state.registrations == 0
    assert upstream.names() == [SLO.name] and upstream.posts == 1


@pytest.mark.parametrize(("session", "status", "kind"), [
    pytest.param(session_request("default.a", "missing", 0, weight=1), 422, "ModelRejected",
                 id="unknown-model"),
    pytest.param(session_request("default.b", "heavy", 0, slo_ms=100, rate_rps=10), 409,
                 "AdmissionRefused", id="slo-too-tight"),
])
def test_refused_registration_is_not_ready_with_the_servers_reason(
    upstream: Upstream, session: SessionRequest, status: int, kind: str
) -> None:
    ln = link_to(upstream, session)
    state = ln.ensure()
    assert not state.registered and state.server_reachable
    assert str(status) in (state.reason or "") and kind in (state.reason or "")
    ready = create_proxy_app(ln, ProxyConfig()).test_client().get("/readyz")
    assert ready.status_code == 503 and kind in ready.json["reason"]
    assert upstream.names() == []
    ln.close()


# ---- forwarding -----------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/infer", f"/v1/sessions/{SLO.name}/infer"])
def test_forwards_npy_and_json(upstream: Upstream, link: SessionLink, proxy: Any,
                               path: str) -> None:
    link.ensure()
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    answer = proxy.post(path, data=npy(x), content_type=NPY)
    assert answer.status_code == 200, answer.data
    assert answer.mimetype == NPY and float(answer.headers["X-Tandem-Latency-Ms"]) >= 0
    assert np.array_equal(np.load(io.BytesIO(answer.data)), x)  # the sim executor echoes
    answer = proxy.post(path, json={"inputs": {"x": [[1.0, 2.0]]}})
    assert answer.status_code == 200 and answer.json["outputs"] == [[[1.0, 2.0]]]
    assert upstream.entry(SLO.name)["served"] == 2


def test_forwards_what_is_left_of_the_deadline(upstream: Upstream, link: SessionLink,
                                               proxy: Any) -> None:
    link.ensure()
    x = npy(np.ones((1, 2), np.float32))
    # What is forwarded is the budget less the time spent here and less the hop's answer
    # reserve (learned from earlier answers' writes, each inside an earlier call): bounded
    # by the calls' times measured around them, not by a fixed allowance a busy machine
    # can exceed.
    began = time.monotonic()
    answer = proxy.post("/infer", data=x, content_type=NPY,
                        headers={"X-Tandem-Timeout-Ms": "500", "X-Tandem-Late": "accept"})
    first_ms = spent_ms = (time.monotonic() - began) * 1000
    assert answer.status_code == 200
    sent = upstream.infer_environs[-1]
    assert max(0.0, 500 - spent_ms) <= float(sent["HTTP_X_TANDEM_TIMEOUT_MS"]) <= 500
    assert sent["HTTP_X_TANDEM_LATE"] == "accept"
    # Without a client budget, the session's SLO (2000 ms) is the budget forwarded.
    began = time.monotonic()
    proxy.post("/infer", data=x, content_type=NPY)
    spent_ms = (time.monotonic() - began) * 1000
    forwarded = float(upstream.infer_environs[-1]["HTTP_X_TANDEM_TIMEOUT_MS"])
    assert 2000 - spent_ms - first_ms <= forwarded <= 2000
    # A request that waited past its deadline here is not forwarded at all.
    forwarded = len(upstream.infer_environs)
    late = proxy.post("/infer", data=x, content_type=NPY,
                      environ_base={"tandem.arrived": time.monotonic() - 5.0})
    assert late.status_code == 503 and late.json["reason"] == "deadline_expired"
    assert len(upstream.infer_environs) == forwarded


def test_drop_passes_through_with_its_reason() -> None:
    up = Upstream(max_queue=0)  # every request is dropped: queue_full
    ln = link_to(up)
    try:
        ln.ensure()
        client = create_proxy_app(ln, ProxyConfig()).test_client()
        answer = client.post("/infer", data=npy(np.ones((1, 2), np.float32)), content_type=NPY)
        assert answer.status_code == 503
        assert answer.json == {"error": "RequestDropped", "reason": "queue_full",
                               "message": "request dropped: queue_full"}
    finally:
        ln.close()
        up.runtime.stop()


@pytest.mark.parametrize(("path", "kwargs", "status", "kind"), [
    pytest.param("/infer", {"data": b"\x00" * 5000, "content_type": NPY}, 413,
                 "PayloadTooLarge", id="body-over-limit"),
    pytest.param("/v1/sessions/default.other/infer", {"data": b"", "content_type": NPY}, 404,
                 "SessionNotFound", id="another-sessions-path"),
    pytest.param("/infer", {"data": b"garbage", "content_type": NPY}, 400, "BadRequest",
                 id="bad-npy-from-server"),
    pytest.param("/infer", {"data": b"x", "content_type": "text/plain"}, 400, "BadRequest",
                 id="wrong-content-type-from-server"),
    pytest.param("/infer", {"data": b"{", "content_type": "application/json"}, 400,
                 "BadRequest", id="malformed-json-from-server"),
])
def test_bad_input_gets_a_clear_error_and_changes_nothing(
    upstream: Upstream, link: SessionLink, proxy: Any, path: str, kwargs: dict, status: int,
    kind: str,
) -> None:
    link.ensure()
    answer = proxy.post(path, **kwargs)
    assert answer.status_code == status and answer.json["error"] == kind, answer.data
    ok = proxy.post("/infer", data=npy(np.zeros((1, 2), np.float32)), content_type=NPY)
    assert ok.status_code == 200
    assert upstream.entry(SLO.name)["served"] == 1 and link.state.registrations == 1


def test_only_post_infers(proxy: Any) -> None:
    assert proxy.get("/infer").status_code == 405


# ---- server restarts and shutdown -------------------------------------------------------

def test_request_after_server_restart_registers_again_and_succeeds(
    upstream: Upstream, link: SessionLink, proxy: Any
) -> None:
    link.ensure()
    upstream.restart()
    assert upstream.names() == []
    answer = proxy.post("/infer", data=npy(np.ones((1, 3), np.float32)), content_type=NPY)
    assert answer.status_code == 200, answer.data
    assert upstream.names() == [SLO.name] and link.state.registrations == 2


def test_periodic_check_registers_again_without_traffic(upstream: Upstream,
                                                        link: SessionLink) -> None:
    link.ensure()
    upstream.restart()
    state = link.ensure()
    assert state.registered and state.registrations == 2 and upstream.names() == [SLO.name]


def test_unregistered_session_is_not_retried_forever(upstream: Upstream) -> None:
    ln = link_to(upstream, session_request("default.a", "missing", 0, weight=1))
    client = create_proxy_app(ln, ProxyConfig()).test_client()
    answer = client.post("/infer", data=npy(np.ones((1, 2), np.float32)), content_type=NPY)
    assert answer.status_code == 404 and answer.json["error"] == "SessionNotFound"
    assert upstream.posts == 1  # one registration attempt, one retry of the request
    ln.close()


def test_end_to_end_over_loopback_then_clean_shutdown_deregisters(upstream: Upstream) -> None:
    backend = Loopback(upstream)
    ln = SessionLink(backend.url, SLO)
    config = ProxyConfig(listen_host="127.0.0.1", listen_port=0, check_interval_seconds=0.05,
                         shutdown_delay_seconds=0.0, http_threads=2)
    proxy = ProxyServer(ln, config)
    proxy.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{proxy.port}", timeout=10) as http:
            ready = http.get("/readyz")
            for _ in range(200):  # the checker registers within a few of its 50 ms periods
                if ready.status_code == 200:
                    break
                threading.Event().wait(0.02)
                ready = http.get("/readyz")
            assert ready.status_code == 200, ready.json()
            assert http.get("/livez").json() == {"status": "ok"}
            x = np.ones((1, 3), np.float32)
            answer = http.post("/infer", content=npy(x), headers={"Content-Type": NPY})
            assert answer.status_code == 200
            assert np.array_equal(np.load(io.BytesIO(answer.content)), x)
            proxy.draining.set()
            assert http.get("/readyz").json()["reason"] == "draining"
        proxy.shutdown()
        assert upstream.names() == []
        assert ln.state.registered is False
        ln.ensure()  # a check that comes late must not register it again
        assert upstream.names() == []
    finally:
        backend.stop()


def test_server_down_is_502_and_not_ready(upstream: Upstream) -> None:
    backend = Loopback(upstream)
    ln = SessionLink(backend.url, SLO)
    try:
        assert ln.ensure().registered
        backend.stop()
        client = create_proxy_app(ln, ProxyConfig()).test_client()
        answer = client.post("/infer", data=npy(np.ones((1, 2), np.float32)), content_type=NPY)
        assert answer.status_code == 502 and answer.json["error"] == "ServerUnavailable"
        assert client.get("/readyz").status_code == 503
        state = ln.ensure()
        assert not state.registered and not state.server_reachable
        assert ln.deregister() is False  # shutdown still completes
    finally:
        ln.close()


@pytest.mark.parametrize("kwargs", [
    pytest.param({"listen_port": 70000}, id="port"),
    pytest.param({"max_body_bytes": 0}, id="body-limit"),
    pytest.param({"check_interval_seconds": 0.0}, id="check-interval"),
    pytest.param({"shutdown_delay_seconds": -1.0}, id="shutdown-delay"),
])
def test_invalid_proxy_config(kwargs: dict) -> None:
    with pytest.raises(ProxyConfigError):
        ProxyConfig(**kwargs)


@pytest.mark.parametrize(("env", "args", "message"), [
    pytest.param({"POD_NAME": "web", "POD_NAMESPACE": "default", "TANDEM_GPU_INDEX": ""},
                 ["--model=m.onnx"], "tandem.io/gpu-index", id="pod-bypassed-tandem"),
    pytest.param({"POD_NAME": "web", "POD_NAMESPACE": "default", "TANDEM_GPU_INDEX": "0,1"},
                 ["--model=m.onnx"], "exactly one GPU", id="two-gpus"),
    pytest.param({"TANDEM_GPU_INDEX": "0", "TANDEM_SERVER_HOST": "10.0.0.1"},
                 ["--model=m.onnx"], "<namespace>.<pod>", id="no-pod-name"),
    pytest.param({"POD_NAME": "web", "POD_NAMESPACE": "default", "TANDEM_GPU_INDEX": "0",
                  "TANDEM_SLO_MS": "50"}, ["--model=m.onnx"], "--rate-rps", id="slo-only"),
])
def test_cli_session_refuses_a_bad_pod_spec_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, env: dict, args: list[str], message: str
) -> None:
    from typer.testing import CliRunner

    from agent.commands import app

    monkeypatch.setattr("contracts.logs.setup_logging", lambda **_: None)
    for key in ("POD_NAME", "POD_NAMESPACE", "TANDEM_SESSION_NAME", "TANDEM_MODEL",
                "TANDEM_SLO_MS", "TANDEM_RATE_RPS", "TANDEM_WEIGHT", "TANDEM_PRIORITY",
                "TANDEM_SERVER_URL", "TANDEM_SERVER_HOST", "TANDEM_GPU_INDEX"):
        monkeypatch.delenv(key, raising=False)
    result = CliRunner().invoke(app, ["session", *args], env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output


# ---- the example Deployment configures exactly the session the agent registers ----------

def test_example_deployment_runs_the_session_the_agent_would_register(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    import yaml

    from agent import commands

    path = Path(__file__).resolve().parents[2] / "manifests/examples/inference-deployment.yaml"
    (deployment,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    template = deployment["spec"]["template"]
    (c,) = template["spec"]["containers"]
    assert c["args"][:2] == ["agent", "session"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    annotations = {**template["metadata"]["annotations"], "tandem.io/gpu-index": "2"}
    fields = {"metadata.name": "web-abc12", "metadata.namespace": "team-a",
              "status.hostIP": "10.1.2.3"}
    env = {}
    for var in c["env"]:  # as the kubelet resolves the downward API after bind
        ref = var["valueFrom"]["fieldRef"]["fieldPath"]
        key = ref.removeprefix("metadata.annotations['").removesuffix("']")
        env[var["name"]] = annotations.get(key, "") if key != ref else fields[ref]
    # The kubelet mounts Secret tandem-admin-token; here its file lies under tmp_path.
    (mount,) = c["volumeMounts"]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes[mount["name"]]["secret"]["secretName"] == "tandem-admin-token"
    (tmp_path / "token").write_text("example-token\n")
    args = [a.replace(mount["mountPath"], str(tmp_path)) for a in c["args"][1:]]
    assert f"--admin-token-file={tmp_path}/token" in args
    seen: dict[str, Any] = {}

    class Captured(Exception):
        pass

    def capture(server: Any) -> None:
        seen["link"] = server.link
        raise Captured

    monkeypatch.setattr("agent.session.http.serve_forever", capture)
    monkeypatch.setattr("contracts.logs.setup_logging", lambda **_: None)
    from typer.testing import CliRunner

    result = CliRunner().invoke(commands.app, args, env=env)
    assert isinstance(result.exception, Captured), result.output
    link = seen["link"]
    assert link.admin_token.headers() == {"Authorization": "Bearer example-token"}
    pod = PodPlacement("uid", "web-abc12", "team-a", 2, None, None, tuple(annotations.items()))
    agents = session_spec(pod)
    assert agents is not None
    assert (link.session.name, link.session.json()) == (agents.name, agents.json())
    assert link.server == "http://10.1.2.3:8702"
    link.close()


@pytest.mark.parametrize(("theirs", "warned"), [
    pytest.param({**SLO.json(), "slo_ms": 50}, True, id="other-slo-is-reported"),
    pytest.param({**SLO.json(), "rate_rps": 7}, False, id="rate-is-the-servers-to-change"),
])
def test_a_differing_registration_is_kept_not_fought(
    upstream: Upstream, link: SessionLink, caplog: pytest.LogCaptureFixture, theirs: dict,
    warned: bool,
) -> None:
    with httpx.Client(transport=httpx.WSGITransport(app=upstream)) as agent:
        assert agent.post(f"{SERVER}/v1/sessions", json=theirs).status_code == 201
    with caplog.at_level("WARNING", logger="agent.session.proxy"):
        assert link.ensure().registered
    assert upstream.entry(SLO.name)["slo_ms"] == theirs["slo_ms"] and upstream.posts == 1
    assert any(r.msg == "session registered with other values" for r in caplog.records) is warned


def test_an_answer_back_too_late_is_not_passed_on_as_200(upstream: Upstream) -> None:
    """Regression: the server answered in time by its own clock, but the answer reached
    this hop after the client's deadline and was passed on as a 200 anyway."""

    def slow_way_back(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        body = b"".join(upstream(environ, start_response))
        time.sleep(0.15)  # the answer takes 150 ms to come back
        return [body]

    ln = SessionLink(SERVER, SLO, transport=httpx.WSGITransport(app=slow_way_back))
    try:
        proxy = create_proxy_app(ln, ProxyConfig()).test_client()
        ln.ensure()
        x = npy(np.ones((1, 2), np.float32))
        late = proxy.post("/infer", data=x, content_type=NPY,
                          headers={"X-Tandem-Timeout-Ms": "100"})
        assert late.status_code == 503 and late.json["reason"] == "deadline_missed"
        assert upstream.entry(SLO.name)["good"] == 1  # the server itself was on time
        ok = proxy.post("/infer", data=x, content_type=NPY,
                        headers={"X-Tandem-Timeout-Ms": "100", "X-Tandem-Late": "accept"})
        assert ok.status_code == 200
        roomy = proxy.post("/infer", data=x, content_type=NPY)  # the 2 s SLO: in time
        assert roomy.status_code == 200
        # An absolute deadline is forwarded less what this hop keeps back (its writes).
        due = round(time.time() * 1000.0 + 1500.0, 3)
        proxy.post("/infer", data=x, content_type=NPY, headers={"X-Tandem-Deadline": f"{due}"})
        assert float(upstream.infer_environs[-1]["HTTP_X_TANDEM_DEADLINE"]) <= due
    finally:
        ln.close()
