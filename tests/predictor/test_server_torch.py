"""The torch executor: ONNX graphs run by torch give ONNX Runtime's answers, per zoo
family, whole and segment by segment; it refuses what it cannot run, never falls back
from CUDA to the CPU, and serves sessions end to end."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from server_helpers import chain_model, save
from test_predictor_zoo import FAMILY_REPRESENTATIVES, _small_inputs
from typer.testing import CliRunner

from agent.inference.errors import ModelRejected
from agent.inference.executors.executors import OrtExecutor
from agent.inference.preparation.limits import ModelLimits
from predictor.zoo import ZOO, export_onnx

torch = pytest.importorskip("torch")

from agent.inference.executors.torch_executor import TorchExecutor  # noqa: E402 (needs torch)

LIMITS = ModelLimits(profile_batches=(1, 2), profile_repeats=1)
# Small graphs whose operators span the interpreter: Gemm/Relu, LSTM with its shape
# arithmetic, attention (Softmax, LayerNormalization, Erf), channel shuffles (Shape,
# Gather, integer Div, Reshape) and PyramidNet's computed Pad; the rest run with --with-slow.
DEFAULT_FAMILIES = ("mlp", "lstm", "transformer_encoder", "shufflenet_v2_0.5", "pyramidnet56_a48")
FAMILIES = [
    pytest.param(name, marks=() if name in DEFAULT_FAMILIES else pytest.mark.slow)
    for name in FAMILY_REPRESENTATIVES
]


def _input(name: str, batch: int, loaded_shape: tuple, dtype: np.dtype) -> np.ndarray:
    shape = (batch, *[int(d) for d in loaded_shape])
    rng = np.random.default_rng(batch)
    if np.issubdtype(dtype, np.integer):  # token ids inside the (shrunk) vocabulary
        return rng.integers(0, int(_small_inputs(name).get("vocab", 2)), shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture(scope="module")
def executors() -> tuple[TorchExecutor, OrtExecutor]:
    return (TorchExecutor("cpu", limits=LIMITS, prepare_in_process=True),
            OrtExecutor("cpu", limits=LIMITS, prepare_in_process=True))


@pytest.mark.parametrize("name", FAMILIES)
def test_every_zoo_family_gives_onnxruntime_outputs(
    name: str, tmp_path: Path, executors: tuple[TorchExecutor, OrtExecutor]
) -> None:
    tex, oex = executors
    path = export_onnx(name, 1, tmp_path / f"{name}.onnx", dynamic_batch=True,
                       **_small_inputs(name))
    tl, ol = tex.load(str(path)), oex.load(str(path))
    assert tl.cuts == ol.cuts
    for batch in (1, 4):
        x = _input(name, batch, tl.sample_shape, tl.input_dtype)
        got, want = tex.run_batch(tl, x), oex.run_batch(ol, x)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_segment_by_segment_equals_the_whole_run(tmp_path: Path) -> None:
    tex = TorchExecutor("cpu", limits=LIMITS, prepare_in_process=True)
    path = export_onnx("pyramidnet56_a48", 1, tmp_path / "p.onnx", dynamic_batch=True)
    loaded = tex.load(str(path))
    assert loaded.cuts >= 10  # cut finding ran on the folded graph
    tex.prepare_segments(loaded, 1e-9)  # every atom its own segment
    assert len(loaded.segment_fractions) == loaded.cuts + 1
    assert sum(loaded.segment_fractions) == pytest.approx(1.0)
    x = _input("pyramidnet56_a48", 3, loaded.sample_shape, loaded.input_dtype)
    feed: dict = {loaded.input_name: x}
    for i in range(len(loaded.segment_fractions)):
        feed = tex.run_segment(loaded, i, feed, 0.0)
        if i < len(loaded.segment_fractions) - 1:  # one live tensor, kept as a torch tensor
            assert len(feed) == 1 and isinstance(next(iter(feed.values())), torch.Tensor)
    whole = tex.run_batch(loaded, x)
    assert np.array_equal(list(feed.values())[0], whole[0])
    profile = tex.profile(loaded)
    assert profile.latency_ms(2) > 0
    # Longer quanta build fewer segments: the overhead never grows with Q.
    ys = list(tex.overhead_curve(loaded, profile, 0.25).curve.ys)
    assert min(ys) >= 0.0 and ys == sorted(ys, reverse=True)


def _hardmax_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Hardmax", ["m"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_an_unsupported_operator_is_refused_by_name(tmp_path: Path) -> None:
    path = save(_hardmax_model(), tmp_path / "h.onnx")
    calls = []
    tex = TorchExecutor("cpu", limits=LIMITS, prepare_in_process=True)
    tex.device_gate = lambda fn, ms: calls.append(ms) or fn()
    with pytest.raises(ModelRejected, match="operator Hardmax") as refused:
        tex.load(str(path))
    assert refused.value.status == 422
    assert refused.value.details["unsupported"] == ["operator Hardmax"]
    assert calls == []  # refused before any profiling run


def test_the_app_answers_422_for_an_unsupported_operator(tmp_path: Path) -> None:
    from agent.inference.clock import MonotonicClock
    from agent.inference.http.app import create_app
    from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime

    save(_hardmax_model(), tmp_path / "h.onnx")
    limits = ModelLimits(store_root=tmp_path, profile_batches=(1, 2), profile_repeats=1)
    rt = ServingRuntime(TorchExecutor("cpu", limits=limits, prepare_in_process=True),
                        MonotonicClock(), RuntimeConfig("cpu"))
    answer = create_app(rt).test_client().post(
        "/v1/sessions", json={"name": "h", "model": "h.onnx", "slo_ms": 500, "rate_rps": 5})
    assert answer.status_code == 422 and "Hardmax" in answer.json["message"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_cuda_device_refuses_to_start_with_a_sentence() -> None:
    from tandem.cli import app

    result = CliRunner().invoke(
        app, ["agent", "serve", "--executor", "torch", "--device", "cuda", "--port", "0"])
    assert result.exit_code == 2
    assert "sees no CUDA device" in result.output and "--device cpu" in result.output
    assert "Traceback" not in result.output


def test_choosing_the_torch_executor_is_explicit_and_the_agent_needs_no_torch() -> None:
    with pytest.raises(ValueError, match="'cuda' or 'cpu'"):
        TorchExecutor("gpu")
    code = ("import sys, agent.inference.http.serve, agent.inference.executors.torch_executor, "
            "agent.commands; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_server_serves_slo_and_best_effort_sessions_on_torch(tmp_path: Path) -> None:
    import onnxruntime as ort

    from agent.inference.clock import MonotonicClock
    from agent.inference.http.app import create_app
    from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime

    save(chain_model(layers=6), tmp_path / "chain.onnx")
    export_onnx("mlp", 1, tmp_path / "mlp.onnx", dynamic_batch=True)
    limits = ModelLimits(store_root=tmp_path, profile_batches=(1, 2, 4), profile_repeats=2)
    rt = ServingRuntime(TorchExecutor("cpu", limits=limits), MonotonicClock(),
                        RuntimeConfig("cpu"), post_workers=1)
    rt.start()
    try:
        client = create_app(rt).test_client()
        created = client.post(
            "/v1/sessions", json={"name": "m", "model": "mlp.onnx", "slo_ms": 500, "rate_rps": 20})
        assert created.status_code == 201, created.json
        assert created.json["profile"]["alpha_ms"] > 0
        be = client.post("/v1/sessions", json={"name": "b", "model": "chain.onnx", "weight": 1})
        assert be.status_code == 201, be.json
        assert be.json["cuts"] > 0
        dim = ZOO["mlp"].input_params["input_dim"]
        for name, model, x in (
            ("m", "mlp.onnx", np.random.default_rng(0).standard_normal((1, dim))),
            ("b", "chain.onnx", np.random.default_rng(1).standard_normal((3, 8))),
        ):
            x = x.astype(np.float32)
            buf = io.BytesIO()
            np.save(buf, x, allow_pickle=False)
            answer = client.post(f"/v1/sessions/{name}/infer", data=buf.getvalue(),
                                 content_type="application/x-npy")
            assert answer.status_code == 200, answer.json
            sess = ort.InferenceSession(str(tmp_path / model), providers=["CPUExecutionProvider"])
            want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
            np.testing.assert_allclose(np.load(io.BytesIO(answer.data)), want, rtol=1e-4,
                                       atol=1e-4)
        listed = client.get("/v1/sessions").json
        assert listed["executor"] == "torch" and listed["gpu_type"] == "cpu"
        assert {s["name"]: s["served"] for s in listed["sessions"]} == {"m": 1, "b": 1}
    finally:
        rt.stop()


def test_runs_on_another_thread_keep_the_one_intra_op_thread(tmp_path: Path) -> None:
    """The limit is per thread: the executor loop's thread ran batches (and profiles)
    over every core, which on a busy host stalled a 0.05 ms MLP for tens of ms."""
    import threading

    save(chain_model(4), tmp_path / "m.onnx")
    executor = TorchExecutor("cpu", limits=ModelLimits(store_root=tmp_path),
                             prepare_in_process=True)
    loaded = executor.load("m.onnx")
    seen: list[int] = []

    def loop_thread() -> None:
        torch.set_num_threads(4)  # what a fresh thread may start with on a larger host
        executor.run_batch(loaded, np.ones((4, 4), np.float32))
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=loop_thread)
    thread.start()
    thread.join()
    assert seen == [1]
