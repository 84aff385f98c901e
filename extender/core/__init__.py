"""Pure decision core of the extender: no I/O, no clock, no logging, no transport.

Public API (import from the submodules or from here):

- values (``extender.core.snapshot``): ``GpuSpec``, ``NodeSpec``, ``Placement``,
  ``GpuObservation``, ``SessionSpec``, ``Workload``, ``gpu_type_of``.
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
- decisions (``extender.core.decide``): ``evaluate(table, node_names, demand,
  policy, now_seconds, inference) -> Evaluation`` (``.feasible_names()``,
  ``.rejections``, ``.scores()``, ``.node_cost``), ``choose(evaluation,
  position, pod_uid, pod) -> Placement | None``, ``InferenceContext``.

Inference pods without ``tandem.io/slo-ms``/``rate-rps`` are best-effort sessions
(``JobDemand.best_effort``, ``Placement.best_effort``): they go only to serving or
empty GPUs with enough duty-cycle slack and spread by weight (``extender.core.decide``).

The rule combining reservations with observed NVML load is documented in
``extender.core.cost``: per GPU, ``max(sum of reservations, fresh observation +
reservations placed after it)``. The co-location throughput rule
(``CostPolicy.min_colocation_gain_percent``, reason ``COLOCATION_SLOWDOWN``) is
documented in ``extender.core.decide``.
"""

from extender.core.cost import CostPolicy, InterferenceCurve
from extender.core.decide import Evaluation, InferenceContext, choose, evaluate
from extender.core.demand import (
    DemandError,
    DemandUnavailable,
    JobDemand,
    PodRef,
    ProfileIndex,
    ResolvedDemand,
    TypeDemand,
    annotations_of,
    parse_demand,
    pod_ref,
    resolve_demand,
)
from extender.core.reasons import Reason, Rejection, is_unresolvable
from extender.core.snapshot import (
    GpuObservation,
    GpuSpec,
    NodeSpec,
    Placement,
    SessionSpec,
    Workload,
    gpu_type_of,
)
from extender.core.table import GpuTable, PlacementError, Role

__all__ = [
    "CostPolicy", "DemandError", "DemandUnavailable", "Evaluation", "GpuObservation", "GpuSpec",
    "GpuTable", "InferenceContext", "InterferenceCurve", "JobDemand", "NodeSpec", "Placement",
    "PlacementError", "PodRef", "ProfileIndex", "Reason", "Rejection", "ResolvedDemand", "Role",
    "SessionSpec",
    "TypeDemand", "Workload", "annotations_of", "choose", "evaluate", "gpu_type_of",
    "is_unresolvable", "parse_demand", "pod_ref", "resolve_demand",
]
