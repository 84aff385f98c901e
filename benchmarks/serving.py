"""Inference-server benchmark: duty cycles, early drop, quanta, against naive co-location.

Run (CPU, the committed result):
    .venv/bin/python benchmarks/serving.py
On a GPU (ready, needs onnxruntime-gpu; not run in this session):
    .venv/bin/python benchmarks/serving.py --executor onnxruntime --device cuda
On a GPU with a CUDA build of torch and CPU-only onnxruntime (the ONNX graphs run by torch):
    .venv/bin/python benchmarks/serving.py --executor torch --device cuda
Both real executors beside the simulated sections, in one run:
    .venv/bin/python benchmarks/serving.py --real-executors onnxruntime,torch
The held-out load through the server's HTTP endpoint (``serving_http.py``: three
sessions, clients in another process, as the machine is and beside a CPU hog, on
ONNX Runtime and torch; writes benchmarks/results/serving_http_cpu.json):
    .venv/bin/python benchmarks/serving.py --http-load

Prints one JSON object and writes benchmarks/results/serving_<device>.json
(serving_torch_<device>.json for a torch-only run).

Sections (sim = the profile-driven executor on a virtual clock, real Nexus TITAN X
profiles; it executes the measured mean latency with the measured std as Gaussian
noise, while planning uses Nexus's (mean + std) * 1.15):

- ``colocation``: 4 SLO models at 90% of the planned capacity of one GPU (the
  largest uniform scale of a rate mix that ``plan_gpu`` accepts), Poisson arrivals,
  plus best-effort jobs in the slack: SLO attainment, scheduler overhead (CPU time
  of decisions / GPU busy time), quantum length vs Q, Jain index, weighted shares.
- ``vs_naive``: highest load at which every session keeps >= 99% SLO attainment,
  ours vs naive co-location (one thread per model, batches as large as the model
  alone would use, no coordination, all sharing the device as processor sharing,
  requests already past their deadline dropped). Same profiles, same arrivals.
- ``early_vs_lazy``: Nexus Fig. 9: SLO 100 ms, best throughput 500 rps, max rate at
  99% attainment for several alpha.
- ``realtime_sim``: the same runtime on the real clock (executor thread sleeps),
  to measure loop overhead outside virtual time.
- ``onnxruntime``: the real executor (ONNX Runtime, CPU EP by default; see
  serving_ort.py): 3 SLO sessions at 90% of planned capacity under Poisson load
  with attainment measured by the client, fair and weighted shares of best-effort
  jobs with mixed batch sizes, and the segmentation overhead as measured.
- ``torch``: the same sections with the ONNX graphs run by torch (``TorchExecutor``),
  when asked for.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import _common
import numpy as np

from agent.inference.clock import MonotonicClock, VirtualClock
from agent.inference.errors import AdmissionRefused
from agent.inference.executors.executors import SimExecutor
from agent.inference.preparation.batching_profiles import load_nexus
from agent.inference.quanta import jain_index, weighted_share_errors
from agent.inference.runtime.batch_formation import DropPolicy
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from benchmarks.serving_ort import onnxruntime_sections
from lab.replay import Arrival, merge, poisson_arrivals, replay
from planner import GpuPlan, SessionSpec, plan_gpu, saturated_config
from predictor.batching import BatchingProfile
from predictor.profiles import NEXUS_MARGIN, NO_MARGIN

GPU = "titanx"
NEXUS_DIR = _common.ROOT / "training_data" / "nexus-profiles"
# (session, model, SLO ms, relative rate): a mix in the spirit of Nexus's game/traffic apps.
MIX = [("vgg16", "vgg16", 200.0, 1.0), ("face", "vgg_face", 300.0, 0.6),
       ("vgg_s", "vgg_s", 100.0, 3.0), ("yolo", "yolo9000", 500.0, 0.3)]  # fmt: skip
JITTER_STD_FRACTION = 0.02  # Olympian's measured run-to-run spread of GPU duration: 1.7%


def nexus_profiles() -> tuple[dict[str, BatchingProfile], dict[str, BatchingProfile], float]:
    """Planning profiles (mean+std)*1.15, executed profiles (mean), mean relative std."""
    raw = load_nexus(NEXUS_DIR)
    planned = {p.model: p.to_profile(GPU, NEXUS_MARGIN) for p in raw}
    executed = {p.model: p.to_profile(GPU, NO_MARGIN) for p in raw}
    rel_std = statistics.mean(s / m for p in raw for m, s in zip(p.mean_ms, p.std_ms, strict=True))
    return planned, executed, rel_std


def capacity_scale(profiles: dict[str, BatchingProfile]) -> tuple[float, GpuPlan]:
    """Largest scale s such that the MIX at rates s*relative is feasible on one GPU."""
    lo, hi = 0.1, 1000.0
    plan = None
    for _ in range(40):
        mid = (lo + hi) / 2
        specs = [SessionSpec(n, m, slo, mid * r) for n, m, slo, r in MIX]
        result = plan_gpu(specs, {(m, GPU): p for m, p in profiles.items()}, GPU, 1e12)
        if isinstance(result, GpuPlan):
            lo, plan = mid, result
        else:
            hi = mid
    assert plan is not None
    return lo, plan


def sim_runtime(
    planned,
    executed,
    seed: int,
    policy: DropPolicy = DropPolicy.EARLY,
    quantum_ms: float | None = None,
    replan_interval_ms: float = 1e12,
) -> tuple[ServingRuntime, VirtualClock]:
    clock = VirtualClock()
    executor = SimExecutor(executed, clock, GPU, jitter_fraction=JITTER_STD_FRACTION, seed=seed)
    config = RuntimeConfig(
        GPU, drop_policy=policy, quantum_ms=quantum_ms, min_replan_interval_ms=replan_interval_ms
    )
    return ServingRuntime(executor, clock, config, profiles=planned), clock


def colocation(planned, executed, scale: float, duration_ms: float) -> dict:
    results = {}
    for label, weights in (
        ("equal", {"be1": 1, "be2": 1, "be3": 1}),
        ("weighted", {"be1": 1, "be2": 2, "be3": 3}),
    ):
        rt, clock = sim_runtime(planned, executed, seed=11)
        for n, m, slo, r in MIX:
            rt.add_slo_session(n, m, slo, scale * r)
        for name, w in weights.items():
            rt.add_best_effort_session(name, "vgg_s", weight=w)
        streams = [
            poisson_arrivals(n, 0.9 * scale * r, duration_ms, seed=i)
            for i, (n, _m, _s, r) in enumerate(MIX)
        ]
        backlog = [[Arrival(0.0, name)] * 100_000 for name in weights]
        replay(rt, clock, merge(*streams, *backlog), duration_ms)
        snap = rt.snapshot()
        by = {s["name"]: s for s in snap["sessions"]}
        shares = {n: by[n]["gpu_time_ms"] for n in weights}
        quanta = [by[n]["quantum_mean_ms"] for n in weights]
        stds = [by[n]["quantum_std_ms"] / by[n]["quantum_mean_ms"] for n in weights]
        results[label] = {
            "slo_attainment": {n: round(by[n]["slo_attainment"], 5) for n, *_ in MIX},
            "min_slo_attainment": min(by[n]["slo_attainment"] for n, *_ in MIX),
            "batches_mean": {
                n: round(
                    sum(int(b) * c for b, c in by[n]["batch_sizes"].items())
                    / max(1, sum(by[n]["batch_sizes"].values())),
                    2,
                )
                for n, *_ in MIX
            },  # fmt: skip
            "planned_batch": {n: by[n]["batch"] for n, *_ in MIX},
            "duty_cycle_ms": snap["duty_cycle_ms"],
            "occupancy": snap["occupancy"],
            "gpu_busy_share": snap["busy_ms"] / duration_ms,
            "scheduler_overhead_share": snap["scheduler_seconds"] * 1000.0 / snap["busy_ms"],
            "quantum_target_ms": snap["quantum_ms"],
            "quantum_mean_ms": {n: round(q, 4) for n, q in zip(weights, quanta, strict=True)},
            "quantum_mean_error_max": max(abs(q / snap["quantum_ms"] - 1) for q in quanta),
            "quantum_rel_std_max": max(stds),
            "be_gpu_ms": {n: round(v, 1) for n, v in shares.items()},
            "jain_index": jain_index(shares.values()),
            "weighted_share_error_max": max(
                abs(e) for e in weighted_share_errors(shares, weights).values()
            ),
        }
    return results


def ours_attainment(
    planned, executed, scale: float, capacity: float, duration_ms: float, seed: int
) -> float:
    """Sessions registered at their rates (capped at the planned capacity: admission),
    offered ``scale``; the runtime replans from observed rates where it can."""
    rt, clock = sim_runtime(planned, executed, seed, replan_interval_ms=2000.0)
    for n, m, slo, r in MIX:
        rt.add_slo_session(n, m, slo, min(scale, capacity) * r)
    streams = [
        poisson_arrivals(n, scale * r, duration_ms, seed=seed + i)
        for i, (n, _m, _s, r) in enumerate(MIX)
    ]
    replay(rt, clock, merge(*streams), duration_ms + 1000)
    return min(s["slo_attainment"] for s in rt.snapshot()["sessions"])


def naive_attainment(planned, executed, scale: float, duration_ms: float, seed: int) -> float:
    """One thread per model, each batching greedily; the device shared as processor sharing."""
    rng = random.Random(seed)
    arrivals = merge(
        *[
            poisson_arrivals(n, scale * r, duration_ms, seed=seed + i)
            for i, (n, _m, _s, r) in enumerate(MIX)
        ]
    )
    info = {}
    for n, m, slo, _r in MIX:
        config = saturated_config(planned[m], slo)
        info[n] = (executed[m], slo, config.batch if config else 1)
    queues: dict[str, list[float]] = {n: [] for n, *_ in MIX}
    running: dict[str, tuple[float, list[float]]] = {}  # session -> (remaining work ms, arrivals)
    good = {n: 0 for n in queues}
    total = {n: 0 for n in queues}
    now, i = 0.0, 0
    end = duration_ms + 1000
    while now < end:
        for n, q in queues.items():  # idle threads start a batch of what is queued
            if n in running or not q:
                continue
            profile, slo, max_b = info[n]
            live = [a for a in q if a + slo > now]
            total[n] += len(q) - len(live)  # already late: dropped
            q[:] = live
            if not q:
                continue
            batch, q[:] = q[:max_b], q[max_b:]
            work = profile.latency_ms(len(batch)) * max(0.0, 1 + rng.gauss(0, JITTER_STD_FRACTION))
            running[n] = (work, batch)
        k = len(running)
        next_done = min((w for w, _ in running.values()), default=None)
        t_done = now + next_done * k if next_done is not None else float("inf")
        t_arr = arrivals[i].at_ms if i < len(arrivals) else float("inf")
        t = min(t_done, t_arr, end)
        if k:
            progressed = (t - now) / k
            running = {n: (w - progressed, b) for n, (w, b) in running.items()}
        now = t
        for n in [n for n, (w, _) in running.items() if w <= 1e-9]:
            _w, batch = running.pop(n)
            slo = info[n][1]
            total[n] += len(batch)
            good[n] += sum(1 for a in batch if now <= a + slo)
        while i < len(arrivals) and arrivals[i].at_ms <= now:
            queues[arrivals[i].session].append(arrivals[i].at_ms)
            i += 1
    return min(good[n] / total[n] if total[n] else 1.0 for n in queues)


def max_scale(attainment, lo: float, hi: float, goal: float = 0.99, steps: int = 9) -> float:
    for _ in range(steps):
        mid = (lo + hi) / 2
        if attainment(mid) >= goal:
            lo = mid
        else:
            hi = mid
    return lo


def vs_naive(planned, executed, capacity: float, duration_ms: float) -> dict:
    ours = max_scale(
        lambda s: ours_attainment(planned, executed, s, capacity, duration_ms, 5),
        0.05 * capacity,
        1.2 * capacity,
    )
    naive = max_scale(
        lambda s: naive_attainment(planned, executed, s, duration_ms, 5),
        0.01 * capacity,
        1.2 * capacity,
    )
    total_rate = sum(r for *_, r in MIX)
    return {
        "goal_slo_attainment": 0.99,
        "ours_max_throughput_rps": ours * total_rate,
        "naive_max_throughput_rps": naive * total_rate,
        "throughput_ratio": ours / naive if naive else None,
        "planned_capacity_rps": capacity * total_rate,
    }


def early_vs_lazy(duration_ms: float) -> dict:
    rows = []
    for alpha in (0.5, 1.0, 1.5):
        beta = 50.0 - 25.0 * alpha  # l(25) = 50 ms: best throughput 500 rps under 2*l(b) <= 100
        profile = BatchingProfile.linear("m", GPU, alpha, beta, max_batch=64)
        row = {"alpha_ms": alpha, "beta_ms": beta}
        for policy in DropPolicy:

            def attainment(
                rate: float, policy: DropPolicy = policy, profile: BatchingProfile = profile
            ) -> float:
                clock = VirtualClock()
                rt = ServingRuntime(
                    SimExecutor({"m": profile}, clock, GPU),
                    clock,
                    RuntimeConfig(GPU, drop_policy=policy, min_replan_interval_ms=1e12),
                )
                try:
                    rt.add_slo_session("s", "m", 100.0, rate)
                except AdmissionRefused:
                    return 0.0
                replay(rt, clock, poisson_arrivals("s", rate, duration_ms, seed=3), duration_ms)
                return rt.snapshot()["sessions"][0]["slo_attainment"]

            row[f"{policy.value}_max_rps_at_99"] = round(max_scale(attainment, 10.0, 520.0), 1)
        row["early_over_lazy"] = row["early_max_rps_at_99"] / max(row["lazy_max_rps_at_99"], 1e-9)
        rows.append(row)
    return {"slo_ms": 100.0, "rows": rows}


def realtime_sim(planned, executed, scale: float, seconds: float) -> dict:
    clock = MonotonicClock()
    rt = ServingRuntime(
        SimExecutor(executed, clock, GPU),
        clock,
        RuntimeConfig(GPU, min_replan_interval_ms=1e12),
        profiles=planned,
        post_workers=2,
    )
    for n, m, slo, r in MIX:
        rt.add_slo_session(n, m, slo, scale * r)
    rt.add_best_effort_session("be", "vgg_s")
    rt.start()
    for _ in range(100_000):
        rt.submit("be", np.zeros((1, 1), np.float32), lambda _o: None)
    stop = time.monotonic() + seconds
    streams = merge(
        *[
            poisson_arrivals(n, 0.9 * scale * r, seconds * 1000, seed=i)
            for i, (n, _m, _s, r) in enumerate(MIX)
        ]
    )
    busy0, sched0 = rt.snapshot()["busy_ms"], rt.snapshot()["scheduler_seconds"]
    t0 = clock.now_ms()
    for a in streams:
        delay = (t0 + a.at_ms - clock.now_ms()) / 1000.0
        if delay > 0:
            time.sleep(delay)
        rt.submit(a.session, np.zeros((1, 1), np.float32), lambda _o: None)
        if time.monotonic() > stop:
            break
    wall_ms = clock.now_ms() - t0
    snap = rt.snapshot()
    snap["busy_ms"] -= busy0
    snap["scheduler_seconds"] -= sched0
    rt.stop()
    by = {s["name"]: s for s in snap["sessions"]}
    # Segments sleep on the real clock here: time.sleep overshoot on a loaded machine
    # lengthens every segment, so quantum lengths measure the OS, not the scheduler.
    return {
        "seconds": seconds,
        "gpu_busy_share": snap["busy_ms"] / wall_ms,
        "loop_overhead_share": 1 - snap["busy_ms"] / wall_ms,
        "scheduler_overhead_share": snap["scheduler_seconds"] * 1000 / snap["busy_ms"],
        "min_slo_attainment": min(by[n]["slo_attainment"] for n, *_ in MIX),
        "quantum_mean_ms": by["be"]["quantum_mean_ms"],
        "quantum_target_ms": snap["quantum_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--executor",
        choices=["sim", "onnxruntime", "torch"],
        default="sim",
        help="sim: every section; onnxruntime or torch: only that real-model section",
    )
    parser.add_argument(
        "--real-executors",
        default="onnxruntime",
        help="with --executor sim: the real executors run beside it (onnxruntime,torch)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--duration-s", type=float, default=60.0, help="virtual seconds per run")
    parser.add_argument("--realtime-s", type=float, default=3.0)
    parser.add_argument(
        "--ort-s", type=float, default=10.0, help="seconds of Poisson load on the real executor"
    )
    parser.add_argument("--http-load", action="store_true",
                        help="only the HTTP scenario of serving_http.py")
    parser.add_argument("--http-seconds", type=float, default=10.0,
                        help="seconds of load per HTTP scenario")
    parser.add_argument("--http-baseline", type=Path, default=None,
                        help="another checkout whose server runs the HTTP load too")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the result's notes (how the machine was)")
    _common.add_out_option(parser, None)  # default: serving_cpu.json or serving_gpu.json
    args = parser.parse_args()
    if args.http_load:
        from benchmarks.serving_http import http_load

        started = time.perf_counter()
        out = {"benchmark": "serving_http",
               **http_load(args.http_seconds, ["onnxruntime", "torch"], 60.0,
                           args.http_baseline)}
        out["notes"] = args.note
        out["wall_seconds"] = time.perf_counter() - started
        out.update(_common.context(("numpy", "onnxruntime", "torch", "cheroot")))
        _common.write_result(out, args.out or _common.RESULTS / "serving_http_cpu.json")
        return
    real = args.real_executors.split(",") if args.executor == "sim" else [args.executor]
    unknown = sorted(set(real) - {"onnxruntime", "torch"})
    if unknown:
        parser.error(f"--real-executors: unknown {unknown}; choose from onnxruntime, torch")
    started = time.perf_counter()
    out: dict = {"benchmark": "serving"}
    if args.executor == "sim":
        planned, executed, rel_std = nexus_profiles()
        scale, plan = capacity_scale(planned)
        out["profiles"] = {
            "source": str(NEXUS_DIR.relative_to(_common.ROOT.parent)),
            "planning_margin": "(mean + std) * 1.15",
            "executed": "mean, Gaussian noise of "
            f"{JITTER_STD_FRACTION:.0%} std (profiles' own: {rel_std:.1%})",
        }
        out["capacity"] = {
            "scale": scale,
            "rates_rps": {n: scale * r for n, _m, _s, r in MIX},
            "duty_cycle_ms": plan.duty_cycle_ms,
            "occupancy": plan.occupancy,
            "offered_share_of_capacity": 0.9,
        }
        duration = args.duration_s * 1000
        out["colocation"] = colocation(planned, executed, scale, duration)
        out["vs_naive"] = vs_naive(planned, executed, scale, duration / 3)
        out["early_vs_lazy"] = early_vs_lazy(duration / 3)
        out["realtime_sim"] = realtime_sim(planned, executed, scale, args.realtime_s)
    # The real executors beside the simulated one, in the same run (serving_ort.py).
    for kind in real:
        out[kind] = onnxruntime_sections(args.device, args.ort_s, kind)
    out["wall_seconds"] = time.perf_counter() - started
    out.update(_common.context(("numpy", "onnxruntime", *(["torch"] if "torch" in real else []))))
    name = "serving_cpu" if args.device == "cpu" else "serving_gpu"
    if real == ["torch"] and args.executor == "torch":
        name = f"serving_torch_{args.device}"
    _common.write_result(out, args.out or _common.RESULTS / f"{name}.json")


if __name__ == "__main__":
    main()
