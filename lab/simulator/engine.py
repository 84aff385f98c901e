"""Discrete-event engine: event heap, virtual clock, job lifecycle, interference.

The engine owns the simulated *world* (true utilisation and memory per GPU, job
progress) and the extender's snapshot (:class:`extender.core.table.GpuTable`,
holding what the scheduler believes: reservations from predictions, plus agent
observations of the true load). Policies decide; the engine applies.

Job lifecycle::

    PENDING --place--> RUNNING --work done--> DONE
       ^                  |
       +---- OOM / evict -+   (progress lost; OOM corrects the memory estimate)

Events at the same instant run finishes first (they free GPUs), then warm-up
checks, then arrivals; afterwards the policy gets scheduling rounds at that
instant until a round places nothing. A running job progresses at ``1 /
slowdown`` where the slowdown is the worst over its GPUs (a synchronous
multi-GPU job runs at the pace of its slowest worker). When a GPU's set of jobs
changes, every job on it is re-timed; stale finish events are skipped by
version number. OOM: placing a job whose *true* memory does not fit next to the
jobs already on a GPU fails at once (Horus §4.2.3: the job is resubmitted with
its memory corrected), so no GPU ever holds more true memory than it has.

The world's truth is the trace (each job's ``util_percent`` and ``mem_mib``) and
the paper's interference, unless a :class:`lab.simulator.truth.Truth` says
otherwise per model, GPU type and curve. Where the truth measures pairs for a GPU
type (:mod:`lab.simulator.pairwise`), each job on a shared GPU of that type
has its own slowdown (asymmetric), and a start beside a model it cannot share
with fails like an out-of-memory start. Simulated agents (``agents``), when
given, are told before every change of a GPU's jobs, so they can report the
interval that ends, after every completion, and before each instant's scheduling rounds
(the periods a real agent would have reported by then).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from extender.core.snapshot import NodeSpec, Placement
from extender.core.table import GpuTable
from lab.simulator.interference import SlowdownModel
from lab.simulator.jobs import SimJob
from lab.simulator.pairwise import job_slowdowns as pairwise_slowdowns

if TYPE_CHECKING:
    from lab.simulator.agent_hooks import Agents
    from lab.simulator.truth import Truth

FINISH, CHECK, ARRIVE, RETRY, REVIEW = 0, 1, 2, 3, 4
PENDING, RUNNING, DONE = "pending", "running", "done"


class SimulationError(RuntimeError):
    """The engine was driven into an impossible state (a policy bug)."""


class JobRun:
    """Mutable state of one job in one simulation."""

    __slots__ = ("idx", "job", "pred_util", "pred_mem", "state", "rows", "placements",
                 "remaining_s", "rate", "last_s", "version", "start_s", "finish_s", "ooms",
                 "evictions", "excluded_rows", "starts", "util_rows", "mem_rows")

    def __init__(self, idx: int, job: SimJob):
        self.idx = idx
        self.job = job
        self.pred_util = job.pred_util
        self.pred_mem = job.pred_mem
        self.state = PENDING
        self.rows: tuple[int, ...] = ()
        self.placements: list[Placement] = []
        self.remaining_s = job.duration_s
        self.rate = 1.0
        self.last_s = 0.0
        self.version = 0
        self.start_s = math.nan
        self.finish_s = math.nan
        self.ooms = 0
        self.evictions = 0
        self.excluded_rows: set[int] = set()
        self.starts = 0
        self.util_rows: list[float] = []
        """True utilisation per GPU of the current run (one per entry of ``rows``)."""
        self.mem_rows: list[float] = []


class Policy(Protocol):
    """A scheduling policy: owns the pending queue, places jobs through the context."""

    name: str
    warmup_check_s: float | None
    """When set, the engine asks :meth:`should_evict` this long after each start."""

    def enqueue(self, run: JobRun, now_s: float) -> None:
        """A job became pending (arrival, OOM, eviction)."""

    def schedule(self, ctx: SchedulingContext) -> int:
        """One scheduling round; returns how many jobs it placed."""

    def pending(self) -> int:
        """Jobs still waiting in the policy's queue."""

    def should_evict(self, run: JobRun, slowdown: float) -> bool:
        """After warm-up: re-queue this job given its measured slowdown?"""


@dataclass(frozen=True)
class EngineConfig:
    """Engine knobs."""

    interference: str = "curve"
    """``curve`` (Horus Fig. 4 quadratic) or ``linear`` (the paper simulator's assumption)."""
    agent_reports: bool = True
    """Feed true per-GPU load to the snapshot as fresh agent observations each round."""
    record_gpu_timeline: bool = False
    """Keep (t, gpu row, util %, memory MiB, jobs) on every change of a GPU."""
    oom_retry_delay_s: float = 30.0
    """Assumed time for a container to start, run out of memory and be seen failing; the
    job re-enters the queue this long after an OOM (Horus §4.2.3 resubmits failed jobs)."""
    max_rounds_per_instant: int = 10_000
    """Bound on scheduling rounds at one instant (a guard against a looping policy)."""


class SchedulingContext:
    """What a policy sees and may do during one round."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self.table = engine.table
        self.node_names = engine.table.node_names
        self.now_s = 0.0

    @property
    def last_start_s(self) -> np.ndarray:
        """Per GPU row, when a job last started there (-inf never)."""
        return self._engine.last_start_s

    def place(self, run: JobRun, placements: Sequence[Placement]) -> bool:
        """Start ``run`` on ``placements`` (one per task); False on OOM (the job re-queues later).

        Either way the job has left the policy's queue."""
        return self._engine.start(run, list(placements))


class Engine:
    """One simulation of ``jobs`` on ``nodes`` under ``policy``."""

    def __init__(self, nodes: Sequence[NodeSpec], jobs: Sequence[SimJob], policy: Policy,
                 config: EngineConfig | None = None, truth: Truth | None = None,
                 agents: Agents | None = None):
        self.config = config or EngineConfig()
        self.table = GpuTable.build(nodes)
        self.policy = policy
        self.truth = truth
        self.agents = agents
        g = len(self.table.gpus)
        if g == 0:
            raise SimulationError("the cluster has no GPUs")
        self.model = truth.slowdown_model(self.config.interference, self.table.type_names) \
            if truth is not None else \
            SlowdownModel.for_types(self.config.interference, self.table.type_names)
        self.runs = [JobRun(i, j) for i, j in enumerate(jobs)]
        self.util_true = np.zeros(g)
        self.mem_true = np.zeros(g)
        self.jobs_on = np.zeros(g, dtype=np.int64)
        self.slowdown = np.ones(g)
        self.last_start_s = np.full(g, -np.inf)
        self._on_gpu: list[list[int]] = [[] for _ in range(g)]
        self._contrib = np.zeros(g)
        self._util_total = 0.0
        self._area = 0.0
        self._t = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.oom_events = 0
        self.evictions = 0
        self.reverts = 0
        """Evictions of pods the extender named (a pair measured to lose)."""
        self.rounds = 0
        self.util_timeline: list[tuple[float, float]] = []
        self.gpu_timeline: list[tuple[float, int, float, float, int]] = []
        self.max_mem_excess_mib = 0.0
        self.pairs = truth.interference if truth is not None else {}
        self._job_slow: dict[tuple[int, int], float] = {}
        """(job, row) -> that job's slowdown on the row, where the row's type has pairs."""
        self.cannot_share_events = 0
        self._ctx = SchedulingContext(self)
        for run in self.runs:
            self._push(run.job.arrival_s, ARRIVE, run.idx, 0)
        if agents is not None:
            agents.attach(self)

    def _push(self, t: float, kind: int, idx: int, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, idx, version))

    def run(self) -> Engine:
        """Process every event; returns self (results are on the engine)."""
        while self._heap:
            t = self._heap[0][0]
            self._advance(t)
            while self._heap and self._heap[0][0] == t:
                _, kind, _, idx, version = heapq.heappop(self._heap)
                run = self.runs[idx]
                if kind == ARRIVE:
                    run.last_s = t
                    self.policy.enqueue(run, t)
                elif kind == RETRY and run.state == PENDING:
                    self.policy.enqueue(run, t)
                elif kind == FINISH and run.state == RUNNING and version == run.version:
                    self._finish(run)
                elif kind == CHECK and run.state == RUNNING and version == run.starts:
                    self._check(run)
                elif kind == REVIEW and run.state == RUNNING and version == run.starts:
                    self._move_named(review=True)
            self._schedule_rounds(t)
        return self

    def _advance(self, t: float) -> None:
        if t < self._t:
            raise SimulationError(f"time went backwards: {t} < {self._t}")
        self._area += self._util_total * (t - self._t)
        self._t = t

    def _schedule_rounds(self, t: float) -> None:
        ctx = self._ctx
        ctx.now_s = t
        if self.agents is not None and self.policy.pending():
            self.agents.catch_up(t)  # the learner knows what a real agent told it by now
        self._move_named()
        for _ in range(self.config.max_rounds_per_instant):
            if self.policy.pending() == 0:
                break
            if self.config.agent_reports:
                # The agents report continuously: the snapshot sees the true load now.
                self.table.observe_rows(slice(None), self._contrib, self.mem_true, t)
            self.rounds += 1
            if self.policy.schedule(ctx) == 0:
                break

    def start(self, run: JobRun, placements: list[Placement]) -> bool:
        """Apply a policy's placement; an OOM re-queues the job with corrected memory."""
        if run.state != PENDING:
            raise SimulationError(f"job {run.job.id} placed while {run.state}")
        if len(placements) != run.job.tasks:
            raise SimulationError(f"job {run.job.id}: {len(placements)} placements for "
                                  f"{run.job.tasks} tasks")
        rows = tuple(self.table.row_of(p.node, i) for p in placements for i in p.gpu_indices)
        if len(rows) != run.job.gpus:
            raise SimulationError(f"job {run.job.id}: {len(rows)} GPUs for {run.job.gpus} needed")
        # Two tasks (pods) of one job may share a GPU if the policy says so: each adds its load.
        t = self._t
        utils, mems = self._truth_on(run.job, rows)
        idx = np.fromiter(rows, dtype=np.int64, count=len(rows))
        added = np.bincount(idx, minlength=len(self.mem_true))[idx] * np.array(mems)
        if np.any(self.mem_true[idx] + added > self.table.capacity_mib[idx] + 1e-6):
            run.pred_mem = max(run.pred_mem, max(mems))  # Horus §4.2.3 resubmission
            return self._refuse(run, idx)
        if self.pairs:
            partners = self._cannot_share(run, rows)
            if partners:
                self.cannot_share_events += 1
                refused = getattr(self.agents, "refused", None)
                if refused is not None:  # the pod's failure is visible to the extender
                    refused(run, partners)
                return self._refuse(run, idx)
        if self.agents is not None:
            self.agents.before_change(rows, t)
        for p in placements:
            self.table.place(p)
        run.state, run.rows, run.placements = RUNNING, rows, placements
        run.util_rows, run.mem_rows = utils, mems
        run.start_s, run.last_s = t, t
        run.starts += 1
        for r, u, m in zip(rows, utils, mems, strict=True):
            self.util_true[r] += u
            self.mem_true[r] += m
            self.jobs_on[r] += 1
            self._on_gpu[r].append(run.idx)
        self.last_start_s[list(rows)] = t
        self._reflow(sorted(set(rows)))
        if self.policy.warmup_check_s is not None:
            self._push(t + self.policy.warmup_check_s, CHECK, run.idx, run.starts)
        if self.agents is not None:
            self.agents.started(run)
            for after in self.agents.review_after_start():
                self._push(t + after, REVIEW, run.idx, run.starts)
        return True

    def _refuse(self, run: JobRun, idx: np.ndarray) -> bool:
        """The start fails as out of memory; the job re-enters the queue after the delay."""
        self.oom_events += 1
        run.ooms += 1
        self.last_start_s[idx] = self._t
        self._push(self._t + self.config.oom_retry_delay_s, RETRY, run.idx, 0)
        return False

    def _cannot_share(self, run: JobRun, rows: Sequence[int]) -> list[tuple[int, str]]:
        """(row, model) of each job on ``rows`` whose model ``run``'s cannot share with."""
        out = []
        for r in sorted(set(rows)):
            table = self.pairs.get(self.table.type_names[self.table.type_id[r]])
            if table is None:
                continue
            out += [(r, other.job.model) for other in self.runs_on(r)
                    if not table.can_share(run.job.model, other.job.model)]
        return out

    def job_slowdown(self, job: int, row: int) -> float:
        """How many times slower job ``job`` runs on GPU ``row`` now (1.0 alone)."""
        return self._job_slow.get((job, row), float(self.slowdown[row]))

    def _pair_row(self, r: int) -> None:
        """Per-job slowdowns on ``r`` from the truth's measured pairs (pairwise rules)."""
        type_id = int(self.table.type_id[r])
        table = self.pairs.get(self.table.type_names[type_id])
        if table is None:
            return
        jobs = self._on_gpu[r]
        runs = [self.runs[j] for j in jobs]
        utils = [run.util_rows[run.rows.index(r)] for run in runs]
        types = np.array([type_id])

        def curve(i: int, j: int) -> float:
            return float(self.model.slowdown(np.array([utils[i] + utils[j]]), np.array([2]),
                                             types)[0])

        slows = pairwise_slowdowns(table, [run.job.model for run in runs], curve)
        for j, value in zip(jobs, slows, strict=True):
            self._job_slow[(j, r)] = value
        self.slowdown[r] = max(slows) if len(slows) >= 2 else 1.0

    def _truth_on(self, job: SimJob, rows: Sequence[int]) -> tuple[list[float], list[float]]:
        """True (utilisation, memory) of ``job`` on each of ``rows``."""
        if self.truth is None:
            return [job.util_percent] * len(rows), [job.mem_mib] * len(rows)
        names, type_id = self.table.type_names, self.table.type_id
        types = [names[type_id[r]] for r in rows]
        return ([self.truth.util_of(job, t) for t in types],
                [self.truth.mem_of(job, t) for t in types])

    def _stop(self, run: JobRun) -> None:
        if self.agents is not None:
            self.agents.before_change(run.rows, self._t)
        for p in run.placements:
            self.table.remove(p)
        for r, u, m in zip(run.rows, run.util_rows, run.mem_rows, strict=True):
            self.util_true[r] = max(0.0, self.util_true[r] - u)
            self.mem_true[r] = max(0.0, self.mem_true[r] - m)
            self.jobs_on[r] -= 1
            self._on_gpu[r].remove(run.idx)
            self._job_slow.pop((run.idx, r), None)
            if self.jobs_on[r] == 0:  # no float residue on an idle GPU
                self.util_true[r] = self.mem_true[r] = 0.0
        rows, run.rows, run.placements = run.rows, (), []
        run.version += 1
        self._reflow(sorted(set(rows)))

    def _finish(self, run: JobRun) -> None:
        self._settle(run)
        run.remaining_s = 0.0
        self._stop(run)
        run.state, run.finish_s = DONE, self._t
        if self.agents is not None:
            self.agents.finished(run)

    def _check(self, run: JobRun) -> None:
        if self.policy.should_evict(run, 1.0 / run.rate):
            rows = run.rows
            self._evict(run)
            run.excluded_rows = set(rows)  # avoid only the GPUs it was just evicted from
            self.policy.enqueue(run, self._t)

    def _evict(self, run: JobRun) -> None:
        """Stop ``run``, pending again: "the job is simply re-queued" (Horus §5.2, PAB),
        its progress lost."""
        self._settle(run)
        self._stop(run)
        self.evictions += 1
        run.evictions += 1
        run.state, run.remaining_s = PENDING, run.job.duration_s

    def _move_named(self, review: bool = False) -> None:
        """Evict the jobs of the pods the agents' reports named (reported up to now first
        at a ``review``): each re-enters the queue as the new pod of a revert would."""
        if self.agents is None:
            return
        if review:
            self.agents.catch_up(self._t)
        uids = set(self.agents.take_moves())
        for run in self.runs if uids else ():
            if run.state == RUNNING and any(p.pod_uid in uids for p in run.placements):
                self._evict(run)
                self.reverts += 1
                self.policy.enqueue(run, self._t)

    def _settle(self, run: JobRun) -> None:
        run.remaining_s = max(0.0, run.remaining_s - (self._t - run.last_s) * run.rate)
        run.last_s = self._t

    def _reflow(self, rows: Sequence[int]) -> None:
        """Re-time every job on ``rows`` after their load changed; account utilisation."""
        idx = np.fromiter(rows, dtype=np.int64, count=len(rows))
        new = np.minimum(100.0, self.util_true[idx])
        self._util_total += float((new - self._contrib[idx]).sum())
        self._contrib[idx] = new
        self.slowdown[idx] = self.model.slowdown(self.util_true[idx], self.jobs_on[idx],
                                                 self.table.type_id[idx])
        if self.pairs:
            for r in rows:
                self._pair_row(int(r))
        t = self._t
        g = len(self.table.gpus)
        if not self.util_timeline or self.util_timeline[-1][0] != t:
            self.util_timeline.append((t, self._util_total / g))
        else:
            self.util_timeline[-1] = (t, self._util_total / g)
        if self.config.record_gpu_timeline:
            for r in rows:
                self.gpu_timeline.append((t, int(r), float(self._contrib[r]),
                                          float(self.mem_true[r]), int(self.jobs_on[r])))
        over = self.mem_true[idx] - self.table.capacity_mib[idx]
        self.max_mem_excess_mib = max(self.max_mem_excess_mib, float(over.max()))
        affected = {j for r in rows for j in self._on_gpu[r]}
        for j in sorted(affected):
            run = self.runs[j]
            self._settle(run)
            run.rate = 1.0 / (max(self.job_slowdown(j, r) for r in run.rows) if self.pairs
                              else float(self.slowdown[list(run.rows)].max()))
            run.version += 1
            self._push(t + run.remaining_s / run.rate, FINISH, j, run.version)

    def runs_on(self, row: int) -> list[JobRun]:
        """The running jobs on GPU ``row``, each once, in job order."""
        return [self.runs[j] for j in sorted(set(self._on_gpu[row]))]

    @property
    def gpu_seconds_util_area(self) -> float:
        """Integral of summed per-GPU utilisation (percent) over time."""
        return self._area
