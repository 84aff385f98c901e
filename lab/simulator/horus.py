"""Horus / Horus-f / tandem: the weighted-fair queue plus the extender's own decisions.

Each round takes ``beta`` jobs from :class:`extender.queue.FairQueue` (the same
code the Kubernetes gate runs) and places each one the way the extender would
place its pods: every task is a pod whose demand is resolved with
:func:`extender.core.resolve_demand` (asserted utilisation and memory, as the
pod annotations would carry them), its candidate nodes are judged by
:func:`extender.core.score_nodes` over a :class:`extender.core.Snapshot` of the
simulated cluster (the entry point ``/prioritize`` calls; Horus cost, Eq. 7-10), and
the GPUs are taken by :func:`extender.core.choose` (what bind does). Tasks of a
multi-task job are placed one after the other on a copy of the snapshot
(checkpoint), and the job only starts when all of them fit (gang).

Node choice, the one step kube-scheduler owns:

- ``cost``: the node with the lowest Horus cost (Algorithm 1, line 16), as the
  paper's scheduler does;
- ``score``: what kube-scheduler does with the extender's integer 0..10 scores:
  the highest score; kube-scheduler breaks ties at random, the simulator on node
  order so that replays are exact.

Before calling ``score_nodes`` the adapter drops nodes by the core's own per-GPU rules
(:mod:`extender.core.rules`), read for every GPU once per round (:class:`FreeView`):
a node stays a candidate when at least ``gpus_per_task`` of its GPUs pass them,
which is the core's own verdict on that node for one task. Skipping the others
only saves building their rejection reasons; ``tests/lab/simulator/test_simulator_prefilter.py``
checks that no node the core would accept is dropped.

With a ground truth (``tandem simulate --truth``) the ``tandem`` policy carries a
:class:`lab.simulator.belief.SimKnowledge`: a job that names its model is
resolved as a model-only pod (prediction, observations, cold-start) instead of
asserting its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from contracts.annotations import PodInputs
from extender.core import (
    CostPolicy,
    JobDemand,
    Placement,
    Purpose,
    ResolvedDemand,
    Snapshot,
    choose,
    resolve_demand,
    score_nodes,
)
from extender.core.rules import GpuLoad, colocation_rule_on, gpu_checks, passing
from extender.core.table import GpuTable
from extender.queue.fair import FairQueue, QueueConfig, QueueItem
from lab.simulator.baselines import node_of_rows
from lab.simulator.belief import pod_annotations
from lab.simulator.engine import JobRun, SchedulingContext

_KNOWN = np.zeros(1, dtype=bool)  # the simulator asserts demand for every GPU type
_ZERO = np.zeros(1)

NODE_PICKS = ("cost", "score")


@dataclass(frozen=True)
class HorusSettings:
    """What distinguishes Horus, Horus-f and tandem's default."""

    cost: CostPolicy
    queue: QueueConfig
    node_pick: str = "cost"
    knowledge: Any = None
    """A :class:`lab.simulator.belief.SimKnowledge` (learning under a truth), or None."""


class FreeView:
    """The core's per-GPU rules on every GPU of the table, read once per round.

    :meth:`refresh` reads the load (:meth:`GpuLoad.read`) after a placement changed
    the table; :meth:`candidate_nodes` then applies :func:`gpu_checks` for a job's
    demand to every row. Because the rules are monotone in the demand, the verdict
    for a job needing nothing (co-location rule left out: a looser bound, one curve
    less per round) bounds every job: a GPU closed to it is closed to all, so the β
    jobs a full cluster cannot take are turned away with a scalar compare.
    A job that failed marks a *failure point*: until the next refresh, any job needing
    at least as much memory, GPUs per task and GPUs (and, under the co-location
    throughput rule, utilisation) is turned away without numpy. For one-task jobs
    that follows from the monotone rules; for gangs it is the simulator's assumption
    that a job needing more of everything cannot start where a lighter one could not.
    Learned pairs refuse per model (a pair seen not to fit in memory, or measured to lose),
    which is not monotone in the demand: under them a failure point turns away only jobs of
    the failed job's model (a refused model's failure once held back every heavier job of
    any model, which would have fitted).
    """

    def __init__(self, table: GpuTable, node_of: np.ndarray, policy: CostPolicy, now_s: float):
        self.table, self.node_of, self.policy, self.now_s = table, node_of, policy, now_s
        self.per_model = policy.pairs is not None
        # the co-location rule as configured: the core applies it where pairs do not judge
        self._util_rule = colocation_rule_on(policy)
        # Learned pairs re-judge the co-location rule per model in the core: the pre-filter
        # then leaves the rule out, so it never drops a node the core would accept.
        if policy.pairs is not None:
            policy = replace(policy, min_colocation_gain_percent=None)
            self.policy = policy
        self.rule = colocation_rule_on(policy)
        self._bound_policy = replace(policy, min_colocation_gain_percent=None,
                                     max_colocated_util_percent=None) if self.rule else policy
        self.refresh()

    def refresh(self) -> None:
        """Recompute after the table changed."""
        self.load = GpuLoad.read(self.table, slice(None), self.policy, self.now_s,
                                 with_util=self.rule)
        # The bound ignores the co-location rule: looser, but it costs one curve less per round.
        self.open = passing(gpu_checks(self.load, self._bound_policy, False, _ZERO, _ZERO, _KNOWN),
                            self.load.pod_count.size)
        self.open_count = int(self.open.sum())
        self.max_free = float(self.load.free_mib[self.open].max()) if self.open_count else -np.inf
        self.failed: list[tuple[float, int, int, float, str | None]] = []

    def passing(self, mem_mib: float, util_percent: float) -> np.ndarray:
        """Rows where the core's hard constraints let one training pod of this demand in."""
        checks = gpu_checks(self.load, self.policy, False, np.array([util_percent]),
                            np.array([mem_mib]), _KNOWN)
        return passing(checks, self.load.pod_count.size)

    def _key(self, run: JobRun) -> tuple[float, int, int, float, str | None]:
        # With the co-location throughput rule a busier job can fail where a lighter one
        # fits, so utilisation joins the failure point; without it any utilisation fits.
        # Under learned pairs the model joins it (class docstring).
        return (run.pred_mem, run.job.gpus_per_task, run.job.gpus,
                run.pred_util if self._util_rule else 0.0,
                run.job.model if self.per_model else None)

    def fails(self, run: JobRun) -> bool:
        """True when an earlier failure this round proves ``run`` cannot start either."""
        m, p, g, u, model = self._key(run)
        return any(m >= fm and p >= fp and g >= fg and u >= fu and model == fmodel
                   for fm, fp, fg, fu, fmodel in self.failed)

    def record_failure(self, run: JobRun) -> None:
        """Remember that ``run`` could not start on the current table."""
        self.failed.append(self._key(run))

    def candidate_nodes(self, run: JobRun) -> list[str]:
        """Nodes with at least ``gpus_per_task`` GPUs that pass the core's rules for ``run``.

        Exactly the nodes where the core would accept one task: tasks of a gang may
        share a GPU there, so the job's total GPU count does not cut the list.
        """
        if run.job.gpus_per_task > self.open_count or run.pred_mem > self.max_free:
            return []
        ok = self.passing(run.pred_mem, run.pred_util)
        if int(ok.sum()) < run.job.gpus_per_task:  # no node can have enough: skip the bincount
            return []
        counts = np.bincount(self.node_of[ok], minlength=len(self.table.node_names))
        names = self.table.node_names
        return [names[i] for i in np.flatnonzero(counts >= run.job.gpus_per_task).tolist()]


def place_with_core(view: FreeView, run: JobRun, settings: HorusSettings,
                    resolved: ResolvedDemand | None = None) -> list[Placement] | None:
    """One placement per task chosen by the extender's core, or None if the job cannot start.

    ``resolved``: the job's demand when the caller resolved it (a modelled job under a
    truth); otherwise the job asserts its believed numbers."""
    names = view.candidate_nodes(run)
    if not names:
        return None
    table, now_s = view.table, view.now_s
    demand = resolved or resolve_demand(
        JobDemand(run.job.gpus_per_task,
                  PodInputs(util_percent=run.pred_util, mem_mib=run.pred_mem)),
        table.type_names, predict=None)
    work = table
    placements: list[Placement] = []
    for t in range(run.job.tasks):
        if t > 0:
            names = FreeView(work, view.node_of, settings.cost, now_s).candidate_nodes(run)
            if not names:
                return None
        ev = score_nodes(Snapshot(work, settings.cost, now_s), names, demand,
                         purpose=Purpose.PLACE)
        if not ev.feasible.any():
            return None
        if settings.node_pick == "score":
            position = int(np.argmax(np.array(ev.scores())))  # first max: node order
        else:
            position = int(np.argmin(ev.node_cost))  # first min: node order
        placement = choose(ev, position, f"{run.job.id}-{t}", f"sim/{run.job.id}-{t}")
        if placement is None:
            return None
        if resolved is not None and run.job.model:  # what the ledger would read off the pod
            placement = replace(placement, annotations=pod_annotations(resolved))
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
        if self.settings.knowledge is not None:
            self.settings.knowledge.refresh(run)  # the queue classes by the current belief
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
        settings = self.settings
        if settings.knowledge is not None:  # the curves it believes now (learned, truth, prior)
            settings = replace(settings, cost=settings.knowledge.policy(settings.cost))
        view = FreeView(ctx.table, self._node_of, settings.cost, ctx.now_s)
        for item in self.queue.select(ctx.now_s):
            run = self._runs[item.key]
            resolved = None
            if self.settings.knowledge is not None:
                resolved = self.settings.knowledge.refresh(run)
            placements = None if view.fails(run) else \
                place_with_core(view, run, settings, resolved)
            if placements is None:
                view.record_failure(run)
                continue
            self.queue.remove(item.key)
            del self._runs[item.key]
            ctx.place(run, placements)
            view.refresh()
            placed += 1
        return placed
