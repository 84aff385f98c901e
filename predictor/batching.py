"""Batching profiles: the latency ``l(b)`` of one batch of ``b`` inputs on one GPU type.

A profile is either linear (``l(b) = alpha*b + beta``, the form Nexus's analysis
uses) or a measured table interpolated with the shared piecewise-linear helper.
The planner, the extender and the inference server all read profiles through
this one type.

Measured tables are noisy and sometimes dip (VGG-16 on a TITAN X measures batch 5
faster than batch 4). The duty-cycle rules assume ``l`` never decreases, so a table
profile answers with its running maximum: an upper bound of the measurement,
never an optimistic one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from contracts.annotations import BATCH_SIZE_RANGE
from predictor.shape import PiecewiseLinear, ShapeError

DEFAULT_MAX_BATCH = 512


class ProfileError(ValueError):
    """A batching profile's parameters are invalid."""


@dataclass(frozen=True)
class BatchingProfile:
    """Latency and memory of batched execution of one model on one GPU type."""

    model: str
    gpu_type: str
    memory_mib: float
    """GPU memory the loaded model needs, in MiB (at its largest planned batch)."""
    max_batch: int
    """Largest batch the profile covers (the last table row, or a configured cap)."""
    _latency_by_batch: tuple[float, ...] = field(repr=False)
    """Monotone latency in ms for batch 1..max_batch (index 0 is batch 1)."""
    alpha_ms: float | None = None
    beta_ms: float | None = None

    @classmethod
    def linear(
        cls,
        model: str,
        gpu_type: str,
        alpha_ms: float,
        beta_ms: float,
        memory_mib: float = 0.0,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> BatchingProfile:
        """``l(b) = alpha_ms*b + beta_ms`` for 1 <= b <= max_batch."""
        if not (math.isfinite(alpha_ms) and alpha_ms > 0):
            raise ProfileError(f"{model}@{gpu_type}: alpha_ms must be > 0, got {alpha_ms}")
        if not (math.isfinite(beta_ms) and beta_ms >= 0):
            raise ProfileError(f"{model}@{gpu_type}: beta_ms must be >= 0, got {beta_ms}")
        _check_common(model, gpu_type, memory_mib, max_batch)
        lat = tuple(alpha_ms * b + beta_ms for b in range(1, max_batch + 1))
        return cls(model, gpu_type, float(memory_mib), int(max_batch), lat, alpha_ms, beta_ms)

    @classmethod
    def from_table(
        cls,
        model: str,
        gpu_type: str,
        rows: Iterable[Sequence[float]],
        memory_mib: float = 0.0,
    ) -> BatchingProfile:
        """Measured ``[[batch, latency_ms], ...]`` rows, interpolated between batches.

        Below the first measured batch the first row's latency is used (an upper
        bound, since latency does not shrink with the batch); the last row's batch
        is the largest batch the profile allows.
        """
        rows = [tuple(r) for r in rows]
        try:
            curve = PiecewiseLinear.from_points(rows, path=f"{model}@{gpu_type}.table")
        except ShapeError as exc:
            raise ProfileError(str(exc)) from exc
        if curve.xs[0] < 1 or any(x != int(x) for x in curve.xs):
            raise ProfileError(f"{model}@{gpu_type}.table: batch sizes must be integers >= 1")
        if any(y <= 0 for y in curve.ys):
            raise ProfileError(f"{model}@{gpu_type}.table: latencies must be > 0 ms")
        max_batch = int(curve.xs[-1])
        _check_common(model, gpu_type, memory_mib, max_batch)
        running = 0.0
        lat = []
        for b in range(1, max_batch + 1):
            running = max(running, curve(b))
            lat.append(running)
        return cls(model, gpu_type, float(memory_mib), max_batch, tuple(lat))

    def latency_ms(self, batch: int) -> float:
        """Latency of one batch of ``batch`` inputs; raises for batches outside 1..max_batch."""
        if not 1 <= batch <= self.max_batch:
            raise ProfileError(
                f"{self.model}@{self.gpu_type}: batch {batch} outside 1..{self.max_batch}"
            )
        return self._latency_by_batch[batch - 1]

    def max_batch_within(self, latency_ms: float) -> int:
        """Largest batch whose latency is at most ``latency_ms``; 0 if none is."""
        return bisect.bisect_right(self._latency_by_batch, latency_ms)

    def throughput_rps(self, batch: int) -> float:
        """Requests per second when running back-to-back batches of ``batch``."""
        return batch * 1000.0 / self.latency_ms(batch)


def _check_common(model: str, gpu_type: str, memory_mib: float, max_batch: int) -> None:
    if not model or not gpu_type:
        raise ProfileError("a profile needs a model name and a GPU type")
    if not (math.isfinite(memory_mib) and memory_mib >= 0):
        raise ProfileError(f"{model}@{gpu_type}: memory_mib must be >= 0, got {memory_mib}")
    if not (isinstance(max_batch, int) and 1 <= max_batch <= BATCH_SIZE_RANGE.high):
        # The batch sizes a pod may ask for; the latency table is built batch by batch.
        raise ProfileError(f"{model}@{gpu_type}: max_batch must be an integer in "
                           f"1..{BATCH_SIZE_RANGE.high}, got {max_batch}")
