"""Horus / Horus-f / tandem: the weighted-fair queue plus the extender's own decisions.

Each round takes ``beta`` jobs from :class:`extender.queue.FairQueue` (the same
code the Kubernetes gate runs) and places each one the way the extender would
place its pods: every task is a pod whose demand is resolved with
:func:`extender.core.resolve_demand` (asserted utilisation and memory, as the
pod annotations would carry them), its candidate nodes are judged by
:func:`extender.core.evaluate` (filter reasons and Horus cost, Eq. 7-10), and
the GPUs are taken by :func:`extender.core.choose` (what bind does). Tasks of a
multi-task job are placed one after the other on a copy of the snapshot
(checkpoint), and the job only starts when all of them fit (gang).

Node choice, the one step kube-scheduler owns:

- ``cost``: the node with the lowest Horus cost (Algorithm 1, line 16), as the
  paper's scheduler does;
- ``score``: what kube-scheduler does with the extender's integer 0..10 scores:
  the highest score; kube-scheduler breaks ties at random, the simulator on node
  order so that replays are exact.

Before calling ``evaluate`` the adapter drops nodes that cannot host a task by a
necessary condition that uses the core's own load rule and co-location rule
(:func:`extender.core.cost.effective_load`, :func:`extender.core.cost.colocation_gain`):
fewer than ``gpus_per_task`` GPUs with enough free memory under the co-location
limit that the rule would let the job join. Such nodes would be
rejected anyway; skipping them only saves building their rejection reasons.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from extender.core import CostPolicy, JobDemand, Placement, choose, evaluate, resolve_demand
from extender.core.cost import colocation_gain, curve_coefficients, effective_load
from extender.core.table import GpuTable
from extender.queue.fair import FairQueue, QueueConfig, QueueItem
from extender.simulator.baselines import node_of_rows
from extender.simulator.engine import JobRun, SchedulingContext

NODE_PICKS = ("cost", "score")


@dataclass(frozen=True)
class HorusSettings:
    """What distinguishes Horus, Horus-f and tandem's default."""

    cost: CostPolicy
    queue: QueueConfig
    node_pick: str = "cost"


class FreeView:
    """Free memory per GPU under the core's load rule, and which GPUs can take any pod.

    Computed once per round and refreshed only after a placement changed the table,
    so the β jobs a full cluster cannot take are turned away with a scalar compare.
    A job that failed marks a *failure point*: until the next refresh, any job needing
    at least as much memory, GPUs per task and GPUs (and, under the co-location
    throughput rule, utilisation) is turned away without numpy.
    """

    def __init__(self, table: GpuTable, node_of: np.ndarray, policy: CostPolicy, now_s: float):
        self.table, self.node_of, self.policy, self.now_s = table, node_of, policy, now_s
        self.refresh()

    def refresh(self) -> None:
        """Recompute after the table changed."""
        t = self.table
        used = effective_load(t.reserved_mib, t.observed_mib, t.observed_at, self.now_s,
                              self.policy.staleness_seconds, t.since_mib)
        self.free = t.capacity_mib - used
        self.open = (t.pod_count < self.policy.max_pods_per_gpu) & (t.serving_count == 0)
        self.open_count = int(self.open.sum())
        self.max_free = float(self.free[self.open].max()) if self.open_count else -np.inf
        self.failed: list[tuple[float, int, int, float]] = []
        p = self.policy
        self.rule = (p.min_colocation_gain_percent is not None
                     or p.max_colocated_util_percent is not None)
        if self.rule:  # the same inputs the core's co-location rule reads
            self.util_now = effective_load(t.reserved_util, t.observed_util, t.observed_at,
                                           self.now_s, p.staleness_seconds, t.since_util)
            self.coeffs = curve_coefficients(p, t.type_names)[t.type_id]

    def _rule_ok(self, util: float) -> np.ndarray:
        """GPUs where the core's co-location rule would let a job of ``util`` join."""
        t, p = self.table, self.policy
        ok = np.ones(t.pod_count.size, dtype=bool)
        if p.min_colocation_gain_percent is not None:
            gain = colocation_gain(self.util_now, np.full(ok.size, util), t.training_count,
                                   self.coeffs, t.training_width)
            ok &= gain > p.min_colocation_gain_percent / 100.0
        if p.max_colocated_util_percent is not None:
            ok &= (t.training_count == 0) | (self.util_now + util
                                              <= p.max_colocated_util_percent)
        return ok

    def _util_key(self, run: JobRun) -> float:
        # With the co-location throughput rule a busier job can fail where a lighter one
        # fits, so utilisation joins the failure point; without it any utilisation fits.
        rule = (self.policy.min_colocation_gain_percent is not None
                or self.policy.max_colocated_util_percent is not None)
        return run.pred_util if rule else 0.0

    def fails(self, run: JobRun) -> bool:
        """True when an earlier failure this round proves ``run`` cannot start either."""
        m, p, g, u = run.pred_mem, run.job.gpus_per_task, run.job.gpus, self._util_key(run)
        return any(m >= fm and p >= fp and g >= fg and u >= fu
                   for fm, fp, fg, fu in self.failed)

    def record_failure(self, run: JobRun) -> None:
        """Remember that ``run`` could not start on the current table."""
        self.failed.append((run.pred_mem, run.job.gpus_per_task, run.job.gpus,
                            self._util_key(run)))

    def candidate_nodes(self, run: JobRun) -> list[str]:
        """Nodes with at least ``gpus_per_task`` GPUs that could hold one task."""
        if run.job.gpus > self.open_count or run.pred_mem > self.max_free:
            return []
        ok = self.open & (self.free >= run.pred_mem)
        if self.rule:
            ok &= self._rule_ok(run.pred_util)
        if int(ok.sum()) < run.job.gpus:
            return []
        counts = np.bincount(self.node_of[ok], minlength=len(self.table.node_names))
        names = self.table.node_names
        return [names[i] for i in np.flatnonzero(counts >= run.job.gpus_per_task).tolist()]


def place_with_core(view: FreeView, run: JobRun, settings: HorusSettings
                    ) -> list[Placement] | None:
    """One placement per task chosen by the extender's core, or None if the job cannot start."""
    names = view.candidate_nodes(run)
    if not names:
        return None
    table, now_s = view.table, view.now_s
    demand = resolve_demand(
        JobDemand(gpu_count=run.job.gpus_per_task, util_percent=run.pred_util,
                  mem_mib=run.pred_mem),
        table.type_names, predict=None)
    work = table
    placements: list[Placement] = []
    for t in range(run.job.tasks):
        if t > 0:
            names = FreeView(work, view.node_of, settings.cost, now_s).candidate_nodes(run)
            if not names:
                return None
        ev = evaluate(work, names, demand, settings.cost, now_s, with_rejections=False)
        if not ev.feasible.any():
            return None
        if settings.node_pick == "score":
            position = int(np.argmax(np.array(ev.scores())))  # first max: node order
        else:
            position = int(np.argmin(ev.node_cost))  # first min: node order
        placement = choose(ev, position, f"{run.job.id}-{t}", f"sim/{run.job.id}-{t}")
        if placement is None:
            return None
        placements.append(placement)
        if t + 1 < run.job.tasks:
            if work is table:
                work = table.copy()  # checkpoint: later tasks see the earlier ones
            work.place(placement)
    return placements


class HorusPolicy:
    """Weighted-fair queue + extender core placement."""

    warmup_check_s: float | None = None

    def __init__(self, name: str, settings: HorusSettings):
        if settings.node_pick not in NODE_PICKS:
            raise ValueError(f"node_pick {settings.node_pick!r} (valid: {', '.join(NODE_PICKS)})")
        self.name = name
        self.settings = settings
        self.queue = FairQueue(settings.queue)
        self._runs: dict[str, JobRun] = {}
        self._node_of: np.ndarray | None = None

    def enqueue(self, run: JobRun, now_s: float) -> None:
        """Queue with the original arrival time, so waiting time keeps counting."""
        key = str(run.idx)
        self._runs[key] = run
        self.queue.add(QueueItem(key=key, enqueued_at_seconds=run.job.arrival_s,
                                 tasks=run.job.tasks, util_percent=run.pred_util,
                                 gpus_per_task=run.job.gpus_per_task, mem_mib=run.pred_mem))

    def pending(self) -> int:
        """Jobs waiting."""
        return len(self.queue)

    def should_evict(self, run: JobRun, slowdown: float) -> bool:
        """Horus never evicts on slowdown."""
        return False

    def schedule(self, ctx: SchedulingContext) -> int:
        """Algorithm 1, lines 4-18: pick ``beta`` jobs, place each that fits."""
        if self._node_of is None:
            self._node_of = node_of_rows(ctx.table)
        placed = 0
        view = FreeView(ctx.table, self._node_of, self.settings.cost, ctx.now_s)
        for item in self.queue.select(ctx.now_s):
            run = self._runs[item.key]
            placements = None if view.fails(run) else place_with_core(view, run, self.settings)
            if placements is None:
                view.record_failure(run)
                continue
            self.queue.remove(item.key)
            del self._runs[item.key]
            ctx.place(run, placements)
            view.refresh()
            placed += 1
        return placed
