"""Which best-effort jobs may share a GPU with SLO sessions: the one rule both sides apply.

A best-effort job runs in pieces (segments) in the slack of the SLO sessions' duty
cycle. A piece longer than the slack never fits before the next cycle; the
inference server then lets it overrun one cycle, which pushes every SLO session's
next batch back by up to the piece's length. That is safe only where the plan
keeps that much headroom: made again with every SLO shortened by the piece, it
must still plan (``d + l(b) + piece <= SLO`` for every session).

:func:`overrun_plan` is what the server runs; :func:`best_effort_refusal` is the
admission rule: a job whose longest piece neither fits the slack nor has the
headroom is refused, by the extender's filter (``NoBestEffortSlack``, with this
message) and by the inference server's registration (HTTP 422, same message).
The extender cannot see a model's cut points, so it judges the whole model at
batch 1 (``l(1)`` from its profile), never a smaller piece than the server
would: what it places, the server admits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from planner.types import GpuPlan, Infeasible, InfeasibleReason, SessionSpec

Replan = Callable[[Sequence[SessionSpec]], "GpuPlan | Infeasible"]
"""Plans SLO sessions on the GPU in question (``plan_gpu`` bound to profiles and memory)."""

_EPS = 1e-9


def slack_ms(plan: GpuPlan) -> float:
    """Idle time per duty cycle once the SLO sessions' batches have run."""
    return max(0.0, plan.duty_cycle_ms * (1.0 - plan.occupancy))


def overrun_plan(
    plan: GpuPlan, sessions: Sequence[SessionSpec], replan: Replan, piece_ms: float
) -> tuple[GpuPlan | None, float]:
    """The plan that serves a job with pieces up to ``piece_ms``, and its headroom.

    ``(plan, 0)`` when the piece fits the slack; ``(tighter, piece_ms)`` when the
    sessions still plan with every SLO shortened by it; ``(None, 0)`` when neither:
    such a piece could only run by making an SLO session miss.
    """
    if not plan.allocations or piece_ms <= slack_ms(plan) + _EPS:
        return plan, 0.0
    if all(s.slo_ms > piece_ms for s in sessions):
        tighter = replan([replace(s, slo_ms=s.slo_ms - piece_ms) for s in sessions])
        if isinstance(tighter, GpuPlan):
            return tighter, piece_ms
    return None, 0.0


def best_effort_refusal(
    plan: GpuPlan, sessions: Sequence[SessionSpec], replan: Replan, piece_ms: float
) -> Infeasible | None:
    """Why a job whose longest piece takes ``piece_ms`` may not join, or None if it may."""
    chosen, _ = overrun_plan(plan, sessions, replan, piece_ms)
    if chosen is not None:
        return None
    return Infeasible(InfeasibleReason.BEST_EFFORT_PIECE, piece_ms, slack_ms(plan))
