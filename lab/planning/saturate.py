"""Dedicated GPUs for heavy sessions: Nexus's saturate phase and Harpagon Algorithm 1.

A session whose rate exceeds what one GPU absorbs first gets whole GPUs running it
alone, back to back. What is left (the residual, below one GPU's worth) is packed
with other sessions by ``packing``.

- Nexus: one configuration, the highest-throughput batch with ``2*l(b) <= L``;
  ``floor(R/T)`` GPUs.
- Batch-aware dispatch: a dedicated GPU receives whole batches of consecutive
  requests from a stream of rate ``w`` (the rate not yet placed on better GPUs), so
  its worst case is ``l(b) + b/w`` (Harpagon Theorem 1) and larger batches fit.
- Multi-tuple: Harpagon Algorithm 1 keeps going down the configurations ranked by
  throughput per price, re-testing each against the smaller remaining rate.
- Dummy requests: pad the rate by ``t_i - u_i`` when that lowers the cost
  (Theorem 2: a leftover never needs more than one extra GPU of a tier).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from lab.planning.options import GpuType, HarpagonOptions
from planner.dispatch import dedicated_worst_case_ms
from planner.duty_cycle import batch_for, max_duty_cycle_ms
from planner.types import SessionSpec
from predictor.batching import BatchingProfile

_EPS = 1e-9


@dataclass(frozen=True)
class Tier:
    """``gpus`` dedicated GPUs of one type running a session alone at one batch."""

    gpu_type: str
    batch: int
    batch_latency_ms: float
    throughput_rps: float
    gpus: int
    worst_case_ms: float


@dataclass(frozen=True)
class SessionConfig:
    """How one session is served: dedicated tiers plus a residual rate to pack."""

    session: SessionSpec
    tiers: tuple[Tier, ...]
    residual_rps: float
    dummy_rps: float = 0.0
    cost: float = 0.0
    """Price of the tiers plus the residual's fractional GPU (Harpagon's cost model)."""


@dataclass
class ProfileIndex:
    """Per-profile lookups built once per planning run (shared by sessions of a model)."""

    profile: BatchingProfile
    allowed: frozenset[int] | None = None
    """Batch sizes a dedicated GPU may use (fixed-shape engines); None = any."""
    latencies: list[float] = field(init=False)
    latency_array: np.ndarray = field(init=False, repr=False)
    best_upto: list[int] = field(init=False)
    """best_upto[b-1]: the highest-throughput batch among 1..b."""

    def __post_init__(self) -> None:
        p = self.profile
        self.latencies = [p.latency_ms(b) for b in range(1, p.max_batch + 1)]
        self.latency_array = np.asarray(self.latencies)
        best, best_t, out = 1, 0.0, []
        for b, lat in enumerate(self.latencies, start=1):
            t = b / lat
            if (self.allowed is None or b in self.allowed) and t > best_t + _EPS:
                best, best_t = b, t
            out.append(best if best_t > 0 else 0)
        self.best_upto = out

    def best_batch_rr(self, slo_ms: float) -> int:
        """Best batch with ``2*l(b) <= slo`` (0 if none)."""
        limit = bisect.bisect_right(self.latencies, slo_ms / 2.0 + _EPS)
        return self.best_upto[limit - 1] if limit else 0

    def best_batch_dispatch(self, slo_ms: float, stream_rps: float) -> int:
        """Best batch with ``l(b) + b/w <= slo`` (0 if none); ``g(b)`` grows with b."""
        per_ms = stream_rps / 1000.0
        lo, hi = 0, len(self.latencies)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.latencies[mid - 1] + mid / per_ms <= slo_ms + _EPS:
                lo = mid
            else:
                hi = mid - 1
        return self.best_upto[lo - 1] if lo else 0


class ConfigPlanner:
    """Builds ``SessionConfig``s against one set of profiles, GPU types and options."""

    def __init__(
        self,
        profiles: Mapping[tuple[str, str], BatchingProfile],
        gpu_types: Sequence[GpuType],
        options: HarpagonOptions,
        allowed_batches: Mapping[tuple[str, str], Sequence[int]] | None = None,
    ):
        self.profiles = profiles
        self.allowed_batches = allowed_batches or {}
        self.gpu_types = tuple(gpu_types)
        self.options = options
        self._index: dict[tuple[str, str], ProfileIndex] = {}

    def index(self, model: str, gpu_type: str) -> ProfileIndex | None:
        """Cached lookups for (model, gpu_type); None without a profile."""
        key = (model, gpu_type)
        if key not in self._index:
            profile = self.profiles.get(key)
            if profile is None:
                return None
            allowed = self.allowed_batches.get(key)
            self._index[key] = ProfileIndex(
                profile, None if allowed is None else frozenset(allowed)
            )
        return self._index[key]

    def configure(
        self, session: SessionSpec, residual_slo_ms: float | None = None
    ) -> SessionConfig:
        """Dedicated tiers and residual for ``session`` (with dummy padding if enabled)."""
        base = self._configure(session, session.rate_rps, residual_slo_ms)
        if not (self.options.dummy_requests and base.tiers):
            return base
        best = base
        for i, tier in enumerate(base.tiers):
            below = sum(t.gpus * t.throughput_rps for t in base.tiers[i + 1 :])
            dummy = tier.throughput_rps - (below + base.residual_rps)
            if dummy <= _EPS:
                continue
            padded = self._configure(session, session.rate_rps + dummy, residual_slo_ms)
            if padded.cost < best.cost - _EPS:
                best = SessionConfig(session, padded.tiers, padded.residual_rps, dummy, padded.cost)
        return best

    def _configure(
        self, session: SessionSpec, rate: float, residual_slo_ms: float | None
    ) -> SessionConfig:
        tiers: list[Tier] = []
        remaining = rate
        cost = 0.0
        while remaining > _EPS:
            choice = self._best_config(session, remaining)
            if choice is None:
                break
            gpu, batch, lat, thr, price = choice
            n = int(remaining / thr + _EPS)
            if n < 1:
                break
            worst = dedicated_worst_case_ms(self.options.dispatch, lat, batch, remaining)
            tiers.append(Tier(gpu.name, batch, lat, thr, n, worst))
            remaining = max(0.0, remaining - n * thr)
            cost += n * price
            if not self.options.multi_tuple:
                break
        if remaining <= 1e-6 * rate:
            remaining = 0.0
        cost += self.residual_cost(session, remaining, residual_slo_ms)
        return SessionConfig(session, tuple(tiers), remaining, 0.0, cost)

    def _best_config(
        self, session: SessionSpec, stream_rps: float
    ) -> tuple[GpuType, int, float, float, float] | None:
        """Highest throughput-per-price dedicated configuration still feasible."""
        best: tuple[GpuType, int, float, float, float] | None = None
        best_key: tuple[float, float] | None = None
        for gpu in self.gpu_types:
            idx = self.index(session.model, gpu.name)
            if idx is None or idx.profile.memory_mib > gpu.memory_mib:
                continue
            if self.options.batch_aware_dispatch:
                b = idx.best_batch_dispatch(session.slo_ms, stream_rps)
            else:
                b = idx.best_batch_rr(session.slo_ms)
            if b == 0:
                continue
            lat = idx.latencies[b - 1]
            thr = b * 1000.0 / lat
            price = self.options.price(gpu)
            # Ties keep the earlier GPU type: deterministic in the caller's order.
            key = (thr / price, -lat)
            if best_key is None or key > best_key:
                best, best_key = (gpu, b, lat, thr, price), key
        return best

    def residual_cost(
        self, session: SessionSpec, rate: float, residual_slo_ms: float | None = None
    ) -> float:
        """Cheapest fractional GPU for a residual: price times its occupancy alone."""
        if rate <= 0:
            return 0.0
        slo = residual_slo_ms if residual_slo_ms is not None else session.slo_ms
        costs = []
        for gpu in self.gpu_types:
            idx = self.index(session.model, gpu.name)
            if idx is None:
                continue
            d = max_duty_cycle_ms(idx.profile, slo, rate)
            if d is None:
                continue
            occupancy = idx.latencies[batch_for(rate, d) - 1] / d
            costs.append(self.options.price(gpu) * occupancy)
        return min(costs) if costs else float("inf")
