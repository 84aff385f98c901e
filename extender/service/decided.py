"""Which term decided a pod's node (``tandem.io/decided-by``), from ``/prioritize`` to bind.

Bind decides on one node, the one kube-scheduler chose; which term set that node
apart from the others is known only where they were all scored, in ``/prioritize``.
It notes, per pod, the node tandem ranked first and the packing term that put it
there (:func:`extender.core.choice.decided_by`; ``interference`` where the Horus cost
alone ranked the nodes). Bind then writes that term when the scheduler took tandem's
node, ``scheduler`` when its own plugins outweighed tandem's score, and ``only``
when no ranking was asked for (a single feasible node).
"""

from __future__ import annotations

import numpy as np

from contracts.bounded import BoundedMap
from extender.core.choice import Evaluation, decided_by

LIMIT = 20_000
"""Pods remembered between prioritize and bind (oldest forgotten first)."""
ONLY = "only"
SCHEDULER = "scheduler"


class DecidedBy:
    """Per pod UID, tandem's first node and its deciding term; bounded, thread-safe."""

    def __init__(self, limit: int = LIMIT):
        self._noted: BoundedMap[str, tuple[str, str]] = BoundedMap(limit)

    def note(self, uid: str, evaluation: Evaluation, scores: list[int]) -> None:
        """Remember the node ``evaluation`` ranks first (by its ``scores()``) for pod ``uid``
        and why."""
        if not uid or not evaluation.feasible.any():
            return
        best = int(np.argmax(np.array(scores)))  # kube-scheduler's tie rule: the first best
        term = decided_by(evaluation, best) or "interference"
        self._noted.put(uid, (evaluation.names[best], term))

    def term(self, uid: str, node: str) -> str:
        """What bind writes for pod ``uid`` bound to ``node`` (kept for a retried bind)."""
        noted = self._noted.get(uid)
        if noted is None:
            return ONLY
        return noted[1] if noted[0] == node else SCHEDULER
