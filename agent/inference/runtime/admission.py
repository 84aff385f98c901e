"""What SLO admission adds to the Nexus plan on a real executor (pure; no clock, no I/O).

- ``LatencyMargin``: the executor's latency variance as observed. Each SLO batch
  reports its time over the profiled ``l(b)``; the margin is the ``quantile`` of
  those ratios over a window, minus 1. Planning scales every profile by
  ``1 + margin`` (``scaled_profile``), so what is admitted is what this device,
  as loaded now, can serve. Until it has samples, every batch time carries the
  delay measured at start-up (``executor_tail``).
- ``plan_with_headroom``: a best-effort segment that found no room for N cycles
  overruns one (the runtime's rule), moving the SLO sessions' next slot back by up
  to its length. Where such a segment exists the plan is made again with every SLO
  shortened by it, so the overrun cycle still meets them; if that is infeasible
  the plain plan stands (the extender admitted the sessions on the plain rule)
  and the segment may not overrun. A best-effort job whose longest segment has
  neither slack nor headroom is refused (``best_effort_refusal_on``, the rule of
  ``planner.overrun`` that the extender's filter applies too).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from planner import GpuPlan, Infeasible, SessionSpec, plan_gpu
from planner.overrun import best_effort_refusal, overrun_plan
from predictor.batching import BatchingProfile


class LatencyMargin:
    """The observed ``quantile`` of batch time / profiled time, minus 1 (never < 0)."""

    def __init__(self, quantile: float, window: int, min_samples: int):
        self.quantile = quantile
        self.min_samples = min_samples
        self.margin = 0.0
        self.start_delay_ms = 0.0
        """Added to every batch time until the margin is learned (``executor_tail``)."""
        self.share = 1.0
        """The share of a core the executor's priority got when last measured (start-up,
        each SLO registration): every batch is planned at ``1 / share`` at least, until
        ``min_samples`` batches served since show what the host does to them."""
        self._since_host = 0
        self._ratios: deque[float] = deque(maxlen=window)

    def observe_host(self, delay_ms: float, share: float) -> None:
        """The host as ``executor_tail`` measured it now; the delay counts only until
        served batches taught the margin, which covers it."""
        self.share, self._since_host = min(1.0, max(share, 0.05)), 0
        if len(self._ratios) < self.min_samples:
            self.start_delay_ms = delay_ms

    def planning_margin(self) -> float:
        """What planning scales profiles by, less 1: the learned margin, or the slow-down
        the executor's share of a core implies, whichever is larger."""
        return max(self.margin, 1.0 / self.share - 1.0)

    def observe(self, measured_ms: float, profiled_ms: float) -> None:
        """One batch's measured time against its profiled ``l(b)``."""
        if profiled_ms > 0:
            self._ratios.append(measured_ms / profiled_ms)
            self._since_host += 1

    def refresh(self) -> bool:
        """Recompute from the window; True when the margin moved enough to replan (or
        the start-up delay or the measured share gave way to it)."""
        if len(self._ratios) < self.min_samples:
            return False
        gave_way, self.start_delay_ms = self.start_delay_ms > 0, 0.0
        if self._since_host >= self.min_samples and self.share < 1.0:
            gave_way, self.share = True, 1.0
        ratios = sorted(self._ratios)
        value = ratios[min(len(ratios) - 1, int(self.quantile * len(ratios)))]
        margin = max(0.0, value - 1.0)
        # Small moves are noise: replanning for them would only churn batch sizes.
        if abs(margin - self.margin) <= 0.02 + 0.1 * self.margin:
            return gave_way
        self.margin = margin
        return True


def scaled_profile(profile: BatchingProfile, margin: float,
                   delay_ms: float = 0.0) -> BatchingProfile:
    """``profile`` with every batch's latency multiplied by ``1 + margin``, plus
    ``delay_ms``."""
    if margin <= 0 and delay_ms <= 0:
        return profile
    factor = 1.0 + max(margin, 0.0)
    rows = [(b, profile.latency_ms(b) * factor + max(delay_ms, 0.0))
            for b in range(1, profile.max_batch + 1)]
    return BatchingProfile.from_table(profile.model, profile.gpu_type, rows, profile.memory_mib)


def plan_with_headroom(
    specs: Sequence[SessionSpec],
    profiles: Mapping[tuple[str, str], BatchingProfile],
    gpu_type: str,
    memory_mib: float,
    longest_segment_ms: float,
) -> tuple[GpuPlan | Infeasible, float]:
    """The plan and the overrun headroom it keeps (0 where none is needed or possible).

    A plan made with headroom carries the shortened SLOs in its allocations; callers
    keep each session's real SLO for deadlines. The rule is ``planner.overrun``'s,
    the one the extender's filter applies.
    """
    plan = plan_gpu(list(specs), profiles, gpu_type, memory_mib)
    if not isinstance(plan, GpuPlan) or not plan.allocations:
        return plan, 0.0
    chosen, headroom = overrun_plan(plan, specs, _replan(profiles, gpu_type, memory_mib),
                                    longest_segment_ms)
    return (plan, 0.0) if chosen is None else (chosen, headroom)


def best_effort_refusal_on(
    specs: Sequence[SessionSpec],
    profiles: Mapping[tuple[str, str], BatchingProfile],
    gpu_type: str,
    memory_mib: float,
    piece_ms: float,
) -> Infeasible | None:
    """``planner.overrun.best_effort_refusal`` for the server's SLO sessions (None: admit)."""
    plan = plan_gpu(list(specs), profiles, gpu_type, memory_mib)
    if not isinstance(plan, GpuPlan):
        return None  # the SLO sessions themselves no longer plan: nothing to protect by refusing
    return best_effort_refusal(plan, specs, _replan(profiles, gpu_type, memory_mib), piece_ms)


def _replan(profiles: Mapping[tuple[str, str], BatchingProfile], gpu_type: str,
            memory_mib: float):
    return lambda shorter: plan_gpu(list(shorter), profiles, gpu_type, memory_mib)
