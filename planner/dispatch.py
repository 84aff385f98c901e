"""How requests reach a session's GPUs, and the worst-case latency each way gives.

A plan promises each session a worst-case latency; the promise holds only for the
dispatch that the request path actually performs:

- **Round robin** (``DEPLOYED_DISPATCH``): a Kubernetes Service spreads a
  session's requests over its pods, each pod's server runs a Nexus duty cycle
  ``d``, and a request that just misses a batch waits one cycle, then its batch
  runs: ``d + l(b)``. A GPU running the session alone, back to back, has
  ``d = l(b)``: the ``2*l(b)`` rule.
- **Batch-aware** (Harpagon Theorem 1): a dispatcher hands each dedicated GPU
  whole batches of consecutive requests from the session's stream of rate ``w``,
  so a request waits at most for its batch to fill, ``b/w``, then the batch:
  ``l(b) + b/w``. tandem's request path has no such dispatcher, so a plan made
  with ``batch_aware_dispatch`` needs one; what the deployed path gives is
  :func:`deployed_worst_case_ms`.

``plan_gpu`` (the extender's admission of SLO sessions and the inference
server's) and ``tandem plan`` both compute the deployed figure with
:func:`round_robin_worst_case_ms`, so the plan and admission cannot disagree.
"""

from __future__ import annotations

import enum

from planner.types import GpuPlan, SessionAllocation


class Dispatch(enum.Enum):
    """Which requests a session's GPU receives."""

    ROUND_ROBIN = "round-robin"
    BATCH_AWARE = "batch-aware"


DEPLOYED_DISPATCH = Dispatch.ROUND_ROBIN
"""What tandem's request path does: a Service in front of the session pods."""


def round_robin_worst_case_ms(duty_cycle_ms: float, batch_latency_ms: float) -> float:
    """Worst case under round robin on a GPU with duty cycle ``d``: ``d + l(b)``."""
    return duty_cycle_ms + batch_latency_ms


def batch_aware_worst_case_ms(batch_latency_ms: float, batch: int, stream_rps: float) -> float:
    """Worst case of a dedicated GPU fed whole batches from a stream: ``l(b) + b/w``."""
    return batch_latency_ms + batch * 1000.0 / stream_rps


def dedicated_worst_case_ms(
    dispatch: Dispatch, batch_latency_ms: float, batch: int, stream_rps: float
) -> float:
    """Worst case of a GPU running one session alone, back to back, under ``dispatch``."""
    if dispatch is Dispatch.BATCH_AWARE:
        return batch_aware_worst_case_ms(batch_latency_ms, batch, stream_rps)
    return round_robin_worst_case_ms(batch_latency_ms, batch_latency_ms)


def deployed_worst_case_ms(plan: GpuPlan, alloc: SessionAllocation) -> float:
    """What the deployed request path gives ``alloc`` on ``plan``'s GPU, whatever was planned."""
    return round_robin_worst_case_ms(plan.duty_cycle_ms, alloc.batch_latency_ms)
