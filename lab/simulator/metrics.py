"""Metrics of one simulation, as Horus defines them (TPDS'21 §5.2 "Metrics").

- makespan: first arrival to last completion ("from en-queuing through to completion");
- average cluster GPU utilisation: time-average over all GPUs of
  ``min(100, sum of the true utilisation of the jobs on the GPU)``, in percent,
  over the makespan;
- JCT (job completion time): arrival to completion, so it includes the wait;
- run time: start of the (last, successful) execution to completion
  (``avg_run_s``; JCT = wait + run time);
- waiting time: arrival to that start (time lost to OOM restarts and evictions
  counts as waiting).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lab.simulator.engine import DONE, Engine


@dataclass(frozen=True)
class SimulationResult:
    """Summary numbers of one policy on one trace, plus the timelines for plots."""

    policy: str
    jobs: int
    finished: int
    makespan_s: float
    avg_gpu_util: float
    """Percent (0..100) of the cluster's GPU capacity used, averaged over the makespan."""
    avg_jct_s: float
    """Mean of finish minus arrival over finished jobs (wait plus run time)."""
    median_jct_s: float
    p95_jct_s: float
    avg_run_s: float
    """Mean of finish minus the start of the last (successful) execution."""
    avg_wait_s: float
    median_wait_s: float
    p95_wait_s: float
    avg_slowdown: float
    """Mean of run time / isolated duration over finished jobs (interference cost)."""
    oom_events: int
    evictions: int
    """Evictions (a policy's warm-up check, or the revert of a pair measured to lose)."""
    rounds: int
    max_mem_excess_mib: float
    """Largest true memory over capacity seen on any GPU; the engine keeps it <= 0."""
    unfinished: int = 0
    """Jobs that never completed (no GPU set could ever hold them)."""
    reverts: int = 0
    """Of the evictions, those of pods of a pair measured to lose
    (``learning.revert_losing_seconds``)."""
    jct_s: tuple[float, ...] = field(repr=False, default=())
    wait_s: tuple[float, ...] = field(repr=False, default=())
    util_timeline: tuple[tuple[float, float], ...] = field(repr=False, default=())
    gpu_timeline: tuple[tuple[float, int, float, float, int], ...] = field(repr=False, default=())

    def summary(self) -> dict[str, Any]:
        """The JSON-able summary (no per-job arrays)."""
        keys = ("policy", "jobs", "finished", "unfinished", "makespan_s", "avg_gpu_util",
                "avg_jct_s", "median_jct_s", "p95_jct_s", "avg_run_s", "avg_wait_s",
                "median_wait_s", "p95_wait_s", "avg_slowdown", "oom_events", "evictions", "rounds",
                "max_mem_excess_mib")
        out: dict[str, Any] = {}
        for k in keys:
            v = getattr(self, k)
            out[k] = round(v, 3) if isinstance(v, float) and math.isfinite(v) else v
        return out


def _stats(values: np.ndarray) -> tuple[float, float, float]:
    if values.size == 0:
        return math.nan, math.nan, math.nan
    return (float(values.mean()), float(np.median(values)), float(np.percentile(values, 95)))


def summarize(engine: Engine, policy: str) -> SimulationResult:
    """Compute the metrics of a finished engine run."""
    done = [r for r in engine.runs if r.state == DONE]
    g = len(engine.table.gpus)
    if done:
        first = min(r.job.arrival_s for r in engine.runs)
        makespan = max(r.finish_s for r in done) - first
    else:
        makespan = 0.0
    jct = np.array([r.finish_s - r.job.arrival_s for r in done])
    run = np.array([r.finish_s - r.start_s for r in done])
    wait = np.array([r.start_s - r.job.arrival_s for r in done])
    slow = np.array([(r.finish_s - r.start_s) / r.job.duration_s for r in done])
    util = engine.gpu_seconds_util_area / (g * makespan) if makespan > 0 else 0.0
    avg_jct, med_jct, p95_jct = _stats(jct)
    avg_wait, med_wait, p95_wait = _stats(wait)
    return SimulationResult(
        policy=policy, jobs=len(engine.runs), finished=len(done), makespan_s=float(makespan),
        avg_gpu_util=float(util), avg_jct_s=avg_jct, median_jct_s=med_jct, p95_jct_s=p95_jct,
        avg_run_s=float(run.mean()) if run.size else math.nan,
        avg_wait_s=avg_wait, median_wait_s=med_wait, p95_wait_s=p95_wait,
        avg_slowdown=float(slow.mean()) if slow.size else math.nan,
        oom_events=engine.oom_events, evictions=engine.evictions, rounds=engine.rounds,
        max_mem_excess_mib=engine.max_mem_excess_mib, unfinished=len(engine.runs) - len(done),
        reverts=engine.reverts,
        jct_s=tuple(jct.tolist()), wait_s=tuple(wait.tolist()),
        util_timeline=tuple(engine.util_timeline), gpu_timeline=tuple(engine.gpu_timeline),
    )
