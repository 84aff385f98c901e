"""Planner benchmark: greedy vs exact, efficiency vs a lower bound, Harpagon switches, speed.

Run: .venv/bin/python benchmarks/planner.py [--seed N]
Prints one JSON object and writes benchmarks/results/planner.json.
Workloads are random (seeded) over the real TITAN X profiles in
../shared/data/nexus-profiles (parsed with predictor.profiles) plus linear profiles.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extender.planner import SessionSpec  # noqa: E402
from extender.planner.bounds import gpu_lower_bound  # noqa: E402
from extender.planner.exact import exact_pack  # noqa: E402
from extender.planner.options import SWITCHES, GpuType, HarpagonOptions  # noqa: E402
from extender.planner.packing import pack  # noqa: E402
from extender.planner.replan import replan  # noqa: E402
from extender.planner.saturate import ProfileIndex  # noqa: E402
from predictor.batching import BatchingProfile  # noqa: E402
from predictor.profiles import load_nexus_dir  # noqa: E402

GPU = "titanx"
TYPES = [GpuType(GPU, 12288)]
SLOS_MS = [100.0, 200.0, 300.0, 500.0]


def load_profiles() -> dict[tuple[str, str], BatchingProfile]:
    profiles = {}
    for nexus in load_nexus_dir(ROOT.parent / "shared" / "data" / "nexus-profiles"):
        p = nexus.to_profile(GPU)
        profiles[(p.model, GPU)] = p
    rng = random.Random(7)
    for i in range(6):
        name = f"linear{i}"
        profiles[(name, GPU)] = BatchingProfile.linear(
            name, GPU, rng.uniform(0.5, 4.0), rng.uniform(3.0, 25.0), rng.uniform(300, 2000), 64
        )
    return profiles


def workload(rng: random.Random, models: list[str], n: int, max_rate: float) -> list[SessionSpec]:
    return [
        SessionSpec(f"s{i}", rng.choice(models), rng.choice(SLOS_MS), rng.uniform(2.0, max_rate))
        for i in range(n)
    ]


def feasible(sessions, profiles) -> list[SessionSpec]:
    return [s for s in sessions if ProfileIndex(profiles[(s.model, GPU)]).best_batch_rr(s.slo_ms)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--small", type=int, default=150)
    parser.add_argument("--large", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    profiles = load_profiles()
    models = sorted(m for m, _ in profiles)

    optimal = total = 0
    for _ in range(args.small):
        sessions = feasible(workload(rng, models, 8, 40.0), profiles)
        exact = exact_pack(sessions, profiles, TYPES)
        if exact is None:
            continue
        greedy = pack(sessions, profiles, TYPES)
        total += 1
        optimal += greedy.gpu_count == exact.gpu_count

    efficiencies, textbook = [], []
    moves_share, replan_gpus_ratio = [], []
    savings = {k: [] for k in (*SWITCHES, "all")}
    for _ in range(args.large):
        sessions = feasible(workload(rng, models, 300, 400.0), profiles)
        base = pack(sessions, profiles, TYPES)
        bound = gpu_lower_bound(sessions, profiles, TYPES)
        efficiencies.append(bound.gpus / base.gpu_count)
        textbook.append(bound.throughput_only / base.gpu_count)
        # Next epoch: every rate drifts by up to +-20%, 5% of sessions leave, 5% arrive.
        drifted = [
            SessionSpec(s.name, s.model, s.slo_ms, s.rate_rps * rng.uniform(0.8, 1.2))
            for s in sessions
            if rng.random() > 0.05
        ] + [
            SessionSpec(f"n{i}", s.model, s.slo_ms, s.rate_rps)
            for i, s in enumerate(feasible(workload(rng, models, 15, 400.0), profiles))
        ]
        incremental = replan(base, drifted, profiles, TYPES)
        scratch = pack(drifted, profiles, TYPES)
        shares = sum(len(g.plan.allocations) for g in scratch.gpus)
        moves_share.append(len(incremental.moves) / shares)
        replan_gpus_ratio.append(incremental.gpu_count / scratch.gpu_count)
        for switch in savings:
            opts = (
                HarpagonOptions.harpagon() if switch == "all" else HarpagonOptions(**{switch: True})
            )
            other = pack(sessions, profiles, TYPES, opts)
            savings[switch].append(1.0 - other.total_cost / base.total_cost)

    timings = {}
    for n in (100, 1000):
        sessions = feasible(workload(rng, models, n, 400.0), profiles)
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            pack(sessions, profiles, TYPES)
            runs.append((time.perf_counter() - t0) * 1000.0)
        timings[f"plan_ms_{n}_sessions"] = round(statistics.median(runs), 2)

    import numpy
    import yaml

    result = {
        "small_workloads": total,
        "greedy_optimal_share": round(optimal / max(total, 1), 4),
        "large_workloads": len(efficiencies),
        "efficiency_vs_lower_bound_mean": round(statistics.mean(efficiencies), 4),
        "efficiency_vs_lower_bound_min": round(min(efficiencies), 4),
        "lower_bound": "bounds.gpu_lower_bound: sum of g(R) (least GPU share under Nexus rules)"
        " plus memory-exclusive GPUs; valid for any Nexus plan (tested against the exact solver)",
        "efficiency_vs_throughput_only_bound_mean": round(statistics.mean(textbook), 4),
        "replan_moves_per_share_mean": round(statistics.mean(moves_share), 4),
        "replan_gpus_vs_scratch_mean": round(statistics.mean(replan_gpus_ratio), 4),
        "replan_epoch": "rates +-20%, 5% of sessions leave, ~5% arrive",
        "harpagon_saving_mean": {k: round(statistics.mean(v), 4) for k, v in savings.items()},
        **timings,
        "goals": {
            "greedy_optimal_share": 0.95,
            "efficiency": 0.90,
            "plan_ms_100": 10,
            "plan_ms_1000": 200,
        },
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "pyyaml": yaml.__version__,
            "busy": "shared machine, several engineers running tests at the same time",
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "benchmarks/planner.py", *sys.argv[1:]]),
        "seed": args.seed,
    }
    text = json.dumps(result, indent=2)
    print(text)
    out = ROOT / "benchmarks" / "results" / "planner.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n", encoding="utf-8")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
