"""Bearer-token auth of the inference server's session endpoints: which routes need it,
401 answers, constant-time check, token sources, rotation, and who may run without it."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from flask.testing import FlaskClient
from server_helpers import running_tiny_runtime

from agent.inference.errors import Unauthorized
from agent.inference.http.app import create_app
from agent.inference.http.auth import AdminGuard, AdminToken, AdminTokenError, is_loopback
from agent.inference.http.serve import ServeOptions, admin_guard
from agent.inference.runtime.runtime import ServingRuntime

TOKEN = "t0ken-for-tests-only"
SESSION = {"name": "s", "model": "tiny", "slo_ms": 2000, "rate_rps": 100}
NPY = "application/x-npy"


@pytest.fixture()
def runtime() -> Iterator[ServingRuntime]:
    yield from running_tiny_runtime()


@pytest.fixture()
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture()
def client(runtime: ServingRuntime, token_file: Path) -> FlaskClient:
    return create_app(runtime, admin=AdminGuard(AdminToken(token_file))).test_client()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("headers", [
    pytest.param({}, id="no-header"),
    pytest.param(bearer("wrong"), id="wrong-token"),
    pytest.param(bearer(TOKEN + "x"), id="token-with-suffix"),
    pytest.param(bearer(TOKEN[:-1]), id="token-prefix"),
    pytest.param({"Authorization": TOKEN}, id="no-bearer-scheme"),
    pytest.param({"Authorization": f"Basic {TOKEN}"}, id="basic-scheme"),
    pytest.param({"Authorization": "Bearer "}, id="empty-bearer"),
    pytest.param(bearer("tökén"), id="non-ascii"),
])
def test_session_changes_without_the_token_are_401_and_change_nothing(
    client: FlaskClient, runtime: ServingRuntime, headers: dict[str, str],
) -> None:
    assert client.post("/v1/sessions", json=SESSION, headers=bearer(TOKEN)).status_code == 201
    added = client.post("/v1/sessions", json={**SESSION, "name": "t"}, headers=headers)
    deleted = client.delete("/v1/sessions/s", headers=headers)
    for answer in (added, deleted):
        assert answer.status_code == 401
        assert answer.json["error"] == "Unauthorized"
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        assert TOKEN not in answer.get_data(as_text=True)
    assert [s["name"] for s in runtime.snapshot()["sessions"]] == ["s"]


def test_auth_is_checked_before_the_body_is_read(client: FlaskClient) -> None:
    answer = client.post("/v1/sessions", data=b"{not json", content_type="application/json")
    assert answer.status_code == 401  # not 400: an anonymous caller learns nothing


def test_the_right_token_adds_and_deletes(client: FlaskClient, runtime: ServingRuntime) -> None:
    assert client.post("/v1/sessions", json=SESSION, headers=bearer(TOKEN)).status_code == 201
    assert client.delete("/v1/sessions/s", headers=bearer(TOKEN)).status_code == 200
    assert runtime.snapshot()["sessions"] == []


@pytest.mark.parametrize(("method", "path", "status"), [
    pytest.param("GET", "/v1/sessions", 200, id="list"),
    pytest.param("GET", "/metrics", 200, id="metrics"),
    pytest.param("GET", "/livez", 200, id="livez"),
    pytest.param("GET", "/readyz", 200, id="readyz"),
    pytest.param("POST", "/v1/sessions/s/infer", 200, id="infer"),
])
def test_read_and_data_paths_stay_open(client: FlaskClient, method: str, path: str,
                                       status: int) -> None:
    assert client.post("/v1/sessions", json=SESSION, headers=bearer(TOKEN)).status_code == 201
    buf = io.BytesIO()
    np.save(buf, np.ones((1, 4), np.float32), allow_pickle=False)
    body = {"data": buf.getvalue(), "content_type": NPY} if method == "POST" else {}
    assert client.open(path, method=method, **body).status_code == status


def test_without_a_guard_the_endpoints_are_open(runtime: ServingRuntime) -> None:
    open_client = create_app(runtime).test_client()
    assert open_client.post("/v1/sessions", json=SESSION).status_code == 201


def test_a_rotated_token_file_takes_effect_without_a_restart(
    client: FlaskClient, token_file: Path,
) -> None:
    token_file.write_text("rotated\n")
    assert client.post("/v1/sessions", json=SESSION, headers=bearer(TOKEN)).status_code == 401
    assert client.post("/v1/sessions", json=SESSION, headers=bearer("rotated")).status_code == 201


def test_an_unreadable_file_keeps_the_last_token(
    token_file: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    guard = AdminGuard(AdminToken(token_file))
    token_file.unlink()  # a Secret update swaps the file; it may vanish for a moment
    with caplog.at_level(logging.WARNING):
        guard.check(f"Bearer {TOKEN}")
        with pytest.raises(Unauthorized):
            guard.check("Bearer other")
    assert "last one read" in caplog.text and TOKEN not in caplog.text


@pytest.mark.parametrize(("content", "env", "expected"), [
    pytest.param(" file-secret \n", {}, "file-secret", id="file-stripped"),
    pytest.param("file-secret", {"TANDEM_ADMIN_TOKEN": "env-secret"}, "file-secret",
                 id="file-wins-over-env"),
    pytest.param(None, {"TANDEM_ADMIN_TOKEN": " env-secret \n"}, "env-secret", id="env"),
])
def test_token_sources(tmp_path: Path, content: str | None, env: dict[str, str],
                       expected: str) -> None:
    path = None
    if content is not None:
        path = tmp_path / "token"
        path.write_text(content)
    token = AdminToken.configured(path, environ=env)
    assert token is not None and token.get() == expected
    assert token.headers() == {"Authorization": f"Bearer {expected}"}
    assert expected not in repr(token)


@pytest.mark.parametrize(("content", "message"), [
    pytest.param(None, "No such file", id="missing-file"),
    pytest.param("  \n", "is empty", id="empty-file"),
    pytest.param(b"\xff\xfe", "not UTF-8", id="binary-file"),
])
def test_an_unusable_token_file_is_a_clear_error(tmp_path: Path, content: str | bytes | None,
                                                 message: str) -> None:
    path = tmp_path / "token"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(AdminTokenError, match=message):
        AdminToken(path, environ={})


def test_no_token_configured_is_none_and_an_empty_env_is_not_a_token() -> None:
    assert AdminToken.configured(None, environ={}) is None
    assert AdminToken.configured(None, environ={"TANDEM_ADMIN_TOKEN": "  "}) is None
    with pytest.raises(AdminTokenError, match="TANDEM_ADMIN_TOKEN"):
        AdminToken(None, environ={})


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("node-1.example", False),
])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def options(host: str, token_file: Path | None = None) -> ServeOptions:
    return ServeOptions(gpu_index=0, executor="sim", device="cpu", port=0, host=host,
                        profiles_path=None, profile_margin=1.0, gpu_type="sim",
                        memory_mib=1e6, model_store=None, drop_policy="early",
                        overhead_tolerance_percent=2.0, quantum_ms=None, max_body_bytes=1024,
                        post_workers=0, http_threads=1, admin_token_file=token_file)


@pytest.mark.parametrize(("host", "with_file", "env", "guarded"), [
    pytest.param("127.0.0.1", False, {}, False, id="loopback-may-run-open"),
    pytest.param("127.0.0.1", True, {}, True, id="loopback-with-file"),
    pytest.param("0.0.0.0", True, {}, True, id="published-with-file"),
    pytest.param("0.0.0.0", False, {"TANDEM_ADMIN_TOKEN": TOKEN}, True, id="published-with-env"),
])
def test_admin_guard_from_options(token_file: Path, host: str, with_file: bool,
                                  env: dict[str, str], guarded: bool) -> None:
    guard = admin_guard(options(host, token_file if with_file else None), environ=env)
    assert (guard is not None) is guarded
    if guard is not None:
        guard.check(f"Bearer {TOKEN}")


def test_a_published_server_without_a_token_refuses_to_start() -> None:
    with pytest.raises(ValueError, match="--admin-token-file"):
        admin_guard(options("0.0.0.0"), environ={})
