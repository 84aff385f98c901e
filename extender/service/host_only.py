"""The extender's side of pods that take no GPU, and what every bind teaches.

A pod without ``tandem.io/gpu`` reaches the extender only where the admin routed it to
tandem's scheduler profile (its extender then manages no resource, so kube-scheduler
calls it for every pod of the profile: one more filter, prioritize and bind round trip
per pod). Filter passes the nodes whose free CPU and memory hold the pod, prioritize
scores them with the packing score's host form
(:func:`extender.core.host_only.host_only_verdict`), and bind writes a plain Binding
(no GPU, no record, no annotations).

Every bind, GPU or not, counts the pod's shape for the packing score
(:class:`extender.learning.shapes.ShapeLearner`) and its CPU and memory requests on its
node (``ClusterState.hosts``) before the watch shows the pod bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contracts.pod import PodView
from contracts.resources import containers_requests
from extender.cluster.source import ClusterSource
from extender.core import PodRef, Snapshot
from extender.core.decide import learned_shapes
from extender.core.host_only import HostOnlyVerdict, host_only_verdict
from extender.errors import BindConflict
from extender.learning.learner import Learner
from extender.state.ledger import ClusterState
from extender.wire import BindingArgs


def gpu_pod(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks for ``tandem.io/gpu`` (else it is a pod of no GPU)."""
    return PodView.of(pod).requests_gpus


def host_requests(pod: Mapping[str, Any]) -> tuple[float, float]:
    """The pod's (CPU millicores, memory MiB) requests."""
    return containers_requests((c.init, c.resources) for c in PodView.of(pod).containers)


class HostOnlyPods:
    """Filter, prioritize and bind for pods of no GPU; what a bind teaches."""

    def __init__(self, state: ClusterState, source: ClusterSource, learner: Learner | None):
        self.state, self.source, self.learner = state, source, learner

    def verdict(self, snap: Snapshot, names: list[str],
                pod: Mapping[str, Any]) -> HostOnlyVerdict:
        """Which nodes hold the pod's CPU and memory, and their scores."""
        return host_only_verdict(snap, names, *host_requests(pod), learned_shapes(snap))

    def bind(self, args: BindingArgs, pod: Mapping[str, Any], snap: Snapshot,
             ) -> dict[str, str]:
        """A plain Binding, if the node still holds the pod's CPU and memory."""
        uid = args.pod_uid or PodView.of(pod).uid
        bound_to = self.state.hosts.node_of(uid)
        if bound_to == args.node:
            return {"Error": ""}  # a retried bind that already went through
        if bound_to is not None:
            raise BindConflict(f"pod already bound to {bound_to}", None)
        cpu, mem = host_requests(pod)
        if not host_only_verdict(snap, [args.node], cpu, mem, None).feasible[0]:
            raise BindConflict(f"node {args.node} no longer has the CPU and memory of pod "
                               f"{args.pod_namespace}/{args.pod_name}", None)
        self.source.bind(PodRef(args.pod_namespace, args.pod_name, uid), args.node, {}, None)
        self.learn(uid, args.node, 0, 0.0, (cpu, mem))
        return {"Error": ""}

    def learn(self, uid: str, node: str, gpus: int, mem_mib_per_gpu: float,
              host: tuple[float, float]) -> None:
        """Count a bound pod's shape and its requests on ``node``."""
        self.state.hosts.bound(uid, node, *host)
        if self.learner is not None:
            self.learner.shapes.observe(gpus, mem_mib_per_gpu, *host)
