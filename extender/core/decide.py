"""Filter, score, place and the removal what-if: the core's entry points over a Snapshot.

:func:`filter_nodes`, :func:`score_nodes`, :func:`place` and :func:`fits_without` are
what the service's verbs, preemption and the simulator call, each over one
:class:`extender.core.snapshot.Snapshot`; :func:`without` is the snapshot with some
pods gone (their reservations and what the agents observed of them).

:func:`evaluate` is the single implementation behind ``/filter``,
``/prioritize``, ``/bind`` and the simulator. It computes, for every GPU of every
candidate node, the first hard constraint it violates (a :class:`Reason` code, 0
when it fits) and its cost; a node is feasible when at least ``gpu_count`` of its
GPUs fit, and its cost is the mean cost of its best ``gpu_count`` GPUs
(:mod:`extender.core.choice`, which also turns the verdict into a placement).
Asking about one node is the same call with one name.

The per-GPU hard constraints and the co-location throughput rule are
:mod:`extender.core.rules`; after them come the session rules, which need the
planner (:mod:`extender.core.session_rules`). Costs (lower is better): training,
Horus Eq. 7 (:mod:`extender.core.cost`, with the learned pair figures of
:mod:`extender.core.pair_cost` where there are some); SLO sessions best fit,
best-effort sessions spread (:mod:`extender.core.session_rules`).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

import numpy as np

from extender.core.choice import Evaluation, best_gpus, choose
from extender.core.cost import CostPolicy, horus_cost
from extender.core.demand import ResolvedDemand
from extender.core.fragmentation import Shapes
from extender.core.packing import (
    PackingInput,
    PackingTerms,
    node_order,
    packing_cost,
    packing_terms,
)
from extender.core.pair_cost import pair_cost, pair_rule, pair_terms
from extender.core.reasons import REASON_BY_CODE, Reason, Rejection, is_unresolvable
from extender.core.rules import GpuLoad, colocation_rule_on, first_reasons, gpu_checks
from extender.core.session_rules import InferenceContext, best_effort_costs, inference_costs
from extender.core.snapshot import Placement, Snapshot, Workload, split_gpus
from extender.core.table import GpuTable, PlacementError

_K = len(REASON_BY_CODE)
_RESOLVABLE_CODES = np.array(
    [r is None or not is_unresolvable(r) for r in REASON_BY_CODE], dtype=bool
)


@dataclass(frozen=True)
class DecisionContext:
    """What a decision depends on besides the table and the pod: policy, clock, planner."""

    policy: CostPolicy
    now_seconds: float
    """The clock the table's observations are stamped with (freshness of agent reports)."""
    inference: InferenceContext | None = None
    """None: inference sessions are rejected as SLO unreachable (no planner)."""
    packing: PackingInput | None = None
    """The workload's shapes and the nodes' free CPU and memory: training pods are then
    costed by the packing score (:mod:`extender.core.packing`); None: Horus alone."""


class Purpose(enum.Enum):
    """What the caller needs from :func:`evaluate`; each skips work the others need."""

    FILTER = "filter"
    """Feasibility and rejections; the Horus cost of training jobs is skipped (node cost 0)."""
    SCORE = "score"
    """Feasibility, rejections and costs (``/prioritize``, ``/bind``)."""
    PLACE = "place"
    """Feasibility and costs, no rejections (the simulator only needs the best node)."""


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
        table, rows, demand.job.inputs.model, policy, job_util, load.coeffs,
        progress=demand.job.progress)
    if pairs is not None:  # the learned pair figures judge these rows (extender.core.pairs)
        code = pair_rule(code, pairs, policy)

    gaps = {t: f"demand unknown: {why}" for t, why in demand.gaps.items()}
    terms: PackingTerms | None = None
    if inferring:
        found = (best_effort_costs(table, rows, code, demand, context.inference,
                                   policy.min_best_effort_slack_percent)
                 if demand.job.best_effort
                 else inference_costs(table, rows, code, demand, context.inference))
        code, cost, plans, shares = found.code, found.cost, found.plans, found.shares
        notes = {**found.notes, **gaps}  # an unknown demand explains a type before the planner
    else:
        plans, shares, notes = {}, {}, gaps
        if training_costs:
            assert load.util_now is not None and load.coeffs is not None
            cost = horus_cost(policy, load.used_mib, job_mem, load.capacity_mib, load.util_now,
                              job_util, load.coeffs)
            if pairs is not None:
                cost = pair_cost(cost, pairs, policy)
            packing = context.packing
            if packing is not None and policy.packing.enabled and not packing.shapes.empty:
                terms = packing_terms(load.free_mib, load.capacity_mib, owner,
                                      np.maximum(ids, 0), code == 0, float(np.max(job_mem)),
                                      need, packing, cost)
                terms = replace(terms, rows=rows)
                cost = packing_cost(terms, policy.packing)
        else:
            cost = np.zeros(rows.size)
    cost = np.where(code == 0, cost, np.inf)

    ok_count = np.bincount(owner[code == 0], minlength=positions)
    sel = best_gpus(owner, rows, cost, need, table.gpus_per_node)
    node_cost = np.bincount(owner[sel], weights=np.where(np.isfinite(cost[sel]), cost[sel], 0.0),
                            minlength=positions) / max(need, 1)
    node_cost = np.where(ok_count >= need, node_cost, np.inf)

    rejections = {} if purpose is Purpose.PLACE else _rejections(
        table, names, ids, rows, owner, code, load.free_mib, demand, node_cost, notes)
    return Evaluation(tuple(names), node_cost, rejections, rows[sel], owner[sel], table, plans,
                      demand, shares, pairs.sources if pairs is not None else {}, terms,
                      policy.packing)


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


# ---- entry points over a snapshot ----------------------------------------------------------


def learned_shapes(snap: Snapshot) -> Shapes | None:
    """The workload's shapes the snapshot's knowledge holds, when the packing score is on
    in the extender (``packing.enabled`` and ``packing.live``) and they weigh something;
    None otherwise (Horus alone)."""
    packing = snap.policy.packing
    read = getattr(snap.knowledge, "shapes", None)
    on = packing.enabled and packing.live and read is not None
    shapes = read(packing.weighting) if on else None
    return None if shapes is None or shapes.empty else shapes


def _context(snap: Snapshot, inference: InferenceContext | None,
             demand: ResolvedDemand | None = None) -> DecisionContext:
    """The decision's context; a training pod gets the packing score's input where shapes
    were learned (the nodes' free CPU and memory per table node, the pod's requests)."""
    shapes = learned_shapes(snap) if demand is not None and \
        demand.job.workload is Workload.TRAINING else None
    if shapes is None:
        return DecisionContext(snap.policy, snap.now, inference)
    assert demand is not None
    cpu_free, mem_free, _, _ = snap.hosts.arrays(snap.table.node_names)
    packing = PackingInput(shapes, cpu_free, mem_free, *demand.job.host,
                           node_order=node_order(snap.table.node_names))
    return DecisionContext(snap.policy, snap.now, inference, packing)


def filter_nodes(snap: Snapshot, names: Sequence[str], demand: ResolvedDemand,
                 inference: InferenceContext | None = None) -> Evaluation:
    """``/filter``: feasibility and a reason per rejected node."""
    return evaluate(snap.table, names, demand, _context(snap, inference), Purpose.FILTER)


def score_nodes(snap: Snapshot, names: Sequence[str], demand: ResolvedDemand,
                inference: InferenceContext | None = None,
                purpose: Purpose = Purpose.SCORE) -> Evaluation:
    """``/prioritize`` and the simulator's node choice (``Purpose.PLACE``: no reasons); a
    training pod costed by the packing score where shapes were learned."""
    return evaluate(snap.table, names, demand, _context(snap, inference, demand), purpose)


@dataclass(frozen=True)
class Decision:
    """What :func:`place` decided on one node: the placement with what its annotations say,
    or the node's rejection."""

    placement: Placement | None
    plan: Any = None
    cost: float = math.inf
    gpu_uuids: tuple[str, ...] = ()
    interference: str = ""
    """Where the interference figure came from ("" where the curve alone decided)."""
    rejection: Rejection | None = None


def place(snap: Snapshot, node: str, demand: ResolvedDemand,
          inference: InferenceContext | None, pod_uid: str, pod: str,
          annotations: tuple[tuple[str, str], ...] = (),
          containers: tuple[tuple[str, int, bool], ...] = ()) -> Decision:
    """The GPUs bind takes on ``node``; ``containers`` (``container_gpu_counts``) says which
    container gets which. The placement holds exactly what the annotations will say
    (rounded), so a restart rebuilds identical state."""
    ev = score_nodes(snap, [node], demand, inference)
    return decision_at(ev, 0, pod_uid, pod, annotations, containers)


def decision_at(ev: Evaluation, position: int, pod_uid: str, pod: str,
                annotations: tuple[tuple[str, str], ...] = (),
                containers: tuple[tuple[str, int, bool], ...] = ()) -> Decision:
    """:func:`place`'s decision on candidate ``position`` of an evaluation (one node's, or
    ``/prioritize``'s where each node's figures are its own: ``extender.service.scored``)."""
    chosen = choose(ev, position, pod_uid, pod)
    if chosen is None:
        return Decision(None, rejection=ev.rejections.get(ev.names[position]))
    rows = ev.chosen_rows(position)
    uuids = tuple(ev.table.gpus[r].uuid for r in rows)
    chosen = dataclasses.replace(chosen, util_percent=round(chosen.util_percent, 2),
                                 mem_mib=float(round(chosen.mem_mib)), annotations=annotations,
                                 gpu_uuids=uuids,
                                 containers=split_gpus(containers, chosen.gpu_indices))
    return Decision(chosen, ev.plans.get(rows[0]), float(ev.node_cost[position]), uuids,
                    ev.interference_sources.get(rows[0], ""))


def without(snap: Snapshot, gone: Sequence[Placement], observed: bool = True) -> Snapshot:
    """``snap`` with the pods ``gone`` (kueue's ``SimulateWorkloadRemoval``): their
    reservations off, and (``observed``) their use off the agents' observations that
    already show them; a reservation that runs nothing (preemption's) has no use to take
    off.

    A GPU's load is ``max(reserved, observed + since)`` (:mod:`extender.core.cost`); an
    observation taken after a pod was placed contains the pod, so removing only its
    reservation would free nothing on a node whose agent reports. What the pod uses is
    taken as what it reserved: a pod that uses more is seen once the agent reports the
    GPU freed, which preemption waits for before it gives the GPU away."""
    table = snap.table.copy()
    for p in gone:
        try:
            rows = table.rows_of(p)
        except PlacementError:
            continue
        entries = table.newer.get(p.pod_uid)
        unseen = set() if not entries else {
            r for r, g in zip(*entries[-1], strict=True) if table.observed_gen[r] == g}
        table.remove(p)
        seen = [r for r in rows if observed and r not in unseen
                and math.isfinite(table.observed_mib[r])]
        if seen:
            table.observed_mib[seen] = np.maximum(0.0, table.observed_mib[seen] - p.mem_mib)
            table.observed_util[seen] = np.maximum(0.0,
                                                   table.observed_util[seen] - p.util_percent)
    return dataclasses.replace(snap, table=table)


def fits_without(snap: Snapshot, node: str, uids: Sequence[str], demand: ResolvedDemand,
                 inference: InferenceContext | None = None, observed: bool = True) -> bool:
    """Would the pod fit on ``node`` once the pods ``uids`` there are gone (:func:`without`)?"""
    gone = [p for p in map(snap.placement_of, uids) if p is not None and p.node == node]
    return bool(score_nodes(without(snap, gone, observed), [node], demand,
                            inference).feasible[0])

