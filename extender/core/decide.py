"""Filter, score and GPU choice: one vectorised evaluation over candidate nodes.

:func:`evaluate` is the single implementation behind ``/filter``,
``/prioritize``, ``/bind`` and the simulator. It computes, for every GPU of every
candidate node, the first hard constraint it violates (a :class:`Reason` code, 0
when it fits) and its Horus cost; a node is feasible when at least
``gpu_count`` of its GPUs fit, and its cost is the mean cost of its best
``gpu_count`` GPUs (ties broken by GPU row, i.e. node order then GPU index, so
replays are reproducible). Asking about one node is the same call with one name.

The per-GPU hard constraints and the co-location throughput rule are
:mod:`extender.core.rules`; after them come the session rules, which need the
planner: for an SLO session, the GPU's duty cycle with the session added must
plan (``SLO_UNREACHABLE`` on a GPU without sessions: the SLO cannot be met on
that type at all; ``SLO_INFEASIBLE`` otherwise; a session with no profile for the
type, under the session cold-start rule of :mod:`extender.core.demand`, only on a
GPU without pods, at cost 1); for a best-effort session, the
GPU's SLO sessions must leave more than ``min_best_effort_slack_percent`` of the
duty cycle idle, and the job (its whole model at batch 1, from its profile) must
fit that idle time or overrun a cycle without an SLO miss (``planner.overrun``,
the rule the inference server's registration applies; both ``NoBestEffortSlack``).

Costs (lower is better). Training: Horus Eq. 7. SLO session: best fit, ``1 -
occupancy`` of the duty cycle with the session added. Best-effort session:
spread, ``1 - slack * w / (W + w)`` where ``slack`` is the idle share of the
duty cycle (1 on an empty GPU), ``W`` the weights of the best-effort sessions
already there and ``w`` the new one's (priority sessions count 1): the GPU that
would give the new session the largest share of its slack wins, so weighted
jobs spread instead of piling onto one GPU; ties go to the lower GPU row. The
session's predicted utilisation is ``min(its demand, 100 * that share)`` at bind;
later best-effort arrivals shrink its share without rewriting its annotation, so
a serving GPU's summed prediction may exceed 100%: read it as demand, as on
training GPUs.

The planner is a seam (:class:`PlannerFn`): ``planner.plan_gpu`` in production,
anything with its signature in tests. Its answer is a ``GpuPlan`` or an
``Infeasible`` value, told apart with ``isinstance``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Protocol

import numpy as np

from extender.core.cost import CostPolicy, horus_cost, scores_from_costs
from extender.core.demand import SESSION_COLD_START, ResolvedDemand
from extender.core.pair_cost import pair_cost, pair_rule, pair_terms
from extender.core.reasons import REASON_BY_CODE, Reason, Rejection, is_unresolvable
from extender.core.rules import GpuLoad, colocation_rule_on, first_reasons, gpu_checks
from extender.core.snapshot import NodeName, Placement, PodUid, SessionSpec, Workload
from extender.core.table import GpuTable
from planner.overrun import best_effort_refusal
from planner.types import GpuPlan, Infeasible

if TYPE_CHECKING:
    from planner.duty_cycle import Profiles

_K = len(REASON_BY_CODE)
_RESOLVABLE_CODES = np.array(
    [r is None or not is_unresolvable(r) for r in REASON_BY_CODE], dtype=bool
)


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


@dataclass(frozen=True)
class DecisionContext:
    """What a decision depends on besides the table and the pod: policy, clock, planner."""

    policy: CostPolicy
    now_seconds: float
    """The clock the table's observations are stamped with (freshness of agent reports)."""
    inference: InferenceContext | None = None
    """None: inference sessions are rejected as SLO unreachable (no planner)."""


class Purpose(enum.Enum):
    """What the caller needs from :func:`evaluate`; each skips work the others need."""

    FILTER = "filter"
    """Feasibility and rejections; the Horus cost of training jobs is skipped (node cost 0)."""
    SCORE = "score"
    """Feasibility, rejections and costs (``/prioritize``, ``/bind``)."""
    PLACE = "place"
    """Feasibility and costs, no rejections (the simulator only needs the best node)."""


def _plan(planner: PlannerFn, sessions: Sequence[SessionSpec], profiles: Profiles,
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
class Evaluation:
    """The verdict on every candidate node, in the order the names were given."""

    names: tuple[str, ...]
    node_cost: np.ndarray
    """Mean cost of the node's best GPUs; ``inf`` when infeasible."""
    rejections: Mapping[str, Rejection]
    selected_rows: np.ndarray
    selected_owner: np.ndarray
    table: GpuTable = field(repr=False)
    plans: Mapping[int, GpuPlan] = field(default_factory=dict)
    demand: ResolvedDemand | None = None
    shares: Mapping[int, float] = field(default_factory=dict)
    interference_sources: Mapping[int, str] = field(default_factory=dict)
    """Table row -> where its pairwise interference figure came from (``pair:<n>``,
    ``profile``, ``curve``); rows judged by the curve alone are absent."""
    """Best-effort only: per feasible row, the share of the GPU (0..1) the session would get."""

    @property
    def feasible(self) -> np.ndarray:
        """Boolean mask over ``names``."""
        return np.isfinite(self.node_cost)

    def feasible_names(self) -> list[str]:
        """Names that passed, in input order."""
        return [n for n, ok in zip(self.names, self.feasible.tolist(), strict=True) if ok]

    def scores(self) -> list[int]:
        """Integer 0..10 per name; infeasible nodes score 0."""
        ok = self.feasible
        out = np.zeros(len(self.names), dtype=np.int64)
        out[ok] = scores_from_costs(self.node_cost[ok])
        return out.tolist()  # Python ints: the wire needs JSON integers

    def chosen_rows(self, position: int) -> list[int]:
        """Rows of the best GPUs of candidate ``position`` (empty when infeasible)."""
        if not np.isfinite(self.node_cost[position]):
            return []
        return sorted(self.selected_rows[self.selected_owner == position].tolist())


@dataclass(frozen=True)
class _SessionCosts:
    """What the session rules found on the candidate rows."""

    cost: np.ndarray
    code: np.ndarray
    """The rows' reason codes with the session rules' rejections added."""
    plans: dict[int, GpuPlan] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    """Per GPU type, why the planner refused (for the rejection's detail)."""
    shares: dict[int, float] = field(default_factory=dict)


def evaluate(table: GpuTable, names: Sequence[str], demand: ResolvedDemand,
             context: DecisionContext, purpose: Purpose = Purpose.SCORE) -> Evaluation:
    """Check hard constraints and cost every GPU of every candidate node (see :class:`Purpose`)."""
    policy, now_seconds = context.policy, context.now_seconds
    need = demand.job.gpu_count
    positions = len(names)
    # map() over dict.get keeps the per-name lookup in C (500 names per call).
    ids = np.fromiter(map(table.node_index.get, names, repeat(-1)), dtype=np.int64,
                      count=positions)
    rows, owner = _candidate_rows(table, ids)
    # With one GPU type (the usual cluster) per-type values stay shape (1,) and broadcast:
    # the elementwise results are the same as gathering them per row, without the gathers.
    tid = table.type_id[rows] if len(table.type_names) > 1 else None

    by_type = np.full((2, max(len(table.type_names), 1)), np.nan)  # (util, mem) per type id
    for t, type_name in enumerate(table.type_names):
        td = demand.for_type(type_name)
        if td is not None:
            by_type[:, t] = td.util_percent, td.mem_mib
    unknown = _per_row(np.isnan(by_type[1]), tid)
    # Rows whose demand is unknown are rejected first, so the other rules may read 0 there.
    known_by_type = by_type if np.isfinite(by_type).all() else np.nan_to_num(by_type)
    job_util, job_mem = _per_row(known_by_type[0], tid), _per_row(known_by_type[1], tid)

    inferring = demand.job.workload is Workload.INFERENCE
    training_costs = not inferring and purpose is not Purpose.FILTER
    load = GpuLoad.read(table, rows, policy, now_seconds, with_util=training_costs or (
        not inferring and colocation_rule_on(policy)))
    code = first_reasons(gpu_checks(load, policy, inferring, job_util, job_mem, unknown),
                         rows.size)
    pairs = None if inferring or load.coeffs is None else pair_terms(
        table, rows, demand.job.inputs.model, policy, job_util, load.coeffs)
    if pairs is not None:  # the learned pair figures judge these rows (extender.core.pairs)
        code = pair_rule(code, pairs, policy)

    gaps = {t: f"demand unknown: {why}" for t, why in demand.gaps.items()}
    if inferring:
        found = (_best_effort_costs(table, rows, code, demand, context) if demand.job.best_effort
                 else _inference_costs(table, rows, code, demand, context.inference))
        code, cost, plans, shares = found.code, found.cost, found.plans, found.shares
        notes = {**found.notes, **gaps}  # an unknown demand explains a type before the planner
    else:
        plans, shares, notes = {}, {}, gaps
        if training_costs:
            assert load.util_now is not None and load.coeffs is not None
            cost = horus_cost(policy, load.used_mib, job_mem, load.capacity_mib, load.util_now,
                              job_util, load.coeffs)
            if pairs is not None:
                cost = pair_cost(cost, pairs, policy, load, job_mem)
        else:
            cost = np.zeros(rows.size)
    cost = np.where(code == 0, cost, np.inf)

    ok_count = np.bincount(owner[code == 0], minlength=positions)
    sel = _best_gpus(owner, rows, cost, need, table.gpus_per_node)
    node_cost = np.bincount(owner[sel], weights=np.where(np.isfinite(cost[sel]), cost[sel], 0.0),
                            minlength=positions) / max(need, 1)
    node_cost = np.where(ok_count >= need, node_cost, np.inf)

    rejections = {} if purpose is Purpose.PLACE else _rejections(
        table, names, ids, rows, owner, code, load.free_mib, demand, node_cost, notes)
    return Evaluation(tuple(names), node_cost, rejections, rows[sel], owner[sel], table, plans,
                      demand, shares, pairs.sources if pairs is not None else {})


def _candidate_rows(table: GpuTable, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the known candidate nodes (``ids`` -1 = unknown) and each row's position."""
    if ids.size and ids.min() < 0:
        known = np.flatnonzero(ids >= 0)
        rows, owner = table.rows_for(ids[known])
        return rows, known[owner]
    return table.rows_for(ids)


def _per_row(by_type: np.ndarray, tid: np.ndarray | None) -> np.ndarray:
    """A per-type-id value per row; with one type (``tid`` None) the shape-(1,) array itself."""
    return by_type if tid is None else by_type[tid]


def _best_gpus(owner: np.ndarray, rows: np.ndarray, cost: np.ndarray, need: int,
               width: int | None) -> np.ndarray:
    """Indices (into ``rows``) of each node's ``need`` cheapest GPUs, ties by lower row.

    Rows arrive grouped by node in ascending row order. When every node has ``width``
    GPUs the groups are the rows of a ``(nodes, width)`` matrix, and a first-minimum
    ``argmin`` (one GPU) or a stable ``argsort`` (several) per row is the tie rule.
    Otherwise, for one GPU a stable per-group argmin suffices; several GPUs need the
    general (node, cost, row) sort.
    """
    if rows.size == 0:
        return np.zeros(0, dtype=np.int64)
    if width:
        by_node = cost.reshape(-1, width)
        first_of_node = np.arange(0, rows.size, width)
        if need == 1:
            return first_of_node + by_node.argmin(axis=1)
        cheapest = np.argsort(by_node, axis=1, kind="stable")[:, :need]
        return (cheapest + first_of_node[:, None]).ravel()
    if need == 1:
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
        group_min = np.minimum.reduceat(cost, starts)
        lengths = np.diff(np.r_[starts, owner.size])
        is_min = cost == np.repeat(group_min, lengths)
        # first minimal row of each group (rows are ascending within a group)
        first = np.minimum.reduceat(np.where(is_min, np.arange(owner.size), owner.size), starts)
        return first
    order = np.lexsort((rows, cost, owner))
    sorted_owner = owner[order]
    rank = np.arange(order.size) - np.searchsorted(sorted_owner, sorted_owner, side="left")
    return order[rank < need]


def _inference_costs(
    table: GpuTable, rows: np.ndarray, code: np.ndarray, demand: ResolvedDemand,
    inference: InferenceContext | None,
) -> _SessionCosts:
    """Best fit: cost = 1 - occupancy of the GPU's duty cycle with the session added."""
    cost = np.full(rows.size, np.inf)
    code = code.copy()
    session = demand.session
    if inference is None or session is None:
        code[code == 0] = Reason.SLO_UNREACHABLE.code
        return _SessionCosts(cost, code)
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
            cache[key] = _plan(inference.planner, (*existing, session), inference.profiles,
                               gpu_type, float(table.capacity_mib[row]))
        plan = cache[key]
        if isinstance(plan, GpuPlan):
            plans[row] = plan
            cost[i] = 1.0 - float(plan.occupancy)
        else:
            code[i] = (Reason.SLO_INFEASIBLE if existing else Reason.SLO_UNREACHABLE).code
            notes.setdefault(gpu_type, plan.message())
    return _SessionCosts(cost, code, plans, notes)


def _best_effort_costs(
    table: GpuTable, rows: np.ndarray, code: np.ndarray, demand: ResolvedDemand,
    context: DecisionContext,
) -> _SessionCosts:
    """Spread: cost = 1 - the share of the GPU's slack the session would get (module doc)."""
    inference = context.inference
    min_slack = context.policy.min_best_effort_slack_percent / 100.0
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
            cache[key] = _plan(inference.planner, existing, inference.profiles, gpu_type,
                               float(table.capacity_mib[row]))
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
    return _SessionCosts(np.where(code == 0, 1.0 - share, np.inf), code, plans, notes, shares)


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
        lambda shorter: _plan(inference.planner, tuple(shorter), inference.profiles, gpu_type,
                              capacity_mib),
        float(profile.latency_ms(1)))


def _rejections(
    table: GpuTable, names: Sequence[str], ids: np.ndarray, rows: np.ndarray, owner: np.ndarray,
    code: np.ndarray, free_mib: np.ndarray, demand: ResolvedDemand, node_cost: np.ndarray,
    notes: Mapping[str, str],
) -> dict[str, Rejection]:
    bad = np.flatnonzero(~np.isfinite(node_cost))
    if bad.size == 0:
        return {}
    positions = len(names)
    need = demand.job.gpu_count
    counts = np.bincount(owner * _K + code, minlength=positions * _K).reshape(positions, _K)
    free = np.full(positions, -np.inf)
    np.maximum.at(free, owner, free_mib)
    total = counts.sum(axis=1)
    fixable = counts[:, _RESOLVABLE_CODES].sum(axis=1)
    # With the demand unknown on every type, the pod's own request is the figure to name.
    job_mib = max((t.mem_mib for t in demand.by_type.values()),
                  default=demand.job.inputs.mem_mib or 0.0)
    node_types: dict[int, set[str]] = {}
    if notes:
        for i in np.flatnonzero(code != 0).tolist():
            gpu_type = table.type_names[table.type_id[rows[i]]]
            node_types.setdefault(int(owner[i]), set()).add(gpu_type)
    out: dict[str, Rejection] = {}
    for pos in bad.tolist():
        name = names[pos]
        common = {"node": name, "requested_gpus": need, "requested_mib": job_mib}
        if ids[pos] < 0:
            out[name] = Rejection(reason=Reason.UNKNOWN_NODE, unresolvable=True, **common)
            continue
        n_gpus = int(total[pos])
        if n_gpus == 0 or n_gpus < need:
            reason = Reason.NO_GPU_INVENTORY if n_gpus == 0 else Reason.TOO_FEW_GPUS
            out[name] = Rejection(reason=reason, unresolvable=True, gpus_total=n_gpus, **common)
            continue
        per_reason = {REASON_BY_CODE[c]: int(counts[pos, c]) for c in range(1, _K)
                      if counts[pos, c]}
        main = REASON_BY_CODE[1 + int(np.argmax(counts[pos, 1:]))]
        assert main is not None
        types = sorted(t for t in node_types.get(pos, ()) if t in notes)
        detail = "; ".join(f"{t}: {notes[t]}" for t in types)
        out[name] = Rejection(
            reason=main, unresolvable=bool(fixable[pos] < need), gpu_counts=per_reason,
            gpus_total=n_gpus, best_free_mib=max(0.0, float(free[pos])), detail=detail, **common,
        )
    return out


def choose(evaluation: Evaluation, position: int, pod_uid: str, pod: str) -> Placement | None:
    """The placement bind makes on candidate ``position`` (None when infeasible)."""
    rows = evaluation.chosen_rows(position)
    demand = evaluation.demand
    if not rows or demand is None:
        return None
    table = evaluation.table
    node = evaluation.names[position]
    type_demand = demand.for_type(table.type_names[table.type_id[rows[0]]])
    assert type_demand is not None
    util = type_demand.util_percent
    session = demand.session
    if demand.job.workload is Workload.INFERENCE and session is not None and (
            rows[0] in evaluation.plans):  # else cold start: the whole GPU, as demanded
        util = session_util_percent(evaluation.plans[rows[0]], session)
    elif demand.job.best_effort:
        # What quanta would give it now: its share of the slack, never more than it uses.
        util = min(util, 100.0 * evaluation.shares.get(rows[0], 0.0))
    return Placement(
        pod_uid=PodUid(pod_uid), pod=pod, node=NodeName(node),
        gpu_indices=tuple(table.gpus[r].index for r in rows),
        util_percent=util, mem_mib=type_demand.mem_mib,
        workload=demand.job.workload, session=session, weight=demand.job.share_weight,
    )
