"""HTTP API of the inference server: round trips, npy and JSON bodies, hostile input."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from cheroot import wsgi
from flask.testing import FlaskClient
from server_helpers import chain_model, save

from agent.inference.clock import MonotonicClock
from agent.inference.executors.executors import OrtExecutor, SimExecutor
from agent.inference.http.app import create_app
from agent.inference.preparation.limits import ModelLimits
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from predictor.batching import BatchingProfile

NPY = "application/x-npy"
SLO_SESSION = {"name": "s", "model": "tiny", "slo_ms": 2000, "rate_rps": 100}


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def forged_npy(shape: tuple[int, ...], header: str | None = None) -> bytes:
    """An .npy header claiming ``shape`` float32s (or the raw ``header``), no data after it."""
    if header is None:
        header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape!r}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


@pytest.fixture()
def sim_runtime() -> Iterator[ServingRuntime]:
    clock = MonotonicClock()
    profiles = {
        "tiny": BatchingProfile.linear("tiny", "sim", 0.01, 0.05, max_batch=32),
        "heavy": BatchingProfile.linear("heavy", "sim", 50.0, 100.0, max_batch=8),
    }
    rt = ServingRuntime(
        SimExecutor(profiles, clock, "sim"),
        clock,
        RuntimeConfig("sim", quantum_ms=1.0),
        post_workers=2,
    )
    rt.start()
    yield rt
    rt.stop()


@pytest.fixture()
def client(sim_runtime: ServingRuntime) -> FlaskClient:
    return create_app(sim_runtime, max_body_bytes=1 << 16).test_client()


def test_session_lifecycle_and_npy_round_trip(client: FlaskClient) -> None:
    created = client.post(
        "/v1/sessions", json={"name": "s", "model": "tiny", "slo_ms": 2000, "rate_rps": 100}
    )
    assert created.status_code == 201, created.json
    assert created.json["batch"] >= 1 and created.json["duty_cycle_ms"] > 0
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    answer = client.post("/v1/sessions/s/infer", data=npy(x), content_type=NPY)
    assert answer.status_code == 200, answer.json
    assert answer.mimetype == NPY
    assert np.array_equal(np.load(io.BytesIO(answer.data)), x)  # the sim executor echoes
    listed = client.get("/v1/sessions").json
    (entry,) = listed["sessions"]
    assert entry["name"] == "s" and entry["served"] == 1 and entry["batch_sizes"] == {"1": 1}
    metrics = client.get("/metrics").data.decode()
    assert 'tandem_server_goodput_rps{kind="slo",session="s"}' in metrics
    assert "tandem_server_slo_attainment_ratio" in metrics
    assert client.delete("/v1/sessions/s").status_code == 200
    assert client.get("/v1/sessions").json["sessions"] == []


def test_json_inputs_and_best_effort_session(client: FlaskClient) -> None:
    assert (
        client.post("/v1/sessions", json={"name": "be", "model": "tiny", "weight": 2}).status_code
        == 201
    )
    answer = client.post("/v1/sessions/be/infer", json={"inputs": {"x": [[1.0, 2.0], [3.0, 4.0]]}})
    assert answer.status_code == 200, answer.json
    assert answer.json["outputs"] == [[[1.0, 2.0], [3.0, 4.0]]]
    metrics = client.get("/metrics").data.decode()
    assert "tandem_server_quantum_target_seconds 0.001" in metrics


def test_refusal_is_409_with_reason_and_state_unchanged(client: FlaskClient) -> None:
    client.post("/v1/sessions", json=SLO_SESSION)
    refused = client.post(
        "/v1/sessions", json={"name": "h", "model": "heavy", "slo_ms": 100, "rate_rps": 10}
    )
    assert refused.status_code == 409
    assert refused.json["error"] == "AdmissionRefused" and refused.json["reason"] == "SloTooTight"
    assert [s["name"] for s in client.get("/v1/sessions").json["sessions"]] == ["s"]


@pytest.mark.parametrize(
    ("path", "kwargs", "status"),
    [
        pytest.param(
            "/v1/sessions",
            {"data": b"{not json", "content_type": "application/json"},
            400,
            id="malformed-json",
        ),
        pytest.param("/v1/sessions", {"json": [1, 2]}, 400, id="json-not-object"),
        pytest.param(
            "/v1/sessions",
            {"json": {"name": "a", "model": "tiny", "slo_ms": 2000, "rate_rps": 1, "color": "red"}},
            400,
            id="unknown-field",
        ),
        pytest.param(
            "/v1/sessions",
            {"json": {"name": "a", "model": "tiny", "slo_ms": "50", "rate_rps": 1}},
            400,
            id="wrong-type",
        ),
        pytest.param(
            "/v1/sessions",
            {"json": {"name": "a", "model": "tiny", "slo_ms": -5, "rate_rps": 1}},
            400,
            id="negative-slo",
        ),
        pytest.param(
            "/v1/sessions",
            {"json": {"name": "a", "model": "tiny", "weight": 0}},
            400,
            id="zero-weight",
        ),
        pytest.param(
            "/v1/sessions",
            {"json": {"name": "a", "model": "nope", "weight": 1}},
            422,
            id="unknown-model",
        ),
        pytest.param(
            "/v1/sessions/s/infer", {"data": b"garbage", "content_type": NPY}, 400, id="bad-npy"
        ),
        pytest.param(
            "/v1/sessions/s/infer",
            {"data": npy(np.array(["a"])), "content_type": NPY},
            400,
            id="string-dtype",
        ),
        pytest.param(
            "/v1/sessions/s/infer",
            {"data": npy(np.zeros((3, 2), np.float32)), "content_type": NPY},
            400,
            id="slo-batch-of-three",
        ),
        pytest.param(
            "/v1/sessions/s/infer",
            {"json": {"inputs": {"x": [[1], [1, 2]]}}},
            400,
            id="ragged-json",
        ),
        pytest.param(
            "/v1/sessions/s/infer",
            {"data": b"x", "content_type": "text/plain"},
            400,
            id="wrong-content-type",
        ),
        pytest.param(
            "/v1/sessions/s/infer",
            {"data": b"\x00" * (1 << 17), "content_type": NPY},
            413,
            id="body-too-large",
        ),
        pytest.param(
            "/v1/sessions/s/infer",
            {"data": forged_npy((2**40, 4)), "content_type": NPY},
            400,
            id="npy-header-claims-2**40-rows",
        ),
        pytest.param(
            "/v1/sessions/s/infer",
            {"data": forged_npy((), "{'descr': __import__('os')"), "content_type": NPY},
            400,
            id="npy-header-does-not-parse",
        ),
        pytest.param(
            "/v1/sessions/s/infer",
            {"data": forged_npy((), "{'descr': " + "(" * 3000), "content_type": NPY},
            400,
            id="npy-header-nested-deeply",
        ),
        pytest.param(
            "/v1/sessions/s/infer",
            {"json": {"inputs": {"x": [[10e38, 1.0]]}}},
            400,
            id="json-number-out-of-float32-range",
        ),
        pytest.param(
            "/v1/sessions/nope/infer",
            {"data": npy(np.zeros((1, 2), np.float32)), "content_type": NPY},
            404,
            id="unknown-session",
        ),
    ],
)
def test_bad_input_gets_a_clear_json_error(client: FlaskClient, path, kwargs, status) -> None:
    client.post("/v1/sessions", json=SLO_SESSION)
    answer = client.post(path, **kwargs)
    assert answer.status_code == status, answer.data
    assert answer.json["error"]
    # The server still works afterwards.
    ok = client.post(
        "/v1/sessions/s/infer", data=npy(np.zeros((1, 2), np.float32)), content_type=NPY
    )
    assert ok.status_code == 200


def test_delete_unknown_session_is_404(client: FlaskClient) -> None:
    assert client.delete("/v1/sessions/ghost").status_code == 404


def test_onnxruntime_session_profiles_at_registration_and_serves(tmp_path: Path) -> None:
    path = save(chain_model(layers=6), tmp_path / "chain.onnx")
    clock = MonotonicClock()
    limits = ModelLimits(store_root=tmp_path, profile_batches=(1, 2, 4), profile_repeats=2)
    rt = ServingRuntime(
        OrtExecutor("cpu", limits=limits), clock, RuntimeConfig("cpu"), post_workers=1
    )
    rt.start()
    try:
        client = create_app(rt).test_client()
        created = client.post(
            "/v1/sessions", json={"name": "c", "model": "chain.onnx", "slo_ms": 500, "rate_rps": 20}
        )
        assert created.status_code == 201, created.json
        assert created.json["profile"]["alpha_ms"] > 0
        x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
        answer = client.post("/v1/sessions/c/infer", data=npy(x), content_type=NPY)
        assert answer.status_code == 200, answer.json
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert np.array_equal(np.load(io.BytesIO(answer.data)), sess.run(None, {"x": x})[0])
        wrong = client.post(
            "/v1/sessions/c/infer", data=npy(np.zeros((1, 3), np.float32)), content_type=NPY
        )
        assert wrong.status_code == 400
        be = client.post("/v1/sessions", json={"name": "b", "model": "chain.onnx", "weight": 1})
        assert be.status_code == 201, be.json
        answer = client.post(
            "/v1/sessions/b/infer", data=npy(np.repeat(x, 3, axis=0)), content_type=NPY
        )
        assert np.array_equal(
            np.load(io.BytesIO(answer.data)), sess.run(None, {"x": np.repeat(x, 3, axis=0)})[0]
        )
    finally:
        rt.stop()


def test_cheroot_serves_the_app_on_loopback(sim_runtime: ServingRuntime) -> None:
    server = wsgi.Server(("127.0.0.1", 0), create_app(sim_runtime), numthreads=2)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        port = server.bind_addr[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            assert http.get("/livez").status_code == 200
            assert http.get("/readyz").status_code == 200
            http.post(
                "/v1/sessions", json={"name": "s", "model": "tiny", "slo_ms": 2000, "rate_rps": 10}
            )
            answer = http.post(
                "/v1/sessions/s/infer",
                content=npy(np.ones((1, 3), np.float32)),
                headers={"Content-Type": NPY},
            )
            assert answer.status_code == 200
    finally:
        server.stop()
        thread.join(timeout=5)


def test_unparseable_npy_header_says_why(client: FlaskClient) -> None:
    client.post("/v1/sessions", json=SLO_SESSION)
    answer = client.post("/v1/sessions/s/infer", content_type=NPY,
                         data=forged_npy((), "{'descr': __import__('os')"))
    assert answer.status_code == 400
    assert "header does not parse" in answer.json["message"]

