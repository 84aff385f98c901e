"""Quanta and duty cycles on the real ONNX Runtime CPU executor (not the simulated one).

Small generated models keep each test to a few seconds. Shares are measured over a
window in which every job is backlogged (closed-loop clients keep requests queued).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from bench_modules import load
from server_helpers import one_matmul, ort_runtimes

from agent.inference.clock import MonotonicClock
from agent.inference.executors.executors import OrtExecutor
from agent.inference.preparation.limits import ModelLimits
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from predictor.batching import BatchingProfile

mlp = load("serving_ort").mlp  # the benchmark's MatMul+Relu chain: a cut after every node

@pytest.fixture()
def make_runtime(tmp_path: Path) -> Iterator:
    yield from ort_runtimes(tmp_path)


def keep_backlogged(rt: ServingRuntime, name: str, tensor: np.ndarray, depth: int) -> None:
    """A closed-loop client with ``depth`` requests outstanding: each answer sends another."""
    def again(_outcome) -> None:
        if rt.is_running():
            rt.submit(name, tensor, again)

    for _ in range(depth):
        rt.submit(name, tensor, again)


def measured_shares(rt: ServingRuntime, warmup_s: float, window_s: float) -> dict[str, float]:
    """Executor wall time each job's segments took during the window (after a warm-up)."""
    def gpu_ms() -> dict[str, float]:
        return {s["name"]: s["gpu_time_ms"] for s in rt.snapshot()["sessions"]}

    time.sleep(warmup_s)
    before = gpu_ms()
    time.sleep(window_s)
    after = gpu_ms()
    return {n: after[n] - before[n] for n in after}


@pytest.mark.parametrize(
    ("weights", "batches"),
    [
        pytest.param({"big": 1, "small": 2}, {"big": 32, "small": 1}, id="weighted-1:2"),
        pytest.param({"big": 3, "small": 1}, {"big": 16, "small": 1}, id="weighted-3:1"),
    ],
)
def test_every_backlogged_job_is_served_on_the_real_executor(
    make_runtime, tmp_path, weights, batches
) -> None:
    """Weighted jobs of mixed batch sizes on ONNX Runtime: none starves. The shares
    themselves are wall-clock figures on a shared CPU (one segment descheduled for a
    second can reverse a 1 s window's order): ``benchmarks/serving.py`` measures them
    (``onnxruntime.sharing``: Jain index and the largest share error, fair and 1:2:3),
    and the scheduler's weighted shares are asserted on the virtual clock
    (``test_server_quanta.py``, ``test_server_runtime.py``)."""
    onnx.save(mlp(256, 8), str(tmp_path / "m.onnx"))
    rt = make_runtime(quantum_ms=1.0)
    for name, weight in weights.items():
        rt.add_best_effort_session(name, "m.onnx", weight=weight)
    for name, batch in batches.items():
        keep_backlogged(rt, name, np.ones((batch, 256), np.float32), depth=64)
    shares = measured_shares(rt, warmup_s=0.3, window_s=1.0)
    assert all(v > 0 for v in shares.values()), shares


def test_segment_longer_than_the_cycle_is_served_beside_an_idle_slo_session(
    make_runtime, tmp_path
) -> None:
    onnx.save(mlp(64, 2), str(tmp_path / "slo.onnx"))
    onnx.save(one_matmul(rows=8192, width=256), str(tmp_path / "long.onnx"))
    rt = make_runtime(overrun_every_cycles=3)
    long_ms = rt.add_best_effort_session("be", "long.onnx")["profile"]["latency_batch1_ms"]
    # A duty cycle shorter than the job's one segment (64 requests fill a batch in a
    # quarter of it), so it never fits; the SLO leaves room to overrun one cycle by it.
    plan = rt.add_slo_session("slo", "slo.onnx", slo_ms=2 * long_ms + 20.0,
                              rate_rps=4 * 64 * 1000.0 / long_ms)
    assert plan["duty_cycle_ms"] < long_ms
    assert rt.snapshot()["overrun_headroom_ms"] == pytest.approx(long_ms)
    done = threading.Semaphore(0)
    served = []

    def answer(outcome) -> None:
        served.append(outcome.reason is None)
        done.release()

    for _ in range(8):
        rt.submit("be", np.ones((1, 8192, 256), np.float32), answer)
    # A liveness bound only (the loop ends as soon as all 8 are answered): generous, since
    # a busy CI machine can slow a CPU executor several times over.
    deadline = time.monotonic() + 60.0
    while len(served) < 8 and time.monotonic() < deadline:
        done.acquire(timeout=0.1)
    assert served == [True] * 8
    # Bounded: at most one overrun per three duty cycles (plus the first).
    assert 1 <= rt.cycle.overruns <= rt.cycle.cycles // 3 + 1


def test_slo_plan_keeps_headroom_for_a_segment_that_will_overrun(tmp_path) -> None:
    onnx.save(mlp(64, 2), str(tmp_path / "slo.onnx"))
    onnx.save(one_matmul(rows=4, width=64), str(tmp_path / "long.onnx"))
    # Profiles fixed by the store so the plan is exact: 5 ms per item + 1 ms, and a
    # best-effort job of one 30 ms segment, longer than the plain plan's 28 ms slack.
    profiles = {"slo": BatchingProfile.linear("slo", "cpu", 5.0, 1.0, max_batch=64),
                "long": BatchingProfile.linear("long", "cpu", 0.1, 29.9, max_batch=64)}
    executor = OrtExecutor("cpu", limits=ModelLimits(store_root=tmp_path, profile_repeats=1))
    rt = ServingRuntime(executor, MonotonicClock(), RuntimeConfig("cpu"), profiles=profiles)
    plain = rt.add_slo_session("s", "slo.onnx", slo_ms=100.0, rate_rps=100.0)
    assert plain["duty_cycle_ms"] * (1 - plain["occupancy"]) < 30.0
    rt.add_best_effort_session("be", "long.onnx")
    headroom = rt.snapshot()["overrun_headroom_ms"]
    assert headroom == pytest.approx(30.0)
    (alloc,) = rt.planning.plan.allocations
    assert alloc.latency_ms + headroom <= 100.0 < plain["worst_case_latency_ms"] + headroom
    assert alloc.session.slo_ms == 70.0
    assert rt.input_contract("s")[2] == 100.0  # deadlines keep the SLO
    rt.remove_session("be")
    assert rt.snapshot()["overrun_headroom_ms"] == 0.0
    assert rt.planning.plan.duty_cycle_ms == pytest.approx(plain["duty_cycle_ms"])


def test_overrun_every_cycles_is_validated() -> None:
    with pytest.raises(ValueError, match="overrun_every_cycles"):
        RuntimeConfig("cpu", overrun_every_cycles=0)
