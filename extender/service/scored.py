"""Prioritize's evaluation, kept for the bind of the same pod.

kube-scheduler calls ``/prioritize`` and then ``/bind`` for the node it chose; bind
decides the GPUs on that node again on a fresh snapshot (``place``), which costs as
much as scoring the node did. Where nothing the decision reads changed in between,
prioritize's figures for that node are the figures bind would compute, so bind takes
its decision from them (``extender.core.decide.decision_at``) instead.

What must be unchanged, checked at bind against the fresh snapshot:

- the node: same table epoch and node generation (every placement, agent report and
  rebuild bumps one of them), so the same rows with the same reservations and
  observations;
- the policy and the knowledge (same objects: each change publishes new ones);
- the demand (the same resolved object: the demand cache returns it while the pod
  is the one prioritize saw, by digest);
- the clock's effect: an observation fresh at prioritize and stale at bind (or the
  reverse) changes the load, so every row of the node must keep its freshness;
- each node's figures must be its own: training pods costed by Horus (and the learned
  pair figures) are per GPU, but the packing score normalises over the candidates, so
  those evaluations (and sessions, whose plans are not checked here) are not kept.

Anything else (a miss, another node, a preemptor's reservation) falls back to
``place``, and ``ClusterState.assume`` still refuses a decision whose node changed
after the bind's snapshot. Entries are taken once and bounded in number; an entry
holds no snapshot (the table is dropped): a live snapshot makes every write copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from contracts.bounded import BoundedMap
from extender.core import Evaluation, ResolvedDemand, Snapshot, Workload

LIMIT = 4096
"""Pods whose evaluation is kept between prioritize and bind (oldest dropped first)."""


@dataclass(frozen=True)
class _Scored:
    evaluation: Evaluation
    """Without its table (bind puts its own snapshot's back)."""
    epoch: int
    generations: Any
    """The prioritize snapshot's per-node generations (a copy-on-write map: cheap to hold)."""
    now: float
    policy: Any
    knowledge: Any


class ScoredNodes:
    """Per pod UID, prioritize's evaluation while bind can reuse it; bounded, thread-safe."""

    def __init__(self, limit: int = LIMIT):
        self._kept: BoundedMap[str, _Scored] = BoundedMap(limit)

    def note(self, uid: str, snap: Snapshot, evaluation: Evaluation) -> None:
        """Keep ``evaluation`` (prioritize's, on ``snap``) for pod ``uid``'s bind, where its
        figures are per node (see the module doc)."""
        demand = evaluation.demand
        if not uid or demand is None or demand.job.workload is not Workload.TRAINING \
                or evaluation.packing is not None:
            return
        kept = _Scored(dataclasses.replace(evaluation, table=None), snap.epoch,
                       snap.generations, snap.now, snap.policy, snap.knowledge)
        self._kept.put(uid, kept)

    def take(self, uid: str, snap: Snapshot, node: str, demand: ResolvedDemand,
             ) -> tuple[Evaluation, int] | None:
        """Prioritize's evaluation of pod ``uid`` on ``snap``'s table and ``node``'s position
        in it, when bind on ``snap`` would compute the same figures for ``node``; else None.
        The entry is gone either way (a retried bind places afresh)."""
        kept = self._kept.pop(uid)
        if kept is None or kept.evaluation.demand is not demand or kept.epoch != snap.epoch \
                or kept.policy is not snap.policy or kept.knowledge is not snap.knowledge \
                or kept.generations.get(node, 0) != snap.generations.get(node, 0):
            return None
        ev = kept.evaluation
        try:
            position = ev.names.index(node)
        except ValueError:
            return None
        table = snap.table
        if not np.isfinite(ev.node_cost[position]) or node not in table.node_index:
            return None
        observed_at = table.observed_at[table.node_rows(node)]
        stale = snap.policy.staleness_seconds
        if not np.array_equal(kept.now - observed_at <= stale, snap.now - observed_at <= stale):
            return None  # an observation turned stale in between: the load changed
        return dataclasses.replace(ev, table=table), position
