"""Choice: each candidate node's best GPUs, its score, and the placement bind makes.

:class:`Evaluation` is :func:`extender.core.decide.evaluate`'s verdict. A node's cost
is the mean cost of its best ``gpu_count`` GPUs, ties broken by GPU row (node order
then GPU index, so replays are reproducible); :func:`choose` turns the verdict on one
node into a :class:`~extender.core.snapshot.Placement`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from extender.core.cost import scores_from_costs
from extender.core.demand import ResolvedDemand
from extender.core.packing import PackingPolicy, PackingTerms, decisive_term
from extender.core.reasons import Rejection
from extender.core.session_rules import session_util_percent
from extender.core.snapshot import NodeName, Placement, PodUid, Workload
from extender.core.table import GpuTable
from planner.types import GpuPlan


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
    """Best-effort only: per feasible row, the share of the GPU (0..1) the session would get."""
    interference_sources: Mapping[int, str] = field(default_factory=dict)
    """Table row -> where its pairwise interference figure came from (``pair:<n>``,
    ``group:<n>``, ``matrix``, ``profile``, ``curve``); rows judged by the curve alone are
    absent."""
    packing: PackingTerms | None = None
    """The packing score's terms per candidate row (:mod:`extender.core.packing`); None
    when training pods were costed by Horus alone."""
    policy_packing: PackingPolicy = PackingPolicy()
    """The weights the packing terms were summed with."""

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
        out[ok] = scores_from_costs(self.node_cost[ok], best_alone=self.packing is not None)
        return out.tolist()  # Python ints: the wire needs JSON integers

    def chosen_rows(self, position: int) -> list[int]:
        """Rows of the best GPUs of candidate ``position`` (empty when infeasible)."""
        if not np.isfinite(self.node_cost[position]):
            return []
        return sorted(self.selected_rows[self.selected_owner == position].tolist())



def decided_by(evaluation: Evaluation, position: int) -> str | None:
    """Which packing term chose candidate ``position`` over the next best node.

    ``fit``, ``fragmentation`` or ``interference`` (:func:`extender.core.packing.decisive_term`);
    ``only`` when no other node was feasible; None when the packing score was not used.
    """
    terms = evaluation.packing
    if terms is None or terms.rows is None or not np.isfinite(evaluation.node_cost[position]):
        return None
    others = np.flatnonzero(evaluation.feasible)
    others = others[others != position]
    if others.size == 0:
        return "only"
    runner = int(others[np.argmin(evaluation.node_cost[others])])
    order = np.argsort(terms.rows, kind="stable")
    ranked = terms.rows[order]

    def at(rows: list[int]) -> np.ndarray:
        return order[np.searchsorted(ranked, rows)]

    return decisive_term(terms, evaluation.policy_packing, at(evaluation.chosen_rows(position)),
                         at(evaluation.chosen_rows(runner)))


def best_gpus(owner: np.ndarray, rows: np.ndarray, cost: np.ndarray, need: int,
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
