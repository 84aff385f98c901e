"""Olympian quanta: best-effort jobs share GPU time in quanta of measured GPU time.

Pure scheduling math (no I/O, no clock, no transport). The inference server's
executor thread asks :meth:`QuantaScheduler.select` which job runs its next graph
segment and reports the segment's measured GPU time (the wall time of its run on
the executor) with :meth:`QuantaScheduler.charge`. Olympian charges profiled node
costs (``T_j = Q*C_j/D_j``), which holds only at the batch size it profiled; a
segment's cost scales with the batch it actually runs, so we charge what it took.
A job holds the token until its turn's credit (``w*Q``) is spent; an overshoot is
carried as debt into later turns, as Olympian's line 17 carries the remainder.

One rule covers Olympian's three policies:

- priority: only runnable jobs of the highest priority class compete;
- weighted fair: inside a class, round robin where a job of integer weight ``w``
  keeps the token for ``w`` quanta per turn;
- fair: every job has weight 1 and priority 0.

Choosing Q follows Olympian: for each model take the smallest Q whose overhead on
its overhead-vs-quantum curve is within the operator's tolerance, then take the
largest of those so no model exceeds the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from contracts.annotations import PRIORITY_RANGE, WEIGHT_RANGE, AnnotationError
from predictor.shape import PiecewiseLinear, ShapeError


class QuantaError(ValueError):
    """Invalid quanta configuration or an unknown job."""


@dataclass(frozen=True)
class JobSpec:
    """A best-effort job's share: integer weight and priority class (higher runs first)."""

    name: str
    weight: int = 1
    priority: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise QuantaError("a job needs a name")
        # The ranges are the annotation contract's: what the extender lets bind runs here.
        for key, value, valid in (("weight", self.weight, WEIGHT_RANGE),
                                  ("priority", self.priority, PRIORITY_RANGE)):
            try:
                valid.check(value, key)
            except AnnotationError as exc:
                raise QuantaError(f"{self.name}: {key} {exc.problem}") from None


@dataclass(frozen=True)
class QuantumRecord:
    """One completed quantum: which job and how much profiled and measured GPU time it used."""

    job: str
    profiled_ms: float
    measured_ms: float


@dataclass
class _JobState:
    spec: JobSpec
    cumulative_cost_ms: float = 0.0
    cumulative_profiled_ms: float = 0.0
    credit_ms: float = 0.0
    """Time left in the job's turn; negative: debt from overshooting an earlier turn."""
    quantum_profiled_ms: float = 0.0
    quantum_measured_ms: float = 0.0
    quanta_completed: int = 0


@dataclass
class QuantaScheduler:
    """Token passing among best-effort jobs in quanta of ``quantum_ms`` measured GPU time.

    A turn is a deficit round: the job's credit grows by ``weight * Q`` and it keeps
    the token while the credit is positive. Each segment is charged the GPU time it
    was measured to take, so a segment that overshoots the turn leaves a debt that
    the job pays by sitting out later turns; a job that ran alone owes nobody and its
    debt is cleared. Unused credit is dropped when a job runs dry (no banking).
    """

    quantum_ms: float
    _jobs: dict[str, _JobState] = field(default_factory=dict, init=False)
    _order: list[str] = field(default_factory=list, init=False)
    _holder: str | None = field(default=None, init=False)
    _last_holder: str | None = field(default=None, init=False)
    _contended: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.quantum_ms) and self.quantum_ms > 0):
            raise QuantaError(f"quantum_ms must be > 0, got {self.quantum_ms}")

    def register(self, spec: JobSpec) -> None:
        """Add a job; it competes from the next decision on."""
        if spec.name in self._jobs:
            raise QuantaError(f"job {spec.name!r} is already registered")
        self._jobs[spec.name] = _JobState(spec)
        self._order.append(spec.name)

    def deregister(self, name: str) -> None:
        """Remove a job; if it held the token, the token passes at the next decision."""
        self._state(name)
        del self._jobs[name]
        self._order.remove(name)
        if self._holder == name:
            self._holder = None
        if self._last_holder == name:
            self._last_holder = None

    @property
    def holder(self) -> str | None:
        """The job that holds the token now, if any."""
        return self._holder

    def jobs(self) -> tuple[str, ...]:
        """Registered jobs in registration (round-robin) order."""
        return tuple(self._order)

    def select(self, runnable: Iterable[str]) -> str | None:
        """The job that runs the next segment among ``runnable``; moves the token if needed."""
        wanted = set(runnable)
        ready = [n for n in self._order if n in wanted]
        if not ready:
            return None
        top = max(self._jobs[n].spec.priority for n in ready)
        candidates = [n for n in ready if self._jobs[n].spec.priority == top]
        holder = self._holder
        if holder in candidates and self._jobs[holder].credit_ms > 0:
            return holder
        if holder is not None:
            # The turn ends early (ran dry or outranked): debt stays, credit goes, and
            # the partial turn is not a quantum.
            state = self._jobs[holder]
            state.credit_ms = min(state.credit_ms, 0.0)
            state.quantum_profiled_ms = state.quantum_measured_ms = 0.0
            self._holder = None
        if len(candidates) == 1:
            # Alone, the job took time nobody else wanted: it owes nothing.
            self._jobs[candidates[0]].credit_ms = max(self._jobs[candidates[0]].credit_ms, 0.0)
        nxt = self._next_turn(candidates)
        self._holder = self._last_holder = nxt
        self._contended = len(candidates) > 1
        return nxt

    def charge(self, name: str, profiled_ms: float, measured_ms: float) -> list[QuantumRecord]:
        """Charge one executed segment its measured GPU time; returns the turn it completed.

        A turn completes when its credit is spent; its record gives the profiled and
        measured time per quantum of the turn (the turn over the job's weight), so a
        quantum's overshoot past Q shows in ``measured_ms``.
        """
        for key, value in (("profiled_ms", profiled_ms), ("measured_ms", measured_ms)):
            if not (math.isfinite(value) and value >= 0):
                raise QuantaError(f"{key} must be >= 0, got {value}")
        state = self._state(name)
        state.cumulative_cost_ms += measured_ms
        state.cumulative_profiled_ms += profiled_ms
        state.credit_ms -= measured_ms
        state.quantum_profiled_ms += profiled_ms
        state.quantum_measured_ms += measured_ms
        if state.credit_ms > 0 or self._holder != name:
            return []
        weight = state.spec.weight
        record = QuantumRecord(
            name, state.quantum_profiled_ms / weight, state.quantum_measured_ms / weight
        )
        state.quanta_completed += weight
        state.quantum_profiled_ms = state.quantum_measured_ms = 0.0
        self._holder = None
        if not self._contended:  # an overshoot nobody waited for is no debt
            state.credit_ms = 0.0
        return [record]

    def cumulative_cost_ms(self) -> dict[str, float]:
        """Each job's total charged (measured) GPU time so far."""
        return {n: s.cumulative_cost_ms for n, s in self._jobs.items()}

    def debt_ms(self) -> dict[str, float]:
        """Each job's debt: GPU time it used beyond its turns, paid by skipping turns."""
        return {n: max(0.0, -s.credit_ms) for n, s in self._jobs.items()}

    def quanta_completed(self) -> dict[str, int]:
        """Each job's number of completed quanta."""
        return {n: s.quanta_completed for n, s in self._jobs.items()}

    def _next_turn(self, candidates: Sequence[str]) -> str:
        """Round robin after the last holder; each turn adds ``w*Q``; in-debt jobs skip."""
        order = self._rr_order(candidates)
        while True:
            for name in order:
                state = self._jobs[name]
                state.credit_ms += state.spec.weight * self.quantum_ms
                if state.credit_ms > 0:
                    return name
            # Every candidate is still in debt after a full round: skip whole rounds at
            # once (one round less than the smallest debt needs, so order is kept).
            rounds = min(
                math.ceil(-self._jobs[n].credit_ms / (self._jobs[n].spec.weight * self.quantum_ms))
                for n in order
            )
            for name in order:
                state = self._jobs[name]
                state.credit_ms += max(0, rounds - 1) * state.spec.weight * self.quantum_ms

    def _rr_order(self, candidates: Sequence[str]) -> list[str]:
        last = self._last_holder
        if last is None or last not in self._order:
            return list(candidates)
        start = self._order.index(last)
        n = len(self._order)
        rotated = [self._order[(start + step) % n] for step in range(1, n + 1)]
        return [name for name in rotated if name in candidates]

    def _state(self, name: str) -> _JobState:
        try:
            return self._jobs[name]
        except KeyError:
            raise QuantaError(f"unknown job {name!r}") from None


@dataclass(frozen=True)
class OverheadCurve:
    """Measured scheduling overhead (fraction of run time) against quantum length in ms."""

    model: str
    curve: PiecewiseLinear

    @classmethod
    def from_points(cls, model: str, points: Iterable[Sequence[float]]) -> OverheadCurve:
        """Build from ``[[quantum_ms, overhead_fraction], ...]`` sorted by quantum."""
        try:
            curve = PiecewiseLinear.from_points(points, path=f"{model}.overhead_curve")
        except ShapeError as exc:
            raise QuantaError(str(exc)) from exc
        if curve.xs[0] <= 0:
            raise QuantaError(f"{model}.overhead_curve: quantum lengths must be > 0 ms")
        return cls(model, curve)

    def smallest_quantum_within(self, tolerance: float) -> float | None:
        """Smallest measured-or-interpolated Q with overhead <= tolerance; None if none is."""
        xs, ys = self.curve.xs, self.curve.ys
        if ys[0] <= tolerance:
            return xs[0]
        for i in range(1, len(xs)):
            if ys[i] <= tolerance:
                # Linear between the last point above and the first within tolerance.
                x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
                return x0 + (x1 - x0) * (y0 - tolerance) / (y0 - y1)
        return None


def choose_quantum_ms(
    curves: Iterable[OverheadCurve],
    tolerance_percent: float,
    min_quantum_ms: float = 0.5,
    max_quantum_ms: float = 10.0,
) -> float:
    """Olympian's rule: the largest of each model's smallest Q within the overhead tolerance.

    A model whose curve never reaches the tolerance forces ``max_quantum_ms``; the
    result is clamped to ``[min_quantum_ms, max_quantum_ms]``.
    """
    if not (math.isfinite(tolerance_percent) and tolerance_percent > 0):
        raise QuantaError(f"tolerance_percent must be > 0, got {tolerance_percent}")
    if not 0 < min_quantum_ms <= max_quantum_ms:
        raise QuantaError("need 0 < min_quantum_ms <= max_quantum_ms")
    chosen = min_quantum_ms
    for curve in curves:
        q = curve.smallest_quantum_within(tolerance_percent / 100.0)
        chosen = max(chosen, max_quantum_ms if q is None else q)
    return min(chosen, max_quantum_ms)


def group_segments(atom_costs_ms: Sequence[float], target_ms: float) -> list[tuple[int, int]]:
    """Group sequential atoms into segments of about ``target_ms`` profiled cost.

    Returns half-open ``(start, end)`` atom ranges covering every atom in order. A
    segment closes once adding the next atom would take it further from the target
    than stopping; an atom costlier than the target becomes a segment of its own.
    """
    if not (math.isfinite(target_ms) and target_ms > 0):
        raise QuantaError(f"target_ms must be > 0, got {target_ms}")
    if any(not math.isfinite(c) or c < 0 for c in atom_costs_ms):
        raise QuantaError("atom costs must be finite and >= 0")
    ranges: list[tuple[int, int]] = []
    start, acc = 0, 0.0
    for i, cost in enumerate(atom_costs_ms):
        if i > start and abs(acc + cost - target_ms) > abs(acc - target_ms) and acc > 0:
            ranges.append((start, i))
            start, acc = i, 0.0
        acc += cost
    if atom_costs_ms:
        ranges.append((start, len(atom_costs_ms)))
    return ranges


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index of non-negative shares: 1.0 is perfectly fair."""
    xs = [float(v) for v in values]
    if not xs:
        raise QuantaError("Jain's index needs at least one value")
    total, squares = sum(xs), sum(x * x for x in xs)
    if squares == 0:
        return 1.0
    return total * total / (len(xs) * squares)


def weighted_share_errors(
    shares: Mapping[str, float], weights: Mapping[str, int]
) -> dict[str, float]:
    """Relative error of each job's share of GPU time against its weight's share."""
    total_share = sum(shares.values())
    total_weight = sum(weights[n] for n in shares)
    if total_share <= 0 or total_weight <= 0:
        raise QuantaError("shares and weights must have positive totals")
    return {n: (shares[n] / total_share) / (weights[n] / total_weight) - 1.0 for n in shares}
