"""Moving the newest pod off a GPU whose pair was measured to lose (opt-in:
``learning.revert_losing_seconds``; docs/interference.md).

The pair learner names the pods (:func:`extender.learning.revert.newest_of_losing`); this
evicts each once through the Eviction API, as preemption does
(:class:`extender.preemption.kube_api.KubePreemptionApi`): the API server applies the
pod's PodDisruptionBudgets and refuses with 429 where none allows a disruption, then the
pod stays and is tried again after :data:`RETRY_SECONDS` while its window lasts. Only the
leader evicts. Its controller makes a new pod, which the learner no longer places beside
that partner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from contracts.bounded import BoundedMap
from contracts.logs import get_logger
from extender.core import PodRef
from extender.core.snapshot import Placement
from extender.preemption.kube_api import EvictionRefused, KubePreemptionApi

RETRY_SECONDS = 30.0
"""Least time between two evictions of one pod (one its budget refused)."""
MAX_TRACKED = 10_000


class LosingPairReverter:
    """Evicts the pods the pair learner names, each once (module docstring)."""

    def __init__(self, api: KubePreemptionApi, source: Any, may_act: Callable[[], bool],
                 clock: Callable[[], float]):
        self.api, self.source, self._may_act, self._clock = api, source, may_act, clock
        self._tried: BoundedMap[str, tuple[float, bool]] = BoundedMap(MAX_TRACKED)
        """pod uid -> (when last tried, whether it was evicted)."""
        self.evicted_total = 0
        self._log = get_logger()

    def revert(self, uids: Sequence[str], placement_of: Callable[[str], Placement | None]
               ) -> list[str]:
        """Evict each of ``uids`` not evicted yet (nor tried within :data:`RETRY_SECONDS`);
        the uids evicted now."""
        if not uids or not self._may_act():
            return []
        now, out = self._clock(), []
        for uid in uids:
            last = self._tried.get(uid)
            placed = placement_of(uid)
            if placed is None or (last is not None and (last[1] or now - last[0] < RETRY_SECONDS)):
                continue
            namespace, _, name = placed.pod.partition("/")
            ref = PodRef(namespace, name, uid)
            try:
                gone = self.api.evict(namespace, name, uid)
            except EvictionRefused as exc:
                self._tried.put(uid, (now, False))
                self._log.info("revert refused", extra={"pod": ref.key, "error": str(exc)})
                self.source.record_event(ref, "TandemRevertBlocked",
                                         f"not moved off {placed.node}: eviction refused "
                                         f"({exc}); tandem retries while the pod is new", True)
                continue
            self._tried.put(uid, (now, True))
            if gone:
                self.evicted_total += 1
                out.append(uid)
                self._log.info("reverted", extra={"pod": ref.key, "node": placed.node})
                self.source.record_event(
                    ref, "TandemReverted", f"evicted by tandem: on {placed.node} it and its "
                    "GPU's other pod were measured to progress less together than taking "
                    "turns (learning.revert_losing_seconds)", True)
        return out


def build_reverter(source: Any, may_act: Callable[[], bool], clock: Callable[[], float]
                   ) -> LosingPairReverter | None:
    """A reverter for sources backed by an API server (the ``kube`` source); None otherwise."""
    core = getattr(source, "api", None)
    if core is None or not getattr(source, "kubelet_admits", False):
        return None
    return LosingPairReverter(KubePreemptionApi(core), source, may_act, clock)
