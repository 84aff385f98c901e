"""Per-session counters and the outcome of one request."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from agent.inference.errors import DropReason

QUANTUM_HISTORY = 4096
"""How many recent quantum lengths each best-effort session keeps for statistics."""


@dataclass(frozen=True)
class Outcome:
    """What happened to a request: outputs, or why there are none."""

    outputs: tuple[Any, ...] | None
    reason: DropReason | None
    latency_ms: float
    late: bool = False
    """Outputs finished after the deadline, given because the client accepts late answers."""


@dataclass
class SessionStats:
    """Counters of one session since it was registered."""

    arrived: int = 0
    served: int = 0
    good: int = 0
    """Served within the SLO (best effort: every served request)."""
    late: int = 0
    dropped: int = 0
    drop_reasons: Counter[str] = field(default_factory=Counter)
    batch_sizes: Counter[int] = field(default_factory=Counter)
    gpu_time_ms: float = 0.0
    quantum_lengths_ms: deque[float] = field(default_factory=lambda: deque(maxlen=QUANTUM_HISTORY))
    quanta: int = 0

    def record_drop(self, reason: DropReason) -> None:
        """Count one dropped request."""
        self.dropped += 1
        self.drop_reasons[reason.value] += 1

    @property
    def slo_attainment(self) -> float:
        """Share of finished requests served within their deadline (1.0 before any)."""
        finished = self.served + self.dropped
        return self.good / finished if finished else 1.0

    def to_json(self, elapsed_ms: float) -> dict[str, Any]:
        """Counters as JSON, with goodput over ``elapsed_ms``."""
        lengths = list(self.quantum_lengths_ms)
        mean = sum(lengths) / len(lengths) if lengths else None
        std = (
            math.sqrt(sum((x - mean) ** 2 for x in lengths) / len(lengths))
            if lengths and mean is not None
            else None
        )
        return {
            "arrived": self.arrived,
            "served": self.served,
            "good": self.good,
            "late": self.late,
            "dropped": self.dropped,
            "drop_reasons": dict(sorted(self.drop_reasons.items())),
            "slo_attainment": self.slo_attainment,
            "goodput_rps": self.good * 1000.0 / elapsed_ms if elapsed_ms > 0 else 0.0,
            "batch_sizes": {str(b): n for b, n in sorted(self.batch_sizes.items())},
            "gpu_time_ms": self.gpu_time_ms,
            "quanta": self.quanta,
            "quantum_mean_ms": mean,
            "quantum_std_ms": std,
        }
