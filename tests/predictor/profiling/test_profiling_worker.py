"""The worker process: job execution on CPU, the JSON-lines protocol, and the pool's deadlines."""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import asdict

import pytest

from predictor.profiling.backend import JobSpec, MeasureSettings
from predictor.profiling.errors import WorkerFailed, WorkerTimeout
from predictor.profiling.pool import WorkerProcess
from predictor.profiling.worker import PREFIX, JobRunner, is_oom, serve

FAST = MeasureSettings(
    warmup_seconds=0.0, measure_seconds=0.02, min_steps=3, max_steps=5, timeout_seconds=30.0
)


@pytest.mark.parametrize("workload", ["training", "inference"])
def test_job_runner_runs_a_zoo_model_on_cpu(workload):
    runner = JobRunner("cpu")
    assert runner.prepare(JobSpec("mlp", "mlp", workload, 4), FAST) == {"event": "ready"}
    result = runner.measure()
    assert result["status"] == "ok"
    assert 3 <= result["n_steps"] <= 5 and result["step_time_ms"] > 0
    assert result["step_time_std_ms"] >= 0
    assert runner.measure()["status"] == "error"  # released after measuring


@pytest.mark.parametrize(
    ("exc", "oom"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (
            RuntimeError(
                "[ONNXRuntimeError] : 6 : BFCArena::AllocateRawInternal Failed to allocate "
                "memory for requested buffer"
            ),
            True,
        ),
        (RuntimeError("CUDNN_STATUS_ALLOC_FAILED"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (KeyError("resnet"), False),
    ],
    ids=["torch-oom", "ort-arena", "cudnn-alloc", "shape-bug", "unknown-model"],
)
def test_oom_is_told_apart_from_other_failures(exc, oom):
    assert is_oom(exc) is oom


def test_torch_out_of_memory_error_is_oom():
    import torch

    assert is_oom(torch.OutOfMemoryError("boom"))


def test_serve_answers_every_op_and_survives_bad_messages():
    job = asdict(JobSpec("no_such_model", "x", "inference", 1))
    lines = [
        json.dumps({"op": "prepare", "job": job, "settings": asdict(FAST)}),
        "not json",
        json.dumps({"op": "dance"}),
        json.dumps({"op": "release"}),
        json.dumps({"op": "exit"}),
        json.dumps({"op": "release"}),
    ]
    out = io.StringIO()
    serve(JobRunner("cpu"), io.StringIO("\n".join(lines) + "\n"), out)
    replies = [json.loads(line[len(PREFIX) :]) for line in out.getvalue().splitlines()]
    assert [r["event"] for r in replies] == ["hello", "result", "error", "error", "released"]
    assert replies[1]["status"] == "error" and "no_such_model" in replies[1]["error"]


_FAKE_WORKER = """
import json, sys, time
print({prefix!r} + json.dumps({{"event": "hello", "pid": 1}}), flush=True)
print("noise from a library", flush=True)
for line in sys.stdin:
    op = json.loads(line)["op"]
    if op == "hang":
        time.sleep(30)
    if op == "die":
        sys.stderr.write("fatal: CUDA error: an illegal memory access\\n"); sys.exit(3)
    print({prefix!r} + json.dumps({{"event": "echo", "op": op}}), flush=True)
"""


@pytest.fixture
def fake_worker():
    argv = [sys.executable, "-c", _FAKE_WORKER.format(prefix=PREFIX)]
    worker = WorkerProcess(argv, dict(os.environ), hello_timeout_s=20.0)
    yield worker
    worker.close()


def test_pool_worker_ignores_non_protocol_output(fake_worker):
    fake_worker.send({"op": "ping"})
    assert fake_worker.receive(20.0) == {"event": "echo", "op": "ping"}


def test_hanging_worker_is_killed_at_its_deadline(fake_worker):
    fake_worker.send({"op": "hang"})
    with pytest.raises(WorkerTimeout):
        fake_worker.receive(0.3)
    assert not fake_worker.alive


def test_dying_worker_reports_its_exit_code_and_stderr(fake_worker):
    fake_worker.send({"op": "die"})
    with pytest.raises(WorkerFailed, match="exited with code 3") as info:
        fake_worker.receive(20.0)
    assert "illegal memory access" in info.value.stderr_tail


def test_graph_features_come_from_one_dynamic_batch_export():
    from predictor.profiling.graph import GraphFeatureSource

    source = GraphFeatureSource()
    try:
        f1 = source.features(JobSpec("mlp", "mlp", "inference", 1))
        f8 = source.features(JobSpec("mlp", "mlp", "inference", 8))
        assert f8["flops"] == pytest.approx(8 * f1["flops"])
        assert f8["params_bytes"] == f1["params_bytes"] > 0
        assert f1["op_counts"].get("Gemm", 0) + f1["op_counts"].get("MatMul", 0) > 0
        assert len(list(source.workdir.glob("*.onnx"))) == 1
    finally:
        source.close()
