"""Per-GPU duty cycle (Nexus Section 6.1): can these sessions share one GPU, and how?

A GPU cycles through its sessions, running one batch of each per duty cycle ``d``.
A session with rate ``r`` needs a batch ``b >= r*d`` (every request that arrives in a
cycle is served in the next one), and a request's worst case is ``d + l(b)``: it
just misses a batch, waits one cycle, then its batch runs. The batches must fit
in the cycle: ``sum l(b_i) <= d``. A session alone on a busy GPU has ``d = l(b)``,
which is the ``2*l(b)`` rule.

``plan_gpu`` answers with the largest feasible duty cycle (biggest batches, most
efficient) or an ``Infeasible`` value with the reason and the numbers. The
extender's admission filter, the inference server and the packer all call it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.dispatch import round_robin_worst_case_ms
from planner.types import (
    GpuPlan,
    Infeasible,
    InfeasibleReason,
    SessionAllocation,
    SessionError,
    SessionSpec,
)
from predictor.batching import BatchingProfile

Profiles = Mapping[tuple[str, str], BatchingProfile]

# Rates times durations are floats: 64 rps * 125 ms is 8 inputs, but may be
# computed as 8.000000000001. Tolerances keep exact paper examples exact.
_EPS = 1e-9


def batch_for(rate_rps: float, duty_cycle_ms: float) -> int:
    """Smallest batch that absorbs ``rate_rps`` over one duty cycle (at least 1)."""
    return max(1, math.ceil(rate_rps * duty_cycle_ms / 1000.0 - _EPS))


def max_duty_cycle_ms(profile: BatchingProfile, slo_ms: float, rate_rps: float) -> float | None:
    """Largest ``d`` with ``d + l(ceil(r*d)) <= slo``; None if even batch 1 misses the SLO.

    Nexus's residual rule ``b/r + l(b) <= L`` (Eq. 3.1) is the special case ``d = b/r``.
    ``g(b) = (b-1)/r + l(b)`` grows with ``b``, so the largest batch whose interval
    of duty cycles ``((b-1)/r, b/r]`` still meets the SLO is found by bisection.
    """
    per_ms = rate_rps / 1000.0
    lo, hi = 0, profile.max_batch  # invariant: batch lo is feasible (0 = none)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if (mid - 1) / per_ms + profile.latency_ms(mid) < slo_ms - _EPS:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        return None
    return min(lo / per_ms, slo_ms - profile.latency_ms(lo))


@dataclass(frozen=True)
class SaturatedConfig:
    """A session alone on a GPU, back to back: batch, latency and throughput."""

    batch: int
    batch_latency_ms: float
    throughput_rps: float


def saturated_config(profile: BatchingProfile, slo_ms: float) -> SaturatedConfig | None:
    """The highest-throughput batch with ``2*l(b) <= slo`` (Algorithm 1, line 3)."""
    best: SaturatedConfig | None = None
    limit = profile.max_batch_within(slo_ms / 2.0 + _EPS)
    for b in range(1, limit + 1):
        t = profile.throughput_rps(b)
        if best is None or t > best.throughput_rps + _EPS:
            best = SaturatedConfig(b, profile.latency_ms(b), t)
    return best


def plan_gpu(
    sessions: Sequence[SessionSpec],
    profiles: Profiles,
    gpu_type: str,
    memory_mib: float,
) -> GpuPlan | Infeasible:
    """Duty cycle for ``sessions`` sharing one GPU at their full rates, or why not."""
    return plan_shares([(s, s.rate_rps) for s in sessions], profiles, gpu_type, memory_mib)


def plan_shares(
    shares: Sequence[tuple[SessionSpec, float]],
    profiles: Profiles,
    gpu_type: str,
    memory_mib: float,
) -> GpuPlan | Infeasible:
    """Like ``plan_gpu`` for ``(session, rate share)`` pairs: a split session's part."""
    names = [s.name for s, _ in shares]
    if len(set(names)) != len(names):
        raise SessionError(f"duplicate session names on one GPU: {sorted(names)}")
    if not shares:
        return GpuPlan(gpu_type, 0.0, 0.0, (), 0.0)
    entries: list[tuple[SessionSpec, float, BatchingProfile, float]] = []
    for session, rate in shares:
        profile = profiles.get((session.model, gpu_type))
        if profile is None:
            return Infeasible(InfeasibleReason.NO_PROFILE, 0.0, 0.0, session.name)
        d_max = max_duty_cycle_ms(profile, session.slo_ms, rate)
        if d_max is None or 2.0 * profile.latency_ms(1) > session.slo_ms + _EPS:
            return Infeasible(
                InfeasibleReason.SLO_TOO_TIGHT,
                2.0 * profile.latency_ms(1),
                session.slo_ms,
                session.name,
            )
        # Batch 1 meets the SLO; alone, the cycle may still be too short for
        # the batch the rate needs.
        if _best_cycle([(rate, profile, d_max)]) is None:
            return _rate_too_high(session, rate, profile)
        entries.append((session, rate, profile, d_max))
    memory = sum(p.memory_mib for _, _, p, _ in entries)
    if memory > memory_mib + _EPS:
        return Infeasible(InfeasibleReason.MEMORY, memory, memory_mib)
    chosen = _best_cycle([(r, p, d) for _, r, p, d in entries])
    if chosen is None:
        return Infeasible(
            InfeasibleReason.OCCUPANCY_OVER_ONE,
            _occupancy_at(entries, min(d for *_, d in entries)),
            1.0,
        )
    allocations = []
    busy = 0.0
    for session, rate, profile, _ in entries:
        b = batch_for(rate, chosen)
        lat = profile.latency_ms(b)
        busy += lat
        worst = round_robin_worst_case_ms(chosen, lat)  # the deployed dispatch (dispatch.py)
        allocations.append(SessionAllocation(session, b, rate, worst, lat))
    return GpuPlan(gpu_type, chosen, min(1.0, busy / chosen), tuple(allocations), memory)


def _best_cycle(entries: Sequence[tuple[float, BatchingProfile, float]]) -> float | None:
    """Largest duty cycle at which every batch fits, or None.

    Within one interval where every ``ceil(r_i*d)`` is constant the batches'
    total latency is constant, so only the interval ends matter: the smallest
    per-session maximum ``d`` and every ``k/r_i`` below it, tried from the top.
    Below ``sum l_i(1)`` nothing fits, which bounds the scan.
    """
    d_top = min(d for _, _, d in entries)
    floor_ms = sum(p.latency_ms(1) for _, p, _ in entries)
    if d_top < floor_ms - _EPS:
        return None
    candidates = {d_top}
    for rate, _, _ in entries:
        per_ms = rate / 1000.0
        k = batch_for(rate, d_top) - 1
        while k >= 1 and k / per_ms >= floor_ms - _EPS:
            candidates.add(k / per_ms)
            k -= 1
    for d in sorted(candidates, reverse=True):
        if sum(p.latency_ms(batch_for(r, d)) for r, p, _ in entries) <= d + _EPS:
            return d
    return None


def _occupancy_at(
    entries: Sequence[tuple[SessionSpec, float, BatchingProfile, float]], d: float
) -> float:
    return sum(p.latency_ms(batch_for(r, d)) for _, r, p, _ in entries) / d


def max_rate_alone_rps(profile: BatchingProfile, slo_ms: float) -> float:
    """Highest rate one GPU sustains for this model within the SLO (0 if none)."""
    config = saturated_config(profile, slo_ms)
    return 0.0 if config is None else config.throughput_rps


def _rate_too_high(session: SessionSpec, rate: float, profile: BatchingProfile) -> Infeasible:
    return Infeasible(
        InfeasibleReason.RATE_TOO_HIGH,
        rate,
        max_rate_alone_rps(profile, session.slo_ms),
        session.name,
    )
