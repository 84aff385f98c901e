"""The duty cycle's plan: admission's Nexus plan, the overrun headroom, replanning.

This part owns the plan in force and what it was made with (the learned latency
margin, the request path's own time, the headroom kept for best-effort overruns);
it proposes plans and says when to replan (the margin or the request path's time
moved, a session's arrival rate drifted). Each session is planned with its SLO
less the request path's front and back time (``pathcost.py``): the executor gets
only what the request path leaves of the deadline. Adopting a
plan (sessions take their batch sizes, the cycle restarts) is the runtime's.
Not thread-safe: the runtime calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from agent.inference.runtime.admission import LatencyMargin, plan_with_headroom, scaled_profile
from agent.inference.runtime.executor_tail import ExecutorHost
from agent.inference.runtime.pathcost import PathFigures, RequestPathCost
from agent.inference.runtime.sacrifice import Held, Sacrifice
from agent.inference.runtime.session_state import RuntimeConfig, SloState
from planner import GpuPlan, Infeasible, SessionSpec
from predictor.batching import BatchingProfile


class Planning:
    """The plan in force and when to make another."""

    def __init__(self, config: RuntimeConfig, now_ms: float, path: RequestPathCost):
        self._config = config
        self.path = path
        self.path_in_plan: PathFigures = path.figures()
        """The request path's figures the last proposed plan was made with."""
        self._own_in_plan = self.own_ms(0.0)
        self.queue_ms = 0.0
        """The request path's CPU queue tail at the admitted rates (``pathcost``)."""
        self.plan: GpuPlan | None = None
        self.overrun_headroom_ms = 0.0
        self.margin = LatencyMargin(
            config.latency_quantile, config.latency_margin_window, config.min_latency_samples
        )
        self.sacrifice = Sacrifice()
        """Who gives way when the host cannot hold every session (best effort first)."""
        self.replans = 0
        self.replans_refused = 0
        self._last_replan_ms = now_ms
        self._last_margin_ms = now_ms

    def observe_host(self, host: ExecutorHost, rate_rps: float) -> None:
        """The host as the executor's priority finds it now (``executor_tail``: a CPU hog
        present), never better than the start-up calibration found it beside the request
        path at ``rate_rps``, the rate the SLO sessions will send together (their clients
        and the path's threads take the cores the executor had while idle): the lower
        share."""
        self.margin.observe_host(host.delay_ms,
                                 min(host.share, self.path.startup.executor_share(rate_rps)))

    def planned(self, profile: BatchingProfile) -> BatchingProfile:
        """The profile as planning sees it: scaled by the learned latency margin (or the
        executor's share of a core) plus the start-up delay."""
        return scaled_profile(profile, self.margin.planning_margin(),
                              self.margin.start_delay_ms)

    def profile_map(self, sessions: Iterable[SloState]) -> dict[tuple[str, str], BatchingProfile]:
        return {(s.spec.model, self._config.gpu_type): self.planned(s.profile) for s in sessions}

    def propose(self, specs: list[SessionSpec],
                profiles: Mapping[tuple[str, str], BatchingProfile],
                longest_segment_ms: float, queue_ms: float | None = None
                ) -> GpuPlan | Infeasible:
        """The Nexus plan, with headroom for best-effort overruns where needed
        (admission.py); the headroom computed is the one overruns are held to.
        ``queue_ms``: the request path's queue tail at these sessions' rates (None:
        the last one given)."""
        self.path_in_plan = self.path.figures()
        self._own_in_plan = self.own_ms(0.0)
        if queue_ms is not None:
            self.queue_ms = queue_ms
        plan, self.overrun_headroom_ms = self._plan(specs, profiles, longest_segment_ms,
                                                    self.queue_ms)
        return plan

    def trial(self, specs: list[SessionSpec],
              profiles: Mapping[tuple[str, str], BatchingProfile],
              longest_segment_ms: float, queue_ms: float) -> GpuPlan | Infeasible:
        """``propose`` without recording anything (what-if questions of admission)."""
        return self._plan(specs, profiles, longest_segment_ms, queue_ms)[0]

    def _plan(self, specs: list[SessionSpec],
              profiles: Mapping[tuple[str, str], BatchingProfile],
              longest_segment_ms: float, queue_ms: float) -> tuple[GpuPlan | Infeasible, float]:
        if cut := self.own_ms(queue_ms):
            specs = [replace(s, slo_ms=max(s.slo_ms - cut, 1e-3)) for s in specs]
        return plan_with_headroom(specs, profiles, self._config.gpu_type,
                                  self._config.memory_mib, longest_segment_ms)

    def own_ms(self, queue_ms: float) -> float:
        """The request path's own time in a request's deadline, as learned on this host
        (``RequestPathCost.own_ms``), with ``queue_ms`` its CPU queue's tail."""
        return self.path.own_ms(queue_ms)

    def adopt(self, plan: GpuPlan | None) -> None:
        self.plan = plan

    def on_tick(self, now: float, sessions: Mapping[str, SloState],
                longest_segment_ms: float, best_effort: bool = False) -> GpuPlan | None:
        """Once a rate window: refresh the margin and the sessions' observed rates, and
        review who gives way to the host (``sacrifice.py``; ``best_effort``: whether a
        best-effort job is registered); the plan to adopt when the margin or the rates
        moved enough (None: keep the plan). What is admitted stays when no plan fits;
        later admissions see the margin."""
        adopt: GpuPlan | None = None
        if self._inputs_moved(now) and sessions:
            adopt = self._replan([s.spec for s in sessions.values()], sessions,
                                 longest_segment_ms) or adopt
        cfg = self._config
        drifted = closed = False
        for sess in sessions.values():
            change = sess.observe_rate(now, cfg.rate_window_ms, cfg.rate_ewma_alpha)
            drifted |= change is not None and change * 100.0 > cfg.replan_threshold_percent
            closed |= change is not None
        if closed:
            held = [Held(s.spec.name, s.priority, s.hold) for s in sessions.values()
                    if s.hold is not None]
            self.sacrifice.review(now, held, best_effort, self._host_now())
        if drifted and now - self._last_replan_ms >= cfg.min_replan_interval_ms:
            self._last_replan_ms = now
            specs = [replace(s.spec, rate_rps=max(s.rate_ewma_rps, 0.1))
                     for s in sessions.values()]
            adopt = self._replan(specs, sessions, longest_segment_ms) or adopt
        return adopt

    def _host_now(self) -> str:
        """The request path as served now, for a scale-down's reason."""
        f = self.path.figures()
        return (f"request path p99 {f.front_ms:.3g} ms before the queue, {f.back_ms:.3g} ms "
                f"after the result, write reserve {self.path.write_reserve_ms():.3g} ms")

    def _replan(self, specs: list[SessionSpec], sessions: Mapping[str, SloState],
                longest_segment_ms: float) -> GpuPlan | None:
        plan = self.propose(specs, self.profile_map(sessions.values()), longest_segment_ms)
        if isinstance(plan, GpuPlan):
            self.replans += 1
            return plan
        self.replans_refused += 1
        return None

    def _inputs_moved(self, now: float) -> bool:
        """Once a rate window: refresh the latency margin and look at the request path's
        time; True when either moved enough that planning must redo."""
        cfg = self._config
        if now - self._last_margin_ms < cfg.rate_window_ms:
            return False
        self._last_margin_ms = now
        margin = cfg.learn_latency_margin and self.margin.refresh()
        was, now_ms = self._own_in_plan, self.own_ms(0.0)
        return margin or abs(now_ms - was) > max(1.0, 0.2 * was)
