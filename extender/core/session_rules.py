"""Session rules: what an inference pod needs from a GPU beyond the per-GPU constraints.

They need the planner, behind the typed seam :class:`PlannerFn` (``planner.plan_gpu``
in production, anything with its signature in tests; its answer is a ``GpuPlan`` or
an ``Infeasible`` value, told apart with ``isinstance``). :func:`extender.core.decide.evaluate`
applies them to the rows that passed :mod:`extender.core.rules`.

For an SLO session, the GPU's duty cycle with the session added must plan
(``SLO_UNREACHABLE`` on a GPU without sessions: the SLO cannot be met on that type
at all; ``SLO_INFEASIBLE`` otherwise; a session with no profile for the type, under
the session cold-start rule of :mod:`extender.core.demand`, only on a GPU without
pods, at cost 1). Cost: best fit, ``1 - occupancy`` of the duty cycle with the
session added.

For a best-effort session, the GPU's SLO sessions must leave more than
``min_best_effort_slack_percent`` of the duty cycle idle, and the job (its whole
model at batch 1, from its profile) must fit that idle time or overrun a cycle
without an SLO miss (``planner.overrun``, the rule the inference server's
registration applies; both ``NoBestEffortSlack``). Cost: spread, ``1 - slack * w /
(W + w)`` where ``slack`` is the idle share of the duty cycle (1 on an empty GPU),
``W`` the weights of the best-effort sessions already there and ``w`` the new
one's (priority sessions count 1): the GPU that would give the new session the
largest share of its slack wins, so weighted jobs spread instead of piling onto
one GPU; ties go to the lower GPU row. The session's predicted utilisation is
``min(its demand, 100 * that share)`` at bind; later best-effort arrivals shrink
its share without rewriting its annotation, so a serving GPU's summed prediction
may exceed 100%: read it as demand, as on training GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from extender.core.demand import SESSION_COLD_START, ResolvedDemand
from extender.core.reasons import Reason
from extender.core.snapshot import SessionSpec
from extender.core.table import GpuTable
from planner.overrun import best_effort_refusal
from planner.types import GpuPlan, Infeasible

if TYPE_CHECKING:
    from planner.duty_cycle import Profiles


class PlannerFn(Protocol):
    """The planner seam: ``planner.plan_gpu`` or anything with its signature."""

    def __call__(self, sessions: Sequence[SessionSpec], profiles: Profiles, gpu_type: str,
                 memory_mib: float, /) -> GpuPlan | Infeasible:
        """The duty cycle of ``sessions`` sharing one GPU, or why they cannot."""
        ...


@dataclass(frozen=True)
class InferenceContext:
    """What SLO feasibility needs: the planner function and batching profiles."""

    planner: PlannerFn
    profiles: Profiles



def checked_plan(planner: PlannerFn, sessions: Sequence[SessionSpec], profiles: Profiles,
                 gpu_type: str, memory_mib: float) -> GpuPlan | Infeasible:
    """Call the planner seam and hold it to its result type."""
    result = planner(sessions, profiles, gpu_type, memory_mib)
    if not isinstance(result, GpuPlan | Infeasible):
        raise TypeError(f"planner returned {type(result).__name__}, "
                        "expected planner.types.GpuPlan or Infeasible")
    return result


def session_util_percent(plan: GpuPlan, session: SessionSpec) -> float:
    """Share of the duty cycle the session's batches take, in percent."""
    busy = sum(a.batch_latency_ms for a in plan.allocations if a.session == session)
    return 100.0 * busy / plan.duty_cycle_ms if plan.duty_cycle_ms > 0 else 0.0



@dataclass(frozen=True)
class SessionCosts:
    """What the session rules found on the candidate rows."""

    cost: np.ndarray
    code: np.ndarray
    """The rows' reason codes with the session rules' rejections added."""
    plans: dict[int, GpuPlan] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    """Per GPU type, why the planner refused (for the rejection's detail)."""
    shares: dict[int, float] = field(default_factory=dict)



def inference_costs(
    table: GpuTable, rows: np.ndarray, code: np.ndarray, demand: ResolvedDemand,
    inference: InferenceContext | None,
) -> SessionCosts:
    """Best fit: cost = 1 - occupancy of the GPU's duty cycle with the session added."""
    cost = np.full(rows.size, np.inf)
    code = code.copy()
    session = demand.session
    if inference is None or session is None:
        code[code == 0] = Reason.SLO_UNREACHABLE.code
        return SessionCosts(cost, code)
    plans: dict[int, GpuPlan] = {}
    notes: dict[str, str] = {}
    cache: dict[tuple[str, tuple[SessionSpec, ...], float], GpuPlan | Infeasible] = {}
    for i in np.flatnonzero(code == 0).tolist():
        row = int(rows[i])
        existing = table.sessions.get(row, ())
        gpu_type = table.type_names[table.type_id[row]]
        type_demand = demand.for_type(gpu_type)
        if type_demand is not None and type_demand.source == SESSION_COLD_START:
            # No profile to plan with: an idle GPU alone, measured by its server.
            if int(table.pod_count[row]) == 0:
                cost[i] = 1.0
            else:
                code[i] = Reason.SLO_INFEASIBLE.code
                notes.setdefault(gpu_type, f"no batching profile for {session.model}: "
                                 "without one a session takes an idle GPU alone (cold start)")
            continue
        key = (gpu_type, existing, float(table.capacity_mib[row]))
        if key not in cache:
            cache[key] = checked_plan(inference.planner, (*existing, session),
                                      inference.profiles, gpu_type,
                                      float(table.capacity_mib[row]))
        plan = cache[key]
        if isinstance(plan, GpuPlan):
            plans[row] = plan
            cost[i] = 1.0 - float(plan.occupancy)
        else:
            code[i] = (Reason.SLO_INFEASIBLE if existing else Reason.SLO_UNREACHABLE).code
            notes.setdefault(gpu_type, plan.message())
    return SessionCosts(cost, code, plans, notes)


def best_effort_costs(
    table: GpuTable, rows: np.ndarray, code: np.ndarray, demand: ResolvedDemand,
    inference: InferenceContext | None, min_slack_percent: float,
) -> SessionCosts:
    """Spread: cost = 1 - the share of the GPU's slack the session would get (module doc)."""
    min_slack = min_slack_percent / 100.0
    occupancy = np.zeros(rows.size)
    pieces = np.zeros(rows.size, dtype=bool)
    piece_notes: dict[str, str] = {}
    refusals: dict[tuple[str, tuple[SessionSpec, ...], float], Infeasible | None] = {}
    plans: dict[int, GpuPlan] = {}
    unknown: dict[str, str] = {}
    cache: dict[tuple[str, tuple[SessionSpec, ...], float], GpuPlan | Infeasible] = {}
    for i in np.flatnonzero(code == 0).tolist():
        row = int(rows[i])
        existing = table.sessions.get(row)
        if not existing:
            continue  # no SLO session: the whole GPU is slack
        gpu_type = table.type_names[table.type_id[row]]
        if inference is None:
            occupancy[i] = 1.0
            unknown.setdefault(gpu_type, "no planner to compute the SLO sessions' duty cycle")
            continue
        key = (gpu_type, existing, float(table.capacity_mib[row]))
        if key not in cache:
            cache[key] = checked_plan(inference.planner, existing, inference.profiles,
                                      gpu_type, float(table.capacity_mib[row]))
        plan = cache[key]
        if isinstance(plan, GpuPlan):
            plans[row] = plan
            occupancy[i] = float(plan.occupancy)
            if key not in refusals:
                refusals[key] = _piece_refusal(plan, existing, demand, inference, gpu_type,
                                               float(table.capacity_mib[row]))
            refusal = refusals[key]
            if refusal is not None:
                pieces[i] = True
                piece_notes.setdefault(gpu_type, refusal.message())
        else:  # profiles changed since the sessions were placed: promise nothing more
            occupancy[i] = 1.0
            unknown.setdefault(gpu_type, "the SLO sessions' duty cycle no longer plans")
    slack = np.clip(1.0 - occupancy, 0.0, 1.0)
    starved = (code == 0) & (slack <= min_slack + 1e-9)
    best_slack: dict[str, float] = {}
    for i in np.flatnonzero(starved).tolist():
        gpu_type = table.type_names[table.type_id[rows[i]]]
        best_slack[gpu_type] = max(float(slack[i]), best_slack.get(gpu_type, 0.0))
    notes = {gpu_type: unknown.get(gpu_type) or (
        f"SLO sessions leave at most {100 * most:.0f}% of the duty cycle idle; "
        f"best effort needs more than {100 * min_slack:.0f}%")
        for gpu_type, most in best_slack.items()}
    for i in np.flatnonzero((code == 0) & pieces & ~starved).tolist():
        gpu_type = table.type_names[table.type_id[rows[i]]]
        notes.setdefault(gpu_type, piece_notes[gpu_type])
    code = np.where(starved | ((code == 0) & pieces), Reason.NO_BEST_EFFORT_SLACK.code, code)
    weight = float(demand.job.share_weight)
    share = slack * weight / (table.best_effort_weight[rows] + weight)
    ok = np.flatnonzero(code == 0)
    shares = dict(zip(rows[ok].tolist(), share[ok].tolist(), strict=True))
    return SessionCosts(np.where(code == 0, 1.0 - share, np.inf), code, plans, notes, shares)


def _piece_refusal(plan: GpuPlan, existing: Sequence[SessionSpec], demand: ResolvedDemand,
                   inference: InferenceContext, gpu_type: str, capacity_mib: float,
                   ) -> Infeasible | None:
    """``planner.overrun``'s rule, the inference server's too, with the whole model at
    batch 1 as the piece: the extender cannot see the model's cut points, so it never
    judges a piece smaller than the server will (what it places, the server admits)."""
    model = demand.job.inputs.model
    profile = inference.profiles.get((model, gpu_type)) if model else None
    if profile is None:
        return None  # no profile: the server measures the model and applies the rule
    return best_effort_refusal(
        plan, existing,
        lambda shorter: checked_plan(inference.planner, tuple(shorter), inference.profiles,
                                     gpu_type, capacity_mib),
        float(profile.latency_ms(1)))

