"""Real-executor sections of the serving benchmark: ONNX Runtime (CPU EP unless --device
cuda) or the same ONNX graphs run by torch (``--executor torch``).

Generated MLP chains, profiled by the server at registration, run on the real clock:

- ``slo``: 3 SLO sessions at 90% of the planned capacity of their mix, Poisson
  arrivals, plus a backlogged best-effort job in the slack. SLO attainment as the
  client sees it (answered within the SLO, measured from send to answer; drops
  count as misses) and as the server counts it.
- ``sharing``: best-effort jobs only, every one kept backlogged by a closed-loop
  client, with mixed batch sizes: Jain index of executor time under the fair
  policy, relative share errors under weights 1:2:3. Goal: every share within
  ``SHARE_GOAL`` (5%) of its weight's (a wall-clock figure, so measured here and
  not in the unit tests).
- overhead: the best-effort job's segments run in sequence against one whole run
  (measured), the overhead curve's prediction at the chosen Q, the scheduler's
  CPU time over executor busy time.

Figures are CPU figures (ONNX Runtime or torch) on the machine named in the result
unless the result says ``cuda``. The machine may be shared: the load average is
recorded before and after.
Imported by ``benchmarks/serving.py`` (as ``benchmarks.serving_ort``), which runs it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

from agent.inference.clock import MonotonicClock
from agent.inference.errors import AdmissionRefused, SessionNotFound
from agent.inference.executors.executors import Executor, OrtExecutor
from agent.inference.preparation.limits import ModelLimits
from agent.inference.quanta import jain_index, weighted_share_errors
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from lab.replay import merge, poisson_arrivals
from planner import GpuPlan, SessionSpec, plan_gpu

if TYPE_CHECKING:
    from agent.inference.executors.torch_executor import TorchExecutor

SHARE_GOAL = 0.05
"""Largest relative error of a job's executor-time share against its weight's."""
SLO_MIX = [("m1", 6, 150.0), ("m2", 10, 250.0), ("m3", 4, 100.0)]  # (name, layers, SLO ms)


def mlp(width: int, layers: int, seed: int = 0):
    """MatMul+Relu chain on [N, width]; a cut after every node."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]  # fmt: skip
        prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])], initializer=inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def executor_label(kind: str, device: str) -> str:
    """How results name a real executor: ``onnxruntime CPU EP``, ``torch CUDA``."""
    suffix = " EP" if kind == "onnxruntime" else ""
    return f"{kind} {device.upper()}{suffix}"


def _runtime(device: str, store: Path, kind: str = "onnxruntime"
             ) -> tuple[ServingRuntime, Executor]:
    limits = ModelLimits(store_root=store)
    threads = 1 if device == "cpu" else 0  # one core on the CPU, as a device of its own
    executor: OrtExecutor | TorchExecutor
    if kind == "torch":
        from agent.inference.executors.torch_executor import TorchExecutor

        executor = TorchExecutor(device, limits=limits, intra_op_threads=threads or None)
    else:
        executor = OrtExecutor(device, limits=limits, intra_op_threads=threads)
    config = RuntimeConfig(
        executor.gpu_type, min_replan_interval_ms=1e12, learn_latency_margin=True
    )
    rt = ServingRuntime(executor, MonotonicClock(), config, post_workers=1)
    rt.start()
    return rt, executor


def _capacity(rt: ServingRuntime, gpu_type: str) -> float:
    """Largest per-session rate at which the mix is feasible (the planner's own answer)."""
    profiles = {(n, gpu_type): rt.planning.planned(rt.profile(n)) for n, *_ in SLO_MIX}
    lo, hi = 1.0, 5000.0
    for _ in range(30):
        mid = (lo + hi) / 2
        specs = [SessionSpec(n, n, slo, mid) for n, _l, slo in SLO_MIX]
        ok = isinstance(plan_gpu(specs, profiles, gpu_type, 1e12), GpuPlan)
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def _keep_backlogged(rt: ServingRuntime, name: str, tensor: np.ndarray, depth: int) -> None:
    def again(_outcome) -> None:
        if rt.is_running():
            rt.submit(name, tensor, again)

    for _ in range(depth):
        rt.submit(name, tensor, again)


def _offer(rt: ServingRuntime, rate: float, seconds: float, x: np.ndarray, record) -> None:
    """Poisson arrivals at ``rate`` to every SLO session for ``seconds`` (real clock)."""
    arrivals = merge(*[poisson_arrivals(n, rate, seconds * 1000, seed=i)
                       for i, (n, *_r) in enumerate(SLO_MIX)])  # fmt: skip
    t0 = time.perf_counter()
    for a in arrivals:
        delay = t0 + a.at_ms / 1000.0 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        rt.submit(a.session, x, record(a.session, time.perf_counter()))


def slo_section(device: str, seconds: float, width: int, store: Path,
                kind: str = "onnxruntime") -> dict:
    """3 SLO sessions at 90% of planned capacity + a best-effort job; client-side attainment.

    A warm-up at half the capacity lets the server learn its latency margin from
    observed batch times; the capacity is then the planner's answer with that margin.
    """
    for name, layers, _slo in SLO_MIX + [("be", 16, 0.0)]:
        save(mlp(width, layers, sum(map(ord, name))), str(store / f"{name}.onnx"))
    rt, executor = _runtime(device, store, kind)
    try:
        for name, _layers, slo in SLO_MIX:
            rt.add_slo_session(name, f"{name}.onnx", slo, 5.0)
        x = np.zeros((1, width), np.float32)
        warm = 0.5 * _capacity(rt, executor.gpu_type)
        for name, _layers, slo in SLO_MIX:
            rt.remove_session(name)
            rt.add_slo_session(name, f"{name}.onnx", slo, warm)
        _offer(rt, warm, min(seconds, 4.0), x, lambda _n, _t: lambda _o: None)
        time.sleep(1.1)  # one more rate window: the margin refreshes
        # The job registers while the SLO sessions leave slack (a job that would find
        # none is refused, NoBestEffortSlack); then they take the planned capacity, and
        # its pieces run in what the cycles leave.
        be = rt.add_best_effort_session("be", "be.onnx")
        for _attempt in range(5):  # the margin may refresh between asking and registering
            capacity, placed = _capacity(rt, executor.gpu_type), True
            for name, _layers, slo in SLO_MIX:
                rt.remove_session(name)
                try:
                    answer = rt.add_slo_session(name, f"{name}.onnx", slo, capacity)
                except AdmissionRefused:
                    placed = False
                    break
            if placed:
                break
            # Refused (the margin grew meanwhile): every session back at a token rate, so
            # that none is missing when the capacity is asked again.
            try:
                for name, _layers, slo in SLO_MIX:
                    with contextlib.suppress(SessionNotFound):
                        rt.remove_session(name)
                    rt.add_slo_session(name, f"{name}.onnx", slo, 1.0)
            except AdmissionRefused as exc:  # a host this busy holds none: say so, go on
                return {"executor": executor_label(kind, device), "skipped": str(exc)}
        if not placed:
            return {"executor": executor_label(kind, device),
                    "skipped": "the planned capacity was refused five times"}
        _keep_backlogged(rt, "be", np.zeros((4, width), np.float32), depth=4)
        rate = 0.9 * capacity
        slos = {n: slo for n, _l, slo in SLO_MIX}
        sent = dict.fromkeys(slos, 0)
        within = dict.fromkeys(slos, 0)
        lock = threading.Lock()

        def record(name: str, t_send: float):
            def done(outcome) -> None:
                late = (time.perf_counter() - t_send) * 1000.0 > slos[name]
                with lock:
                    within[name] += outcome.reason is None and not late
            return done

        def counted(name: str, t_send: float):
            sent[name] += 1
            return record(name, t_send)

        t0 = time.perf_counter()
        busy0 = rt.snapshot()["busy_ms"]
        _offer(rt, rate, seconds, x, counted)
        time.sleep(max(slos.values()) / 1000.0 + 0.2)  # the last answers arrive
        wall_ms = (time.perf_counter() - t0) * 1000.0
        snap = rt.snapshot()
    finally:
        rt.stop()
    by = {s["name"]: s for s in snap["sessions"]}
    with lock:
        client = {n: within[n] / sent[n] if sent[n] else None for n in slos}
    curve = rt.sessions.curves.get("be")
    q = snap["quantum_ms"]
    return {
        "executor": executor_label(kind, device),
        "width": width,
        "planned_capacity_per_session_rps": capacity,
        "offered_rate_per_session_rps": rate,
        "latency_margin_learned": snap["latency_margin"],
        "duty_cycle_ms": snap["duty_cycle_ms"],
        "occupancy": snap["occupancy"],
        "profiles": {n: rt.profile(n).latency_ms(1) for n in slos} | {"batch": answer["batch"]},
        "requests_sent": sent,
        "slo_attainment_client": client,
        "min_slo_attainment_client": min(v for v in client.values() if v is not None),
        "slo_attainment_server": {n: by[n]["slo_attainment"] for n in slos},
        "best_effort": {
            "cuts": be["cuts"], "segments": be["segments"], "quantum_ms": q,
            "served": by["be"]["served"],
            "quantum_mean_ms": by["be"]["quantum_mean_ms"],
            "quantum_std_ms": by["be"]["quantum_std_ms"],
        },  # fmt: skip
        "overhead": {
            "segments_measured": be["segment_overhead"],
            "curve_predicted_at_q": curve.curve(q) if curve is not None else None,
            "scheduler_share_of_busy": snap["scheduler_seconds"] * 1000 / max(snap["busy_ms"], 1),
        },
        "executor_busy_share": (snap["busy_ms"] - busy0) / wall_ms,
        "overruns": snap["overruns"],
    }


def sharing_section(device: str, seconds: float, width: int, store: Path,
                    kind: str = "onnxruntime") -> dict:
    """Best-effort jobs with mixed batch sizes, all backlogged: fair and weighted shares."""
    save(mlp(width, 8, 7), str(store / "job.onnx"))
    out = {}
    for label, jobs in (
        ("fair", {"b64": (1, 64), "b8": (1, 8), "b1": (1, 1)}),
        ("weighted", {"w1_b1": (1, 1), "w2_b16": (2, 16), "w3_b64": (3, 64)}),
    ):
        rt, _executor = _runtime(device, store, kind)
        try:
            for name, (weight, _batch) in jobs.items():
                rt.add_best_effort_session(name, "job.onnx", weight=weight)
            for name, (_weight, batch) in jobs.items():
                _keep_backlogged(rt, name, np.ones((batch, width), np.float32), depth=64)
            time.sleep(0.3)
            before = {s["name"]: s["gpu_time_ms"] for s in rt.snapshot()["sessions"]}
            time.sleep(seconds)
            snap = rt.snapshot()
        finally:
            rt.stop()
        shares = {s["name"]: s["gpu_time_ms"] - before[s["name"]] for s in snap["sessions"]}
        total = sum(shares.values())
        weights = {n: w for n, (w, _b) in jobs.items()}
        errors = weighted_share_errors(shares, weights)
        out[label] = {
            "jobs": {n: {"weight": w, "batch": b} for n, (w, b) in jobs.items()},
            "share_of_executor_time": {n: round(v / total, 4) for n, v in shares.items()},
            "jain_index_of_weight_normalised_time": jain_index(
                shares[n] / weights[n] for n in shares),
            "max_abs_share_error": max(abs(e) for e in errors.values()),
            "meets_share_goal": max(abs(e) for e in errors.values()) <= SHARE_GOAL,
            "quantum_ms": snap["quantum_ms"],
        }  # fmt: skip
    return out


def onnxruntime_sections(device: str, seconds: float, kind: str = "onnxruntime") -> dict:
    """Every real-executor section (ONNX Runtime, or ``kind`` torch), with the load average."""
    width = 1024 if device == "cpu" else 4096
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        slo = slo_section(device, seconds, width, Path(tmp), kind)
        sharing = sharing_section(device, min(seconds, 3.0), 256, Path(tmp), kind)
    return {
        "executor": f"{executor_label(kind, device)} (real models, real clock)",
        "device": device,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "slo": slo,
        "sharing": sharing,
    }
