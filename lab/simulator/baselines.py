"""The comparison baselines of Horus §5.2 (not tandem decisions, so they live here).

- ``fifo``: arrival order, a job only takes idle GPUs (no co-location), like
  slot-based Kubernetes/YARN scheduling. A job that does not fit is skipped,
  not blocking the ones behind it (kube-scheduler moves on to the next pod).
- ``obp`` (opportunistic bin packing): arrival order; any GPU whose free memory
  covers the job's *estimated* memory qualifies; the least-loaded qualifying GPU
  (most free memory) is taken. Memory only: utilisation is ignored.
- ``pab`` (performance-aware bin packing): as ``obp``, but after a warm-up of 60 s
  a job whose progress dropped by 50% (slowdown >= 2) is re-queued, losing its
  progress; a GPU that received a job less than the warm-up ago takes no further
  co-located job, because its performance is still being profiled (the overhead
  the paper blames for PAB's longer makespan, §6.1). The evicted job avoids the
  GPUs it was evicted from while they still hold other jobs.

Ranking ends on the GPU row (node order, then GPU index) so replays are exact.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from extender.core.cost import CostPolicy, effective_load
from extender.core.snapshot import Placement
from extender.core.table import GpuTable
from lab.simulator.engine import JobRun, SchedulingContext

PAB_WARMUP_S = 60.0
"""Horus §5.2: "a warm-up period between 0-60s"."""
PAB_DROP = 0.5
"""Horus §5.2: re-queue "if performance drops by 50 percent"."""


def node_of_rows(table: GpuTable) -> np.ndarray:
    """Node id per GPU row."""
    counts = np.diff(table.node_start)
    return np.repeat(np.arange(counts.size), counts)


def pick_rows(table: GpuTable, node_of: np.ndarray, eligible: np.ndarray, cost: np.ndarray,
              n: int) -> list[int] | None:
    """The ``n`` cheapest eligible rows on the one node whose ``n`` cheapest are cheapest."""
    if n == 1:
        masked = np.where(eligible, cost, np.inf)
        row = int(np.argmin(masked))
        return [row] if math.isfinite(masked[row]) else None
    counts = np.bincount(node_of[eligible], minlength=len(table.node_names))
    best: tuple[float, int, list[int]] | None = None
    for node in np.flatnonzero(counts >= n).tolist():
        lo, hi = int(table.node_start[node]), int(table.node_start[node + 1])
        rows = [r for r in range(lo, hi) if eligible[r]]
        rows.sort(key=lambda r: (cost[r], r))
        total = float(sum(cost[r] for r in rows[:n]))
        if best is None or total < best[0]:
            best = (total, node, rows[:n])
    return None if best is None else sorted(best[2])


def placements_for(table: GpuTable, run: JobRun, rows_per_task: list[list[int]]) -> list[Placement]:
    """One Placement per task from chosen rows (per-GPU demand = the job's prediction)."""
    out = []
    for t, rows in enumerate(rows_per_task):
        node = table.node_names[int(np.searchsorted(table.node_start, rows[0], side="right")) - 1]
        out.append(Placement(pod_uid=f"{run.job.id}-{t}", pod=f"sim/{run.job.id}-{t}", node=node,
                             gpu_indices=tuple(table.gpus[r].index for r in rows),
                             util_percent=run.pred_util, mem_mib=run.pred_mem))
    return out


class ArrivalOrderPolicy:
    """Shared queue and scan of the arrival-order baselines."""

    name = "arrival-order"
    warmup_check_s: float | None = None

    def __init__(self, max_pods_per_gpu: int = 8,
                 staleness_seconds: float = CostPolicy.staleness_seconds):
        self.max_pods_per_gpu = max_pods_per_gpu
        self.staleness_seconds = staleness_seconds
        self._keys: list[tuple[float, int]] = []
        self._runs: dict[int, JobRun] = {}
        self._node_of: np.ndarray | None = None

    def enqueue(self, run: JobRun, now_s: float) -> None:
        """Queue by original arrival, so a re-queued job keeps its place."""
        bisect.insort(self._keys, (run.job.arrival_s, run.idx))
        self._runs[run.idx] = run

    def pending(self) -> int:
        """Jobs waiting."""
        return len(self._keys)

    def should_evict(self, run: JobRun, slowdown: float) -> bool:
        """Baselines other than PAB never evict."""
        return False

    def _available(self, ctx: SchedulingContext) -> np.ndarray:
        """GPUs this baseline may use at all (memory aside): idle ones, for FIFO."""
        return ctx.table.pod_count == 0

    def _cost(self, free: np.ndarray) -> np.ndarray:
        return np.zeros_like(free)

    def schedule(self, ctx: SchedulingContext) -> int:
        """Scan pending jobs in arrival order and place every one that fits."""
        table = ctx.table
        if self._node_of is None:
            self._node_of = node_of_rows(table)
        placed = 0
        kept: list[tuple[float, int]] = []
        keys, self._keys = self._keys, []
        stale = True
        for pos, key in enumerate(keys):
            if stale:  # refresh the per-GPU view only after a placement changed it
                used = effective_load(table.reserved_mib, table.observed_mib, table.observed_at,
                                      ctx.now_s, self.staleness_seconds, table.since_mib)
                free = table.capacity_mib - used
                avail = self._available(ctx)
                n_avail = int(avail.sum())
                max_free = float(free[avail].max()) if n_avail else -math.inf
                cost = self._cost(free)
                stale = False
            if n_avail == 0:
                kept.extend(keys[pos:])  # no GPU can take any job now: stop scanning
                break
            run = self._runs[key[1]]
            if run.job.gpus > n_avail or run.pred_mem > max_free:
                kept.append(key)
                continue
            eligible = avail & (free >= run.pred_mem)
            if run.excluded_rows:  # PAB: not back next to the jobs that slowed it down
                busy = [r for r in run.excluded_rows if table.pod_count[r] > 0]
                eligible[busy] = False
            chosen: list[list[int]] = []
            for _ in range(run.job.tasks):
                rows = pick_rows(table, self._node_of, eligible, cost, run.job.gpus_per_task)
                if rows is None:
                    break
                chosen.append(rows)
                eligible[rows] = False
            if len(chosen) < run.job.tasks:
                kept.append(key)
                continue
            del self._runs[key[1]]
            ctx.place(run, placements_for(table, run, chosen))  # an OOM re-queues it later
            placed += 1
            stale = True
        self._keys = kept
        return placed


class FifoPolicy(ArrivalOrderPolicy):
    """FIFO, one job per GPU."""

    name = "fifo"


class OpportunisticPolicy(ArrivalOrderPolicy):
    """Opportunistic bin packing: memory only, least-loaded GPU first."""

    name = "obp"

    def _available(self, ctx: SchedulingContext) -> np.ndarray:
        return ctx.table.pod_count < self.max_pods_per_gpu

    def _cost(self, free: np.ndarray) -> np.ndarray:
        return -free


class PerformanceAwarePolicy(OpportunisticPolicy):
    """Performance-aware bin packing: OBP plus warm-up profiling and re-queue on slowdown."""

    name = "pab"
    warmup_check_s: float | None = PAB_WARMUP_S

    def _available(self, ctx: SchedulingContext) -> np.ndarray:
        settled = (ctx.now_s - ctx.last_start_s) >= PAB_WARMUP_S
        return super()._available(ctx) & ((ctx.table.pod_count == 0) | settled)

    def should_evict(self, run: JobRun, slowdown: float) -> bool:
        """Re-queue when throughput fell to half or less of the isolated pace."""
        return slowdown >= 1.0 / (1.0 - PAB_DROP) - 1e-9
