"""The servers' admin clients send the bearer token: the agent's session sync, the session
process, and the supervisor that hands the token file to each server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_helpers import running_tiny_runtime
from typer.testing import CliRunner

from agent.errors import ConfigError
from agent.inference.http.app import create_app
from agent.inference.http.auth import AdminGuard, AdminToken
from agent.inference.runtime.runtime import ServingRuntime
from agent.node.extender_view import NodeView, parse_node_view
from agent.node.main import build_agent
from agent.node.sessions import SessionSync
from agent.node.supervisor import SupervisorConfig
from agent.session.proxy import SessionLink, session_request

TOKEN = "admin-token-for-tests"
NODE = "gpu-node-1"
DATA = Path(__file__).parents[1] / "data" / "agent"
SLO = session_request("default.web-1", "tiny", 0, slo_ms=2000, rate_rps=100)


def view(*names: str) -> NodeView:
    """GPU 0 of the node with one SLO inference pod per name (a ``/v1/state`` answer)."""
    pods = [{"pod": f"ns/{n}", "uid": f"uid-{n}", "state": "placed", "workload": "inference",
             "util_percent": 20.0, "mem_mib": 512.0,
             "annotations": {"tandem.io/workload": "inference", "tandem.io/model": "tiny",
                             "tandem.io/slo-ms": "2000", "tandem.io/rate-rps": "10"}}
            for n in names]
    return parse_node_view({"nodes": {NODE: {"gpus": [{"index": 0, "pods": pods}]}}}, NODE)


@pytest.fixture()
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    return path


@pytest.fixture()
def runtime() -> Iterator[ServingRuntime]:
    yield from running_tiny_runtime()


def guarded_transport(runtime: ServingRuntime, token_file: Path) -> httpx.WSGITransport:
    return httpx.WSGITransport(app=create_app(runtime, admin=AdminGuard(AdminToken(token_file))))


class Recorder:
    """An httpx transport that records each request's Authorization header."""

    def __init__(self, sessions: list[str]) -> None:
        self.sessions = sessions
        self.seen: list[tuple[str, str, str | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path,
                          request.headers.get("Authorization")))
        if request.method == "GET":
            return httpx.Response(200, json={"sessions": [{"name": n} for n in self.sessions]})
        if request.method == "POST" and request.url.path == "/v1/sessions":
            self.sessions.append(json.loads(request.content)["name"])
            return httpx.Response(201, json={})
        if request.method == "DELETE":
            return httpx.Response(200, json={})
        return httpx.Response(200, content=b"x", headers={"Content-Type": "application/x-npy"})


# ---- the agent's session sync ------------------------------------------------------------

@pytest.mark.parametrize(("with_token", "added", "failed"), [
    pytest.param(True, ("ns.a",), (), id="with-token-adds"),
    pytest.param(False, (), ("ns.a",), id="without-token-is-refused"),
])
def test_sync_against_a_guarded_server(runtime: ServingRuntime, token_file: Path,
                                       with_token: bool, added: tuple, failed: tuple) -> None:
    sync = SessionSync(lambda i: "http://server", transport=guarded_transport(runtime, token_file),
                       admin_token=AdminToken(token_file) if with_token else None)
    result = sync.sync(view("a"))
    assert (result.added, result.failed) == (added, failed)
    assert [s["name"] for s in runtime.snapshot()["sessions"]] == list(added)
    if with_token:  # and removal, once the pod is gone
        assert sync.sync(view()).removed == ("ns.a",)
        assert runtime.snapshot()["sessions"] == []
    sync.close()


def test_sync_sends_the_token_on_changes_only(token_file: Path) -> None:
    recorder = Recorder(["ns.gone"])
    sync = SessionSync(lambda i: "http://server", transport=httpx.MockTransport(recorder),
                       admin_token=AdminToken(token_file))
    sync.sync(view("new"))
    assert sorted(recorder.seen) == [
        ("DELETE", "/v1/sessions/ns.gone", f"Bearer {TOKEN}"),
        ("GET", "/v1/sessions", None),
        ("POST", "/v1/sessions", f"Bearer {TOKEN}"),
    ]


def test_sync_with_an_unreadable_token_fails_the_change_not_the_round(token_file: Path) -> None:
    recorder = Recorder([])
    sync = SessionSync(lambda i: "http://server", transport=httpx.MockTransport(recorder),
                       admin_token=AdminToken(token_file))
    token_file.unlink()
    assert sync.sync(view("a")).failed == ("ns.a",)
    assert [m for m, _, _ in recorder.seen] == ["GET"]


# ---- the session process -----------------------------------------------------------------

def test_session_link_registers_and_deregisters_with_the_token(
    runtime: ServingRuntime, token_file: Path,
) -> None:
    link = SessionLink("http://server", SLO, transport=guarded_transport(runtime, token_file),
                       admin_token=AdminToken(token_file))
    assert link.ensure().registered
    assert [s["name"] for s in runtime.snapshot()["sessions"]] == ["default.web-1"]
    assert link.deregister()
    assert runtime.snapshot()["sessions"] == []


def test_session_link_without_the_token_is_not_ready_with_the_reason(
    runtime: ServingRuntime, token_file: Path,
) -> None:
    link = SessionLink("http://server", SLO, transport=guarded_transport(runtime, token_file))
    state = link.ensure()
    assert not state.registered and state.server_reachable
    assert "401" in (state.reason or "") and "bearer token" in (state.reason or "")


def test_session_link_sends_the_token_on_admin_calls_only(token_file: Path) -> None:
    recorder = Recorder([])
    link = SessionLink("http://server", SLO, transport=httpx.MockTransport(recorder),
                       admin_token=AdminToken(token_file))
    link.ensure()
    link.forward(b"body", "application/x-npy").close()
    link.deregister()
    assert recorder.seen == [
        ("GET", "/v1/sessions", None),
        ("POST", "/v1/sessions", f"Bearer {TOKEN}"),
        ("POST", "/v1/sessions/default.web-1/infer", None),  # the data path carries no secret
        ("DELETE", "/v1/sessions/default.web-1", f"Bearer {TOKEN}"),
    ]


def test_cli_session_with_an_empty_token_file_exits_2(tmp_path: Path) -> None:
    from agent.commands import app

    (tmp_path / "token").write_text("\n")
    result = CliRunner().invoke(app, ["session", "--model=tiny", "--name=default.web-1",
                                      "--server=http://127.0.0.1:1",
                                      f"--admin-token-file={tmp_path}/token"])
    assert result.exit_code == 2 and "is empty" in result.output


# ---- the supervisor and the agent's wiring --------------------------------------------------

def test_supervisor_passes_the_token_file_to_each_server(token_file: Path) -> None:
    cfg = SupervisorConfig(command_prefix=("tandem",), admin_token_file=token_file)
    assert f"--admin-token-file={token_file}" in cfg.argv(3)
    assert not [a for a in SupervisorConfig(command_prefix=("t",)).argv(0)
                if a.startswith("--admin-token-file")]


def test_serve_args_may_not_set_the_token_file() -> None:
    with pytest.raises(ConfigError, match="--admin-token-file"):
        SupervisorConfig(serve_args=("--admin-token-file=/x",))


def settings(**changes: object) -> dict:
    base = {"node": NODE, "gpus": f"sim:{DATA / 'sim_cluster.yaml'}",
            "extender": None, "interval_seconds": 1.0, "token_file": None,
            "proc_root": DATA / "proc", "session_host": "127.0.0.1",
            "session_base_port": 8700, "sessions": True, "seed": 0, "environ": {}}
    return {**base, **changes}


@pytest.mark.parametrize(("host", "with_file", "env", "error"), [
    pytest.param("127.0.0.1", False, {}, None, id="loopback-servers-need-none"),
    pytest.param("0.0.0.0", True, {}, None, id="published-with-file"),
    pytest.param("0.0.0.0", False, {"TANDEM_ADMIN_TOKEN": TOKEN}, None, id="published-with-env"),
    pytest.param("0.0.0.0", False, {}, "--admin-token-file", id="published-without-token"),
])
def test_build_agent_requires_a_token_for_published_servers(
    token_file: Path, host: str, with_file: bool, env: dict, error: str | None,
) -> None:
    serve = SupervisorConfig(command_prefix=("tandem",), host=host)
    path = token_file if with_file else None
    if error is not None:
        with pytest.raises(ConfigError, match=error):
            build_agent(**settings(serve=serve, admin_token_file=path, environ=env))
        return
    agent, _ = build_agent(**settings(serve=serve, admin_token_file=path, environ=env))
    assert agent.servers is not None
    assert agent.servers.config.admin_token_file == path


def test_build_agent_with_an_unreadable_token_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="admin token file"):
        build_agent(**settings(admin_token_file=tmp_path / "missing"))


def test_daemonset_gives_agent_and_servers_the_admin_secret() -> None:
    import yaml

    path = Path(__file__).resolve().parents[2] / "manifests/base/agent-daemonset.yaml"
    (ds,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec = ds["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    flag = next(a for a in agent["args"] if a.startswith("--admin-token-file="))
    directory = flag.split("=", 1)[1].rsplit("/", 1)[0]
    mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == directory)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "tandem-admin-token" and mount["readOnly"] is True
    assert "--serve-gpus" in agent["args"]  # the supervisor hands the same file to the servers
    assert not [a for a in agent["args"] if a.startswith("--serve-arg=--admin-token-file")]
