"""Pure decision core of the extender: no I/O, no clock, no logging, no transport.

Public API (import from the submodules or from here):

- values (``extender.core.snapshot``): ``GpuSpec``, ``NodeSpec``, ``Placement``,
  ``GpuObservation``, ``SessionSpec``, ``Workload``, ``gpu_type_of``; the ids
  ``NodeName``, ``PodUid``, ``GpuUuid`` (``NewType`` over ``str``).
- snapshot (``extender.core.table``): ``GpuTable.build(nodes, placements)``,
  ``.place(p, at_seconds=None)``, ``.remove(p)``, ``.observe(node, observations)``,
  ``.observe_rows(rows, util, mib, at)``, ``.copy()``,
  ``Role``, ``PlacementError``.
- demand (``extender.core.demand``): ``parse_demand(pod) -> JobDemand`` (raises
  ``DemandError`` with ``.field``), ``pod_ref(pod)``, ``resolve_demand(job,
  gpu_types, predict, profiles, session_name) -> ResolvedDemand``,
  ``DemandUnavailable`` (what a ``predict`` callable raises).
- reasons (``extender.core.reasons``): ``Reason``, ``is_unresolvable(reason)``,
  ``Rejection`` (``.message()``, ``.reason.event_reason``).
- cost (``extender.core.cost``): ``CostPolicy``, ``InterferenceCurve``,
  ``horus_cost``, ``curve_costs``, ``effective_load``, ``predicted_slowdown``,
  ``colocation_gain``, ``scores_from_costs``.
- rules (``extender.core.rules``): the per-GPU hard constraints, ``GpuLoad.read``,
  ``gpu_checks``, ``first_reasons``, ``colocation_rule_on(policy)``; read by
  ``evaluate`` and by the simulator's pre-filter alike.
- entry points over a ``Snapshot`` (``extender.core.decide``; the service, preemption and
  the simulator call these): ``filter_nodes``, ``score_nodes``, ``place -> Decision``,
  ``without(snapshot, placements)`` (the removal what-if) and ``fits_without``.
- decisions: evaluation (``extender.core.decide``): ``evaluate(table, node_names,
  demand, DecisionContext(policy, now_seconds, inference), purpose=Purpose.SCORE) ->
  Evaluation``; choice (``extender.core.choice``): ``Evaluation``
  (``.feasible_names()``, ``.rejections``, ``.scores()``, ``.node_cost``),
  ``choose(evaluation, position, pod_uid, pod) -> Placement | None``; session rules
  (``extender.core.session_rules``): ``InferenceContext(planner, profiles)`` with
  ``planner`` a ``PlannerFn`` (``planner.plan_gpu``: ``GpuPlan | Infeasible``).

Inference pods without ``tandem.io/slo-ms``/``rate-rps`` are best-effort sessions
(``JobDemand.best_effort``, ``Placement.best_effort``): they go only to serving or
empty GPUs with enough duty-cycle slack and spread by weight
(``extender.core.session_rules``).

The rule combining reservations with observed NVML load is documented in
``extender.core.cost``: per GPU, ``max(sum of reservations, fresh observation +
reservations placed after it)``. The co-location throughput rule
(``CostPolicy.min_colocation_gain_percent``, reason ``COLOCATION_SLOWDOWN``) is
documented in ``extender.core.rules``.
"""

from extender.core.choice import Evaluation, choose
from extender.core.cost import CostPolicy, InterferenceCurve
from extender.core.decide import (
    Decision,
    DecisionContext,
    Purpose,
    decision_at,
    evaluate,
    filter_nodes,
    fits_without,
    place,
    score_nodes,
    without,
)
from extender.core.demand import (
    DemandError,
    DemandUnavailable,
    JobDemand,
    ObservedFn,
    PodRef,
    ProfileIndex,
    ResolvedDemand,
    TypeDemand,
    UtilKnowledge,
    annotations_of,
    container_gpu_counts,
    parse_demand,
    pod_ref,
    resolve_demand,
)
from extender.core.reasons import Reason, Rejection, is_unresolvable
from extender.core.session_rules import InferenceContext, PlannerFn
from extender.core.snapshot import (
    GpuObservation,
    GpuSpec,
    GpuUuid,
    NodeName,
    NodeSpec,
    Placement,
    PodUid,
    SessionSpec,
    Snapshot,
    Workload,
    gpu_type_of,
    split_gpus,
)
from extender.core.table import GpuTable, PlacementError, Role

__all__ = [
    "CostPolicy", "Decision", "DecisionContext", "Snapshot", "filter_nodes", "fits_without",
    "decision_at", "place", "score_nodes", "without", "DemandError", "DemandUnavailable",
    "Evaluation",
    "GpuObservation", "GpuSpec", "GpuTable", "GpuUuid", "InferenceContext", "InterferenceCurve",
    "JobDemand", "NodeName", "NodeSpec", "Placement", "PlacementError", "PlannerFn", "PodRef",
    "PodUid", "ProfileIndex", "Purpose",
    "Reason", "Rejection", "ResolvedDemand", "Role", "SessionSpec",
    "TypeDemand", "UtilKnowledge", "ObservedFn", "Workload", "annotations_of", "choose",
    "evaluate", "gpu_type_of",
    "is_unresolvable", "parse_demand", "pod_ref", "resolve_demand", "split_gpus",
    "container_gpu_counts",
]
