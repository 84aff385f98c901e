"""Simulated node agents: they report what the truth produces, as the real agents do.

A real agent pushes a report every interval: per GPU its utilisation and its
processes, each attributed to its pod with the process's own utilisation
(``nvmlDeviceGetProcessUtilization``). In the simulator a GPU's load only changes
when a job starts or stops on it, so the agents report a GPU when such an interval
ends, with as many reports (each with its own noise) as a real agent would have
pushed in it at one report per ``REPORT_PERIOD_S``, at most
``MAX_REPORTS_PER_INTERVAL`` (a bound on the simulator's cost), spread over the
interval (:func:`report_times`): the learner weighs samples by the time they cover,
so this gives the weights of a real agent's 1 Hz reports. Each job's figure is
its true utilisation on that GPU, scaled down proportionally when the GPU's jobs
together ask for more than 100%; on a shared GPU it is its true utilisation reduced
by its own true slowdown through the truth's signal model
(:mod:`lab.simulator.signal`: proportional or sub-proportional, with a
warm-up ramp; the extender's learners are never told which).
Then seeded Gaussian measurement noise (``Truth.util_stddev_percent``), clipped to
0..100. Under ``signal: progress`` each report also gives every pod's steps per second
(a step a second alone, over its true slowdown, times lognormal noise: what the real
agents scrape from ``tandem.io/progress``), drawn from a noise stream of its own.

The reports go through the extender's own :meth:`extender.learning.learner.Learner.observe`
(a :class:`extender.state.reports.DecodedReport` and the placements the scheduler made),
so the simulated tandem policy learns with exactly the extender's code: the
utilisation estimates and each GPU type's interference curve. The learner's
clock is the simulated one (:class:`SimClock`), so the refit interval and the
estimates' timestamps are in simulated seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from contracts.agentreport import ReportedProgress
from contracts.annotations import BATCH_SIZE, DEFAULT_BATCH_SIZE, MODEL, TRAINING
from extender.core import Placement
from extender.learning.learner import Learner
from extender.state.reports import DecodedReport, ReportedProcess
from lab.simulator.engine import Engine, JobRun
from lab.simulator.signal import PROGRESS_NOISE_SD
from lab.simulator.truth import Phases, Truth

REPORT_PERIOD_S = 60.0
"""Simulated seconds per report. Real agents report every second; the learner weighs
samples by time and takes at most one curve point per GPU a minute, so one report a
minute gives it the same estimates and the same curve points (with fewer samples)."""
MAX_REPORTS_PER_INTERVAL = 60
"""Most reports per interval of constant load (bounds the simulator's cost: past an hour
the reports of an interval are spread further apart)."""
SIM_BATCH_SIZE = DEFAULT_BATCH_SIZE[TRAINING]
"""Batch size the simulated pods declare (the extender's training default)."""


class SimClock:
    """The simulated time the agents last reported at (the learner's clock)."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        """Seconds since the simulation started."""
        return self.now_s


class SimAgents:
    """Every node's agent; reports feed ``learner`` (see module docstring)."""

    def __init__(self, truth: Truth, learner: Learner, clock: SimClock | None = None):
        self.truth = truth
        self.learner = learner
        self.clock = clock or SimClock()
        self.samples = 0
        """Utilisation samples the learner took from the reports so far."""
        self.reports = 0
        self.completed = 0
        self.on_completed: Callable[[int], None] | None = None
        """Called with the number of completed jobs after each completion."""
        self._rng = np.random.default_rng(truth.seed)
        self._progress_rng = np.random.default_rng([truth.seed, 1])
        """The progress signal's noise (its own stream: the utilisation noise is unchanged)."""
        self._placements: dict[str, Placement] = {}
        self._engine: Engine | None = None
        self._window = (0.0, 0.0)
        """The simulated seconds the report being built covers (for the truth's phases)."""
        cfg = learner.cfg
        self.revert_s = cfg.revert_losing_seconds if cfg.enabled and cfg.pairs else 0.0
        """``learning.revert_losing_seconds`` where pairs are learned (0: no pod is moved)."""
        self._moves: list[str] = []

    def attach(self, engine: Engine) -> None:
        """Watch ``engine``'s GPUs."""
        self._engine = engine
        table = engine.table
        self._node = [table.node_names[int(np.searchsorted(table.node_start, r, side="right")) - 1]
                      for r in range(len(table.gpus))]
        self._since = np.zeros(len(table.gpus))

    def started(self, run: JobRun) -> None:
        """Remember the pods of ``run`` as the extender's ledger would (with their model)."""
        ann = ((BATCH_SIZE, str(SIM_BATCH_SIZE)), (MODEL, run.job.model)) if run.job.model else ()
        for p in run.placements:
            self._placements[p.pod_uid] = replace(p, annotations=ann)

    def refused(self, run: JobRun, partners: Sequence[tuple[int, str]]) -> None:
        """``run`` failed to start beside models it cannot share with (the pod's OOM)."""
        engine = self._engine
        assert engine is not None, "attach() first"
        table = engine.table
        for row, other in partners:
            self.learner.pairs.refuse(table.type_names[table.type_id[row]], run.job.model, other)

    def finished(self, run: JobRun) -> None:
        """Count the completion; forget its pods."""
        for p in run.placements:
            self._placements.pop(p.pod_uid, None)
        self.completed += 1
        if self.on_completed is not None:
            self.on_completed(self.completed)

    def review_after_start(self) -> tuple[float, ...]:
        """With revert on, a report each ``REPORT_PERIOD_S`` through the revert window after
        a start (real agents report every second; the simulated ones otherwise report only
        when a GPU's jobs change or a decision is due, which late in a run can be long after
        a losing pair was measured)."""
        if self.revert_s <= 0:
            return ()
        return tuple(REPORT_PERIOD_S * k
                     for k in range(1, math.ceil(self.revert_s / REPORT_PERIOD_S) + 1))

    def take_moves(self) -> list[str]:
        """The pods the extender named to move since the last call (as
        ``AgentService._revert`` names them from each report)."""
        moves, self._moves = self._moves, []
        return moves

    def before_change(self, rows: Sequence[int], now_s: float) -> None:
        """Report the interval that ends now on ``rows`` (busy GPUs only)."""
        self._report(rows, now_s, lambda since: now_s)

    def catch_up(self, now_s: float) -> None:
        """Report every busy GPU's whole periods since its last report: what a real agent
        would have pushed by ``now_s``, so decisions see what the learner would know then
        (not only what the next change of a GPU's jobs would tell it)."""
        engine = self._engine
        assert engine is not None, "attach() first"
        due = np.flatnonzero((engine.jobs_on > 0) & (now_s - self._since >= REPORT_PERIOD_S))
        if due.size:
            self._report(due.tolist(), now_s, lambda since: since + REPORT_PERIOD_S * math.floor(
                (now_s - since) / REPORT_PERIOD_S))

    def _report(self, rows: Sequence[int], now_s: float,
                until: Callable[[float], float]) -> None:
        """Report ``rows`` (busy GPUs only) per node from their last report to ``until(the
        node's last report)``, at most ``now_s``."""
        engine = self._engine
        assert engine is not None, "attach() first"
        by_node: dict[str, list[int]] = {}
        since: dict[str, float] = {}
        for r in sorted(set(rows)):
            if engine.jobs_on[r] > 0 and now_s > self._since[r]:
                node = self._node[r]
                by_node.setdefault(node, []).append(r)
                since[node] = max(since.get(node, 0.0), float(self._since[r]))
            else:
                self._since[r] = now_s
        ends = {node: min(now_s, until(start)) for node, start in since.items()}
        for node, node_rows in by_node.items():
            self._since[node_rows] = ends[node]
        for node, node_rows in by_node.items():
            end = ends[node]
            if end <= since[node]:
                continue
            times = report_times(since[node], end)
            for before, at in zip([since[node], *times[:-1]], times, strict=True):
                self.clock.now_s = at
                self._window = (before, at)
                report = DecodedReport(
                    node=node, gpus=tuple(engine.table.gpus[r] for r in node_rows),
                    util_percent=tuple(min(100.0, float(engine.util_true[r]))
                                       for r in node_rows),
                    memory_used_mib=tuple(float(engine.mem_true[r]) for r in node_rows),
                    processes=tuple(self._processes(engine, r) for r in node_rows),
                    progress=tuple(self._progress(engine, r, at - before) for r in node_rows)
                    if self.truth.signal.progress else ())
                self.reports += 1
                self.samples += self.learner.observe(report, self._placements.get)
                if self.revert_s > 0:
                    self._moves += self.learner.pairs.to_revert(report, self._placements.get,
                                                                self.revert_s)
        self.clock.now_s = now_s

    def _phase(self, run: JobRun) -> float:
        """The truth's phase factor over the report's window for ``run``."""
        phases = self.truth.phases
        if phases == Phases() or not math.isfinite(run.start_s):
            return 1.0
        t0, t1 = self._window
        return phase_factor(phases, t0 - run.start_s, t1 - run.start_s)

    def _processes(self, engine: Engine, r: int) -> tuple[ReportedProcess, ...]:
        total = float(engine.util_true[r])
        scale = min(1.0, 100.0 / total) if total > 0 else 1.0
        shared = engine.jobs_on[r] >= 2  # shared: utilisation drops with the slowdown (signal)
        node, index = self._node[r], engine.table.gpus[r].index
        out = []
        for run in engine.runs_on(r):
            k = run.rows.index(r)
            for p in run.placements:
                if p.node != node or index not in p.gpu_indices:
                    continue
                noise = self._rng.normal(0.0, self.truth.util_stddev_percent) \
                    if self.truth.util_stddev_percent > 0 else 0.0
                shown = self.truth.signal.shown(
                    run.util_rows[k], scale, engine.job_slowdown(run.idx, r) if shared else None,
                    min(100.0, total))
                util = min(100.0, max(0.0, shown * self._phase(run) + noise))
                out.append(ReportedProcess(p.pod_uid, run.mem_rows[k], util))
        return tuple(out)


    def _progress(self, engine: Engine, r: int, window_s: float) -> tuple[ReportedProgress, ...]:
        """Each pod's steps per second on GPU row ``r`` (``signal: progress``): a step a
        second alone, over its true slowdown, times lognormal noise."""
        shared = engine.jobs_on[r] >= 2
        node, index = self._node[r], engine.table.gpus[r].index
        out = []
        for run in engine.runs_on(r):
            slowdown = engine.job_slowdown(run.idx, r) if shared else 1.0
            for p in run.placements:
                if p.node == node and index in p.gpu_indices:
                    rate = math.exp(self._progress_rng.normal(0.0, PROGRESS_NOISE_SD)) \
                        / max(slowdown, 1e-6)
                    out.append(ReportedProgress(p.pod_uid, rate, max(window_s, 1e-3)))
        return tuple(out)


def phase_factor(phases: Phases, e0: float, e1: float) -> float:
    """Mean factor on a job's steady utilisation over ``[e0, e1]`` seconds since it started:
    ``warmup_util_factor`` in its first ``warmup_seconds``, ``eval_util_factor`` in the last
    ``eval_seconds`` of every ``eval_every_seconds`` after that, 1 otherwise (what a 1 Hz
    agent's samples over that window average to)."""
    span = e1 - e0
    if span <= 0:
        return 1.0
    warm = max(0.0, min(e1, phases.warmup_seconds) - max(e0, 0.0))
    evals = 0.0
    every, length = phases.eval_every_seconds, min(phases.eval_seconds,
                                                   phases.eval_every_seconds)
    if every > 0 and length > 0:
        start = phases.warmup_seconds + every - length

        def upto(x: float) -> float:  # evaluation seconds in [start, x]
            if x <= start:
                return 0.0
            k = math.floor((x - start) / every)
            return k * length + min(length, x - start - k * every)
        evals = upto(e1) - upto(max(e0, phases.warmup_seconds))
    return (warm * phases.warmup_util_factor + evals * phases.eval_util_factor
            + (span - warm - evals)) / span


def report_times(since_s: float, now_s: float) -> list[float]:
    """When the agent's reports of an interval of constant load arrive (simulated seconds).

    A real agent reports every second and the learner weighs each sample by the time
    since its pod's previous report; the simulator sends at most
    ``MAX_REPORTS_PER_INTERVAL`` reports, evenly spread so that each stands for its
    share of the interval (one per ``REPORT_PERIOD_S`` when shorter): the same time
    weights as 1 Hz reporting, with fewer, equally noisy samples.
    """
    n = min(MAX_REPORTS_PER_INTERVAL, max(1, math.ceil((now_s - since_s) / REPORT_PERIOD_S)))
    step = (now_s - since_s) / n
    return [since_s + step * (i + 1) for i in range(n)]
