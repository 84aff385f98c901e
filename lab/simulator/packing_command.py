"""``tandem simulate --pods FILE --nodes FILE``: the inflation protocol on a trace.

Runs the named packing policies (:mod:`lab.simulator.packing_policies`,
:mod:`lab.simulator.packing_tandem`) on one arrival order per seed and
reports the allocated share of GPU capacity at 100% and 130% arrival. With
``--sweep`` the ``tandem`` policy runs once per setting of the packing weights
(``w_fragmentation``, ``w_fit``, ``w_interference``, ``w_order``; e.g. ``--grid
'w_order=0.05,0.2;w_fit=0.02,0.1'``), ranked by allocation at 130% arrival, then at
100%. Each seed breaks the baselines' ties in its own node order
(:func:`~lab.simulator.inflation.tie_order`).
"""

from __future__ import annotations

import itertools
import statistics
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from extender.core import CostPolicy
from lab.simulator.inflation import PackPolicy, arrival_order, run_inflation, tie_order
from lab.simulator.packing_policies import (
    BestFit,
    Fgd,
    KubeDefault,
    RandomFit,
    Split,
    typical_shapes,
)
from lab.simulator.packing_tandem import TandemCore
from lab.simulator.trace_csv import TraceNodes, TracePods, read_nodes, read_pods

ARRIVAL_SHARE = 1.3
REPORTED = ("100", "130")
SWEEP_KEYS = ("w_fragmentation", "w_fit", "w_interference", "w_order")
DEFAULT_SWEEP_GRID = {"w_order": (0.05, 0.2, 0.5), "w_fit": (0.02, 0.1)}
MAX_SETTINGS = 50

Factory = Callable[[TraceNodes, TracePods, np.random.Generator], PackPolicy]


def packing_policies(policy: CostPolicy) -> dict[str, Factory]:
    """Each trace policy by name, built fresh per run from the nodes, the pod list (FGD's
    typical pods) and the run's generator."""
    def tandem(name: str, packing: bool, cpu_only: bool) -> Factory:
        def build(nodes: TraceNodes, pods: TracePods, rng: np.random.Generator) -> PackPolicy:
            core = TandemCore(name, nodes, policy, packing=packing, cpu_only=cpu_only)
            return core if cpu_only else Split(name, core, KubeDefault(rng))
        return build

    return {
        "random": lambda n, p, r: RandomFit(r),
        "bestfit": lambda n, p, r: BestFit(),
        "bestfit-gpu-only": lambda n, p, r: Split("bestfit-gpu-only", BestFit(), KubeDefault(r)),
        "fgd": lambda n, p, r: Fgd(typical_shapes(p)),
        "tandem": tandem("tandem", True, True),
        "tandem-gpu-only": tandem("tandem-gpu-only", True, False),
        "tandem-horus": tandem("tandem-horus", False, True),
        "tandem-horus-gpu-only": tandem("tandem-horus-gpu-only", False, False),
    }


def policy_rng(seed: int, name: str) -> np.random.Generator:
    """A policy's own random stream on a seed, keyed by its name: what it draws does not
    depend on which other policies run beside it, or in which order."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def run_policies(nodes: TraceNodes, pods: TracePods, seeds: Sequence[int],
                 build: Mapping[str, Factory]) -> dict[str, list[dict[str, Any]]]:
    """Per policy, one result per seed (every policy on each seed's arrival order)."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in build}
    for seed in seeds:
        order = arrival_order(pods, nodes.gpu_capacity_milli, ARRIVAL_SHARE,
                              np.random.default_rng(seed))
        for name, factory in build.items():
            result = run_inflation(nodes, pods, order, factory(nodes, pods, policy_rng(seed, name)),
                                   rank=tie_order(len(nodes.names), seed))
            out[name].append({"alloc_at": {p: round(result.alloc_at[p], 2) for p in REPORTED},
                              "failed_by_gpus": result.failed_by_gpus,
                              "free_whole_gpus": result.free_whole_gpus})
    return out


def _mean(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {p: round(statistics.fmean(r["alloc_at"][p] for r in runs), 2) for p in REPORTED}


def parse_packing_grid(text: str | None) -> dict[str, tuple[float, ...]]:
    """``"w_fit=0.05,0.1;w_interference=0,0.02"`` -> grid; ValueError on anything else."""
    if not text:
        return dict(DEFAULT_SWEEP_GRID)
    grid: dict[str, tuple[float, ...]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, values = part.partition("=")
        if not sep or key.strip() not in SWEEP_KEYS:
            raise ValueError(f"{part!r}: expected KEY=V1,V2 with KEY in {', '.join(SWEEP_KEYS)}")
        try:
            grid[key.strip()] = tuple(float(v) for v in values.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"{part!r}: values must be numbers") from None
        if not grid[key.strip()] or min(grid[key.strip()]) < 0:
            raise ValueError(f"{part!r}: give numbers >= 0")
    size = int(np.prod([len(v) for v in grid.values()]))
    if size > MAX_SETTINGS:
        raise ValueError(f"the grid has {size} settings (at most {MAX_SETTINGS})")
    return grid


def run_packing(pods_path: Path, nodes_path: Path, policies: Sequence[str], seeds: int,
                policy: CostPolicy, sweep: bool = False,
                grid: str | None = None) -> dict[str, Any]:
    """The command's JSON: per policy (or per sweep setting) the mean allocation."""
    nodes, pods = read_nodes(nodes_path), read_pods(pods_path)
    seed_list = list(range(seeds))
    if sweep:
        rows = []
        table = parse_packing_grid(grid)
        for values in itertools.product(*table.values()):
            setting = dict(zip(table, values, strict=True))
            tuned = replace(policy, packing=replace(policy.packing, **setting))
            runs = run_policies(nodes, pods, seed_list,
                                {"tandem": packing_policies(tuned)["tandem"]})["tandem"]
            rows.append({"setting": setting, "alloc_at": _mean(runs)})
        rows.sort(key=lambda r: (-r["alloc_at"]["130"], -r["alloc_at"]["100"]))
        return {"sweep": rows, "seeds": seed_list}
    build = packing_policies(policy)
    unknown = [p for p in policies if p not in build]
    if unknown:
        raise ValueError(f"unknown trace policies {unknown} (valid: {', '.join(build)})")
    chosen = {name: build[name] for name in (policies or ("bestfit", "fgd", "tandem"))}
    runs = run_policies(nodes, pods, seed_list, chosen)
    return {"policies": {name: {"alloc_at": _mean(r), "alloc_at_seeds": {
        p: [x["alloc_at"][p] for x in r] for p in REPORTED}} for name, r in runs.items()},
        "seeds": seed_list}


def render(doc: Mapping[str, Any]) -> str:
    """The JSON as a small text table."""
    lines = [f"{'policy / setting':40} {'alloc@100%':>11} {'alloc@130%':>11}"]
    rows = ([(", ".join(f"{k}={v:g}" for k, v in r["setting"].items()), r["alloc_at"])
             for r in doc["sweep"]] if "sweep" in doc else
            [(name, p["alloc_at"]) for name, p in doc["policies"].items()])
    lines += [f"{label:40} {a['100']:>10.2f}% {a['130']:>10.2f}%" for label, a in rows]
    return "\n".join(lines)
