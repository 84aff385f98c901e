"""Shared builders for the inference-server tests (no tests here): small ONNX models."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from cheroot import wsgi
from onnx import TensorProto, helper, numpy_helper

from agent.inference.clock import MonotonicClock
from agent.inference.executors.executors import SimExecutor
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from predictor.batching import BatchingProfile


def chain_model(
    width: int = 8, layers: int = 6, residual: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """MatMul+Relu layers on [N, width]; every other layer adds a skip connection."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        w = numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"]))
        out = f"r{i}"
        if residual and i % 2 == 1:
            nodes.append(helper.make_node("Add", [out, prev], [f"a{i}"]))
            out = f"a{i}"
        prev = out
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def running_tiny_runtime() -> Iterator[ServingRuntime]:
    """A started runtime on the sim executor with one tiny linear profile; stopped after."""
    clock = MonotonicClock()
    profiles = {"tiny": BatchingProfile.linear("tiny", "sim", 0.01, 0.05, max_batch=32)}
    rt = ServingRuntime(SimExecutor(profiles, clock, "sim"), clock,
                        RuntimeConfig("sim", quantum_ms=1.0))
    rt.start()
    yield rt
    rt.stop()


def onnx_model(nodes, inits, shape) -> onnx.ModelProto:
    """A one-input, one-output ONNX model (opset 17, IR 10) of ``nodes`` on ``shape``."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def one_matmul(rows: int, width: int) -> onnx.ModelProto:
    """One MatMul over [N, rows, width]: no cut, so one piece of the whole cost."""
    w = numpy_helper.from_array(np.eye(width, dtype=np.float32), "w")
    return onnx_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [w], ["N", rows, width])


def ort_runtimes(store: Path, **limits) -> Iterator:
    """Yields ``make(profiles=None, **config)``: started CPU ONNX Runtime serving runtimes
    over ``store`` (one core, no re-plan timer), all stopped at the end."""
    from agent.inference.executors.executors import OrtExecutor
    from agent.inference.preparation.limits import ModelLimits

    started: list[ServingRuntime] = []

    def make(profiles=None, **config) -> ServingRuntime:
        executor = OrtExecutor("cpu", limits=ModelLimits(store_root=store, profile_repeats=2,
                                                         **limits), intra_op_threads=1)
        rt = ServingRuntime(executor, MonotonicClock(),
                            RuntimeConfig(executor.gpu_type, min_replan_interval_ms=1e12,
                                          **config),
                            profiles=profiles or {}, post_workers=1)
        rt.start()
        started.append(rt)
        return rt

    try:
        yield make
    finally:
        for rt in started:
            rt.stop()


@contextlib.contextmanager
def served_over_http(rt: ServingRuntime, threads: int) -> Iterator[str]:
    """``rt`` started behind a real hardened cheroot server with ``threads`` workers;
    yields its URL, and stops both afterwards."""
    from agent.inference.http.app import create_app
    from contracts.httpserve import harden

    rt.start()
    server = harden(wsgi.Server(("127.0.0.1", 0), create_app(rt), numthreads=threads),
                    10.0, 1 << 20)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.bind_addr[1]}"
    finally:
        rt.stop()
        server.stop()
        thread.join(timeout=5)
