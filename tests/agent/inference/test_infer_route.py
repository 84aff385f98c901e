"""The inference route answered from the WSGI environ, before Flask: the same answers as
Flask's handlers give, errors included, each write timed, and no Flask request made."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import numpy as np
import pytest
from flask import Flask, request_started
from flask.testing import FlaskClient
from server_helpers import running_tiny_runtime

from agent.inference.errors import BadRequest
from agent.inference.http.app import create_app
from agent.inference.runtime.runtime import ServingRuntime
from agent.inference.runtime.tensors import decode_npy

NPY = "application/x-npy"


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@pytest.fixture()
def runtime() -> Iterator[ServingRuntime]:
    yield from running_tiny_runtime()


@pytest.fixture()
def app(runtime: ServingRuntime) -> Flask:
    app = create_app(runtime, max_body_bytes=1 << 16)
    app.testing = False  # errors answered as in production, not raised into the test
    return app


@pytest.fixture()
def client(app: Flask) -> FlaskClient:
    created = app.test_client().post("/v1/sessions", json={"name": "s", "model": "tiny",
                                                           "slo_ms": 2000, "rate_rps": 100})
    assert created.status_code == 201, created.json
    return app.test_client()


def test_infer_makes_no_flask_request(app: Flask, client: FlaskClient) -> None:
    """Flask's request (context, routing, hooks) is not made for an inference request;
    every other route still goes through it."""
    seen: list[str] = []

    def started(sender: Flask, **_: object) -> None:
        seen.append("flask")

    x = np.ones((1, 4), np.float32)
    with request_started.connected_to(started, app):
        assert client.post("/v1/sessions/s/infer", data=npy(x),
                           content_type=NPY).status_code == 200
        assert seen == []
        assert client.get("/v1/sessions").status_code == 200
    assert seen == ["flask"]


def test_answers_match_flask_handlers(client: FlaskClient) -> None:
    """200s (npy and JSON) and errors: status, type, body shape and the latency header."""
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    ok = client.post("/v1/sessions/s/infer", data=npy(x), content_type=NPY)
    assert ok.status_code == 200 and ok.mimetype == NPY
    assert np.array_equal(np.load(io.BytesIO(ok.data)), x)
    assert float(ok.headers["X-Tandem-Latency-Ms"]) >= 0
    assert int(ok.headers["Content-Length"]) == len(ok.data)
    as_json = client.post("/v1/sessions/s/infer", json={"inputs": {"x": [[1, 2, 3, 4]]}},
                          headers={"Content-Type": "application/json; charset=utf-8"})
    assert as_json.status_code == 200 and as_json.mimetype == "application/json"
    assert as_json.data.endswith(b"\n") and b": " not in as_json.data  # jsonify's compact form
    assert as_json.json["outputs"] == [[[1.0, 2.0, 3.0, 4.0]]]
    missing = client.post("/v1/sessions/nope/infer", data=npy(x), content_type=NPY)
    assert missing.status_code == 404 and missing.mimetype == "application/json"
    assert missing.json["error"] == "SessionNotFound"
    wrong = client.post("/v1/sessions/s/infer", data=b"x", content_type="text/plain")
    assert wrong.status_code == 400 and wrong.json["error"] == "BadRequest"
    big = client.post("/v1/sessions/s/infer", data=b"\0" * (1 << 17), content_type=NPY)
    assert big.status_code == 413 and big.json["error"] == "PayloadTooLarge"


def test_other_methods_and_paths_go_to_flask(client: FlaskClient) -> None:
    assert client.get("/v1/sessions/s/infer").status_code == 405
    assert client.post("/v1/sessions/s/infer/", data=b"").status_code == 404
    assert client.post("/v1/sessions//infer", data=b"").status_code in (404, 405, 308)


def test_session_name_decoded_as_utf8(app: Flask) -> None:
    c = app.test_client()
    assert c.post("/v1/sessions", json={"name": "é", "model": "tiny", "slo_ms": 2000,
                                        "rate_rps": 100}).status_code == 201
    x = np.ones((1, 4), np.float32)
    assert c.post("/v1/sessions/%C3%A9/infer", data=npy(x), content_type=NPY).status_code == 200


def test_unexpected_error_is_a_logged_500(app: Flask, client: FlaskClient,
                                          runtime: ServingRuntime,
                                          monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    def broken(name: str) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(runtime, "input_contract", broken)
    with caplog.at_level(logging.ERROR):
        answer = client.post("/v1/sessions/s/infer", data=npy(np.ones((1, 4), np.float32)),
                             content_type=NPY)
    assert answer.status_code == 500 and answer.json["error"] == "InternalServerError"
    assert "boom" not in answer.get_data(as_text=True)  # nothing internal told the client
    assert any("RuntimeError: boom" in (r.exc_text or "") for r in caplog.records)
    monkeypatch.undo()
    ok = client.post("/v1/sessions/s/infer", data=npy(np.ones((1, 4), np.float32)),
                     content_type=NPY)
    assert ok.status_code == 200  # the server survives it


def test_every_answer_write_is_timed(client: FlaskClient, runtime: ServingRuntime,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[float] = []
    monkeypatch.setattr(runtime.path_cost, "observe_write", writes.append)
    x = np.ones((1, 4), np.float32)
    client.post("/v1/sessions/s/infer", data=npy(x), content_type=NPY).close()
    client.post("/v1/sessions/nope/infer", data=npy(x), content_type=NPY).close()
    assert len(writes) == 2 and all(w >= 0 for w in writes)


@pytest.mark.parametrize("array", [
    np.zeros((1, 4), np.float32), np.float32(3.0), np.zeros((0, 3)),
    np.asfortranarray(np.arange(12, dtype=">i4").reshape(3, 4)), np.array([True, False])],
    ids=["f32", "scalar", "empty", "fortran-big-endian", "bool"])
def test_decode_npy_equals_np_load(array: np.ndarray) -> None:
    """One header parse gives what ``np.load`` gives, as a fresh writable array."""
    body = npy(array)
    got, want = decode_npy(body), np.load(io.BytesIO(body))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want) and got.flags.writeable


def test_a_header_seen_before_is_not_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients send one header again and again: parsed once; its data still checked."""
    body = npy(np.arange(6, dtype=np.float32).reshape(2, 3))
    decode_npy(body)

    def unparsable(_stream: object) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr(np.lib.format, "read_array_header_1_0", unparsable)
    assert np.array_equal(decode_npy(body), np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(BadRequest, match="claims shape"):
        decode_npy(body[:-4])  # the same header, a value short
