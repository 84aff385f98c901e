"""Bind outcomes: what a bind that failed leaves reserved, and settling one with no answer.

A Binding the API server refused applied nothing: the assumed placement is dropped. A
Binding with no answer (timeout, connection lost) may have been applied: its GPUs stay
reserved, the expiry clock starts, and the pod's UID is remembered so that a retried
bind first asks the API server where the pod is (:meth:`BindOutcomes.settle`).
"""

from __future__ import annotations

from contracts.bounded import BoundedMap
from contracts.pod import PodView
from extender.cluster.source import ClusterSource
from extender.config.loader import ConfigHolder
from extender.core import PodRef
from extender.errors import BindConflict, BindOutcomeUnknown, SourceError
from extender.state.ledger import ClusterState
from extender.wire import BindingArgs

UNKNOWN_LIMIT = 20_000
"""Most pods whose last bind got no answer that are remembered (oldest forgotten first)."""


class BindOutcomes:
    """The ledger's side of a failed Binding, and the pods whose bind got no answer."""

    def __init__(self, state: ClusterState, source: ClusterSource, config: ConfigHolder):
        self.state = state
        self.source = source
        self.config = config
        self._unknown: BoundedMap[str, None] = BoundedMap(UNKNOWN_LIMIT)
        """UIDs of pods whose last bind call got no answer (it may have been applied); a
        UID noted again keeps its place (the first unanswered bind's)."""

    def unknown(self, uid: str) -> bool:
        """Whether the last bind of pod ``uid`` got no answer."""
        return uid in self._unknown

    def no_answer(self, ref: PodRef, pod_uid: str, node: str,
                  exc: BindOutcomeUnknown) -> BindOutcomeUnknown:
        """The binding may be on the API server: keep the GPUs reserved (the expiry clock
        starts now) until the watch shows the pod, a retry asks the API, or the TTL passes.
        Returns the error bind raises."""
        self.state.finish_binding(pod_uid)
        self._unknown.setdefault(pod_uid, None)
        self.source.record_event(ref, "TandemBindFailed", f"bind to {node}: {exc}", True)
        ttl = self.config.current().state.assume_ttl_seconds
        return BindOutcomeUnknown(
            f"tandem: bind to {node}: outcome unknown ({exc}); its GPUs stay reserved until "
            f"the pod is seen bound, the bind is retried, or {ttl:g} s pass")

    def refused(self, ref: PodRef, pod_uid: str, node: str, exc: Exception) -> SourceError:
        """Refused: nothing was applied. A placement the watch confirmed meanwhile stays.
        Returns the error bind raises."""
        self.state.forget(pod_uid, only_assumed=True)
        self.source.record_event(ref, "TandemBindFailed", f"bind to {node}: {exc}", True)
        return SourceError(f"tandem: bind to {node} failed: {exc}")

    def settle(self, args: BindingArgs) -> str | None:
        """After a bind with no answer: the node the API server has the pod on, or None when
        it is not bound (the held reservation is dropped and the caller binds afresh)."""
        try:
            pod = self.source.read_pod(args.pod_namespace, args.pod_name)
        except Exception as exc:  # still unknown: the reservation stays, the next retry asks
            raise BindOutcomeUnknown(f"tandem: bind to {args.node}: an earlier attempt got no "
                                     f"answer and the pod cannot be read ({exc})") from exc
        view = PodView.of(pod or {})
        node = view.node_name if view.uid == args.pod_uid else None
        uid = view.uid
        self._unknown.pop(args.pod_uid)
        if not node:
            self.state.forget(args.pod_uid, only_assumed=True)
            if pod is None or uid != args.pod_uid:
                raise BindConflict(f"pod {args.pod_namespace}/{args.pod_name} with UID "
                                   f"{args.pod_uid} no longer exists", None)
            return None
        return str(node)
