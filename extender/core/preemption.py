"""Which pods to evict so a higher-priority pod gets a GPU: pure, kube-scheduler's rules.

kube-scheduler cannot preempt for ``tandem.io/gpu`` (its dry run ignores the
resource, see docs/troubleshooting.md), so the extender decides itself, with the
rules of kube-scheduler's ``DefaultPreemption``:

- only pods of strictly lower priority are candidates; a pod whose
  PodDisruptionBudgets have no disruption left is never chosen (the Eviction API
  would refuse it), and neither are more pods of one budget than it allows;
- on a node, every candidate is removed, then pods are given back ("reprieved")
  from the highest priority down while the preemptor still fits: the victims are
  the lowest-priority pods it needs, and no pod it does not need;
- among nodes: the lowest highest-victim priority, then the smallest sum of
  victim priorities, then the fewest victims, then the node name.

Whether the pod fits once some pods are gone is the caller's ``fits`` predicate
(the ledger's tentative evaluation): this module never sees the GPU table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

FitsWithout = Callable[[str, Sequence[str]], bool]
"""``fits(node, victim_uids)``: would the preemptor fit on ``node`` with those pods gone?"""


@dataclass(frozen=True)
class Candidate:
    """A pod on a node that preemption may evict."""

    uid: str
    pod: str
    """``namespace/name``."""
    priority: int
    budgets: tuple[str, ...] = ()
    """The PodDisruptionBudgets (``namespace/name``) that select this pod."""


@dataclass(frozen=True)
class PreemptionPlan:
    """The node chosen and the pods to evict there (lowest priority first)."""

    node: str
    victims: tuple[Candidate, ...]

    def order_key(self) -> tuple[int, int, int, str]:
        """kube-scheduler's node order: highest victim priority, priority sum, count, name."""
        priorities = [v.priority for v in self.victims]
        return (max(priorities), sum(priorities), len(priorities), self.node)


def victims_on_node(node: str, candidates: Sequence[Candidate], priority: int,
                    allowed: Mapping[str, int], fits: FitsWithout,
                    ) -> tuple[Candidate, ...] | None:
    """The fewest lowest-priority pods on ``node`` whose eviction lets the pod fit, or None.

    ``allowed`` is each budget's disruptions left; a budget not in it allows none.
    """
    lower = [c for c in candidates if c.priority < priority
             and all(allowed.get(b, 0) > 0 for b in c.budgets)]
    if not lower or not fits(node, [c.uid for c in lower]):
        return None
    # Reprieve from the highest priority down (ties: the pod named last first, so the
    # order is deterministic); each pod stays if the preemptor still fits without it.
    victims = list(lower)
    for c in sorted(lower, key=lambda c: (c.priority, c.pod), reverse=True):
        rest = [v for v in victims if v.uid != c.uid]
        if fits(node, [v.uid for v in rest]):
            victims = rest
    if not victims:
        return None  # it fits without evicting anything: not a preemption
    used = Counter(b for v in victims for b in v.budgets)
    if any(count > allowed.get(b, 0) for b, count in used.items()):
        return None  # more pods of one budget than it may lose
    return tuple(sorted(victims, key=lambda v: (v.priority, v.pod)))


def choose_preemption(nodes: Mapping[str, Sequence[Candidate]], priority: int,
                      allowed: Mapping[str, int], fits: FitsWithout) -> PreemptionPlan | None:
    """The best node to preempt on and its victims, or None when no eviction can help."""
    plans = []
    for node in sorted(nodes):
        victims = victims_on_node(node, nodes[node], priority, allowed, fits)
        if victims is not None:
            plans.append(PreemptionPlan(node, victims))
    return min(plans, key=PreemptionPlan.order_key, default=None)
