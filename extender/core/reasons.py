"""Why a node cannot take a pod: a closed set of reasons, rendered at the edge.

Each reason is either *resolvable* (the node may fit later, or after tandem's own
preemption) or *unresolvable* (no retry on this node can help).
:func:`is_unresolvable` is the one place that decides it. On the wire every rejection
goes to ``FailedAndUnresolvableNodes``: kube-scheduler's preemption cannot see
``tandem.io/gpu``, so tandem preempts itself (``extender.core.preemption``).
Pod Event reasons come from the same enum (``event_reason``) so they stay stable.
Messages are deterministic: reasons sorted by enum order, with GPU counts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Reason(enum.Enum):
    """Why one GPU (or a whole node) cannot take the pod. Order = display order."""

    UNKNOWN_NODE = "unknown node"
    NO_GPU_INVENTORY = "no known GPU inventory"
    TOO_FEW_GPUS = "fewer GPUs than requested"
    DEMAND_UNKNOWN = "demand unknown for this GPU type"
    GPU_MEMORY_TOO_SMALL = "GPU memory smaller than the job"
    SLO_UNREACHABLE = "SLO unreachable on this GPU type"
    WORKLOAD_CONFLICT = "GPU serves the other workload kind"
    INSUFFICIENT_GPU_MEMORY = "insufficient free GPU memory"
    COLOCATION_LIMIT = "per-GPU co-location limit reached"
    COLOCATION_SLOWDOWN = "co-location would slow the GPU's jobs more than it gains"
    SLO_INFEASIBLE = "duty cycle cannot absorb the session"
    NO_BEST_EFFORT_SLACK = "no slack left for best-effort sessions"
    # Decided before (or after) the per-GPU rules, for the pod or the node as a whole.
    BAD_POD_REQUEST = "the pod's request cannot be read"
    HANDOFF_PENDING = "node is handing a GPU to another pod"

    @property
    def code(self) -> int:
        """Small stable integer (1-based) used in the vectorised evaluation."""
        return _CODES[self]

    @property
    def event_reason(self) -> str:
        """CamelCase reason for Kubernetes Events, e.g. ``InsufficientGpuMemory``."""
        return "".join(part.capitalize() for part in self.name.split("_"))


_UNRESOLVABLE = frozenset(
    {
        Reason.UNKNOWN_NODE,
        Reason.NO_GPU_INVENTORY,
        Reason.TOO_FEW_GPUS,
        Reason.DEMAND_UNKNOWN,
        Reason.GPU_MEMORY_TOO_SMALL,
        Reason.SLO_UNREACHABLE,
        Reason.BAD_POD_REQUEST,
    }
)
_CODES = {reason: i + 1 for i, reason in enumerate(Reason)}
REASON_BY_CODE: tuple[Reason | None, ...] = (None, *Reason)
"""Index 0 means "no problem"; ``REASON_BY_CODE[r.code] is r``."""


def is_unresolvable(reason: Reason) -> bool:
    """True when no retry or preemption can make this node fit the pod."""
    return reason in _UNRESOLVABLE


def reason_of_message(message: str) -> Reason | None:
    """The main reason of a :meth:`Rejection.message` (its first part), or None."""
    text = message.removeprefix("tandem: ")
    return next((r for r in Reason if text.startswith(r.value)), None)


@dataclass(frozen=True)
class Rejection:
    """A node rejected for a pod: the main reason, per-reason GPU counts, and numbers."""

    node: str
    reason: Reason
    unresolvable: bool
    gpu_counts: Mapping[Reason, int] = field(default_factory=dict)
    gpus_total: int = 0
    requested_gpus: int = 1
    requested_mib: float = 0.0
    best_free_mib: float = 0.0
    detail: str = ""

    def message(self) -> str:
        """Deterministic one-line text for FailedNodes maps and Events."""
        if not self.gpu_counts:
            text = self.reason.value
        else:
            parts = [
                f"{reason.value} on {count}/{self.gpus_total} GPUs"
                for reason, count in sorted(self.gpu_counts.items(), key=lambda kv: kv[0].code)
            ]
            text = "; ".join(parts)
        numbers = f" (need {self.requested_gpus} GPU(s) with {self.requested_mib:.0f} MiB"
        numbers += f", best free {self.best_free_mib:.0f} MiB)"
        extra = f": {self.detail}" if self.detail else ""
        return f"tandem: {text}{numbers}{extra}"
