"""The scheduler's verbs: decode -> resolve demand -> core decision -> encode.

One :class:`Extender` per process, composed of parts with one job each: the demand
cache (:mod:`extender.service.demand_cache`), bind outcomes
(:mod:`extender.service.bind_outcomes`), the agents' reports and state reads
(:mod:`extender.service.agents`) and preemption. Each verb takes one snapshot of the
state and decides on it with the core's entry points, holding no lock. Bind decides
on a fresh snapshot and assumes if the node did not change since (else again on a
newer one, while other writers change the node), writes the record and the Binding,
then confirms or starts the expiry clock.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from contracts.pod import PodView
from extender.cluster.source import ClusterSource, output_annotations, tandem_annotations
from extender.config.loader import ConfigHolder
from extender.core import (
    Decision,
    InferenceContext,
    PodRef,
    ProfileIndex,
    Reason,
    ResolvedDemand,
    Snapshot,
    Workload,
    annotations_of,
    container_gpu_counts,
    decision_at,
    filter_nodes,
    fits_without,
    gpu_type_of,
    place,
    score_nodes,
    without,
)
from extender.core.session_rules import PlannerFn
from extender.errors import BindConflict, BindOutcomeUnknown, NotLeader, NotReady, PodRejected
from extender.learning.learner import Learner
from extender.preemption.executor import build_preemptor
from extender.preemption.revert import build_reverter
from extender.service.agents import AgentService
from extender.service.bind_outcomes import BindOutcomes
from extender.service.decided import DecidedBy
from extender.service.demand_cache import DemandCache, DemandPredictor
from extender.service.host_only import HostOnlyPods, gpu_pod
from extender.service.scored import ScoredNodes
from extender.state.ledger import ClusterState
from extender.wire import (
    BindingArgs,
    EncodedJson,
    ExtenderArgs,
    encode_host_priorities,
    filter_result,
)

ASSUME_ATTEMPTS = 64
"""Most decisions bind makes for one pod while its node keeps changing under it."""


def _handoff_busy(node: str, pod: str) -> BindConflict:
    """Bind's answer while ``node`` hands a GPU to another pod (device plugin)."""
    return BindConflict(f"{node} is handing a GPU to {pod} (device plugin); retry once that "
                        "pod is admitted", None)


@dataclass(frozen=True)
class FilterOutcome:
    """What filter decided, for logs and metrics."""

    passed: int
    reasons: Mapping[str, int]


class Extender:
    """The four scheduler verbs over a ClusterState and a source; agent reports and state
    reads are its ``agents`` part."""

    def __init__(
        self, state: ClusterState, source: ClusterSource, config: ConfigHolder,
        clock: Callable[[], float] = time.monotonic, predictor: DemandPredictor | None = None,
        profiles: Mapping[tuple[str, str], Any] | None = None, planner: PlannerFn | None = None,
        may_bind: Callable[[], bool] = lambda: True, learner: Learner | None = None,
        environ: Mapping[str, str] | None = None,
    ):
        self.state = state
        self.source = source
        self.config = config
        self.clock = clock
        profile_index = ProfileIndex(profiles or {})
        self._inference = InferenceContext(planner, profile_index) if planner else None
        self.may_bind = may_bind
        self.learner = learner
        self.demands = DemandCache(config, clock, predictor, profile_index)
        """What each pod asks for, resolved once between filter and bind."""
        self.agents = AgentService(state, source, config, learner, environ)
        """Agent reports and ``/v1/state`` reads."""
        self.outcomes = BindOutcomes(state, source, config)
        """Failed binds and binds that got no answer."""
        self.decided = DecidedBy()
        """Which term put each pod's node first, from prioritize to bind."""
        self.scored = ScoredNodes()
        """Prioritize's evaluation, which bind reuses where nothing it reads changed."""
        self.host_only = HostOnlyPods(state, source, learner)
        """Pods of no GPU routed to tandem's profile; the shapes and host requests of binds."""
        self.preemptor = build_preemptor(source, state, self.demand, self._inference, may_bind,
                                         clock)
        """Preemption for GPU shortages (``extender.preemption``); None without an API server."""
        self.agents.reverter = build_reverter(source, may_bind, clock)

    # ---- demand --------------------------------------------------------------------
    def demand(self, pod: Mapping[str, Any] | PodView, snap: Snapshot | None = None,
               ) -> tuple[PodRef, ResolvedDemand]:
        """The pod's resolved demand on ``snap`` (default: a fresh one) (:class:`DemandCache`);
        PodRejected if bad."""
        return self.demands.resolve(pod, self.state.snapshot() if snap is None else snap)

    @staticmethod
    def _source_on(snap: Snapshot, demand: ResolvedDemand, node: str,
                   indices: tuple[int, ...]) -> str:
        """Where the bound numbers came from: the demand's source on the node's GPU type."""
        t = snap.table
        rows = t.node_rows(node) if node in t.node_index else ()
        for gpu in (t.gpus[row] for row in rows):  # the node's GPUs, not the cluster's
            if gpu.index in indices:
                found = demand.for_type(gpu_type_of(gpu.product))
                return found.source if found is not None else ""
        return ""

    @staticmethod
    def _require_synced(snap: Snapshot) -> Snapshot:
        if not snap.synced:
            raise NotReady("tandem: cluster state not synced yet")
        return snap

    # ---- verbs -----------------------------------------------------------------------
    def filter(self, args: ExtenderArgs) -> tuple[dict[str, Any], FilterOutcome]:
        """Hard constraints; every rejected node gets a precise reason."""
        names = args.candidate_names()
        snap = self._require_synced(self.state.snapshot())
        pod = PodView.of(args.pod)  # read once: the routing and the demand use it
        if not gpu_pod(pod):  # routed to tandem's profile: filtered on CPU and memory
            verdict = self.host_only.verdict(snap, names, pod)
            return dict(filter_result(args, [n for n, ok in zip(
                names, verdict.feasible.tolist(), strict=True) if ok], verdict.reasons, {})), \
                FilterOutcome(int(verdict.feasible.sum()), {})
        try:
            ref, demand = self.demand(pod, snap)
        except PodRejected as exc:
            result = filter_result(args, [], {}, {n: str(exc) for n in names})
            bad = Reason.BAD_POD_REQUEST.event_reason
            return dict(result), FilterOutcome(0, {bad: len(names)})
        ev = filter_nodes(snap, names, demand, self._inference)
        failed, unresolvable, reasons = {}, {}, {}
        for name, rej in ev.rejections.items():
            (unresolvable if rej.unresolvable else failed)[name] = rej.message()
            reasons[rej.reason.event_reason] = reasons.get(rej.reason.event_reason, 0) + 1
        passed = ev.feasible_names()
        if self._handoff_gated(self.config.current().handoff):
            uid = ref.uid
            for name in list(passed):
                waiting = self.state.handoffs.holder(name, uid)
                if waiting is not None:
                    passed.remove(name)
                    failed[name] = (f"tandem: {name} is handing a GPU to {waiting.pod} "
                                    "(device plugin); it takes the next pod once that one "
                                    "is admitted")
                    pending = Reason.HANDOFF_PENDING.event_reason
                    reasons[pending] = reasons.get(pending, 0) + 1
        if self.preemptor is not None:
            passed = self.preemptor.filter_nodes(snap, ref, demand, passed, failed)
        # Every rejection is unresolvable to kube-scheduler: its preemption cannot see
        # tandem.io/gpu (it would find "victims" for nothing), tandem preempts itself.
        return dict(filter_result(args, passed, {}, {**failed, **unresolvable})), \
            FilterOutcome(len(passed), reasons)

    def prioritize(self, args: ExtenderArgs) -> EncodedJson:
        """Integer 0..10 per candidate from the Horus cost (best fit for sessions), encoded."""
        names = args.candidate_names()
        try:
            snap = self._require_synced(self.state.snapshot())
            pod = PodView.of(args.pod)  # read once: the routing and the demand use it
            if not gpu_pod(pod):
                verdict = self.host_only.verdict(snap, names, pod)
                return encode_host_priorities(names, list(verdict.scores))
            ref, demand = self.demand(pod, snap)
        except (PodRejected, NotReady):
            return encode_host_priorities(names, [0] * len(names))
        ev = score_nodes(snap, names, demand, self._inference)
        scores = ev.scores()
        if demand.job.workload is Workload.TRAINING:
            self.decided.note(ref.uid or ref.key, ev, scores)
            self.scored.note(ref.uid, snap, ev)
        return encode_host_priorities(names, scores)

    def _handoff_gated(self, handoff: Any) -> bool:
        """Whether bind waits for the device plugin's hand-off (a kubelet admits the pod)."""
        return handoff.mode == "device-plugin" and self.source.kubelet_admits

    def bind(self, args: BindingArgs) -> dict[str, str]:
        """Re-check on fresh state, assume, annotate, bind; Error on any failure."""
        if not self.may_bind():
            raise NotLeader("tandem: this replica is not the leader and may not bind")
        snap = self._require_synced(self.state.snapshot())
        existing = snap.placement_of(args.pod_uid) if args.pod_uid else None
        bound_to = existing.node if existing is not None else None
        if existing is not None and self.outcomes.unknown(args.pod_uid):
            bound_to = self.outcomes.settle(args)  # an earlier attempt got no answer: ask
        if bound_to is not None:
            if bound_to == args.node:
                return {"Error": ""}  # a retried bind that already went through
            raise BindConflict(f"pod already bound to {bound_to}", None)
        pod = self._pod_for(args)
        if not gpu_pod(pod):
            return self.host_only.bind(args, pod, snap)
        handoff = self.config.current().handoff
        waiting = self.state.handoffs.holder(args.node, args.pod_uid) \
            if self._handoff_gated(handoff) else None
        if waiting is not None:
            raise _handoff_busy(args.node, waiting.pod)
        ref, demand = self.demand(pod, snap)
        del snap  # a live snapshot makes the writes below copy what it holds
        ref = PodRef(args.pod_namespace, args.pod_name, args.pod_uid or ref.uid)
        self._refuse_if_held(args.node, ref.uid)
        gated = self._handoff_gated(handoff)
        if gated:
            # The scheduler binds concurrently: the check above may race another bind to
            # this node, so the node is claimed atomically before the Binding is written.
            waiting = self.state.handoffs.claim(args.node, ref.uid or ref.key, ref.key,
                                                handoff.timeout_seconds)
            if waiting is not None:
                raise _handoff_busy(args.node, waiting.pod)
        try:
            inputs = tandem_annotations(annotations_of(pod))
            decided, source_on = self._assume(args.node, demand, ref, inputs,
                                              container_gpu_counts(pod))
            placement = decided.placement
            assert placement is not None
            term = self.decided.term(ref.uid or ref.key, args.node) \
                if placement.workload is Workload.TRAINING else ""
            annotations = output_annotations(placement, list(decided.gpu_uuids), decided.cost,
                                             decided.plan, source_on, decided.interference, term)
            try:
                confirmed = self.source.bind(ref, args.node, annotations, placement)
            except BindOutcomeUnknown as exc:  # maybe applied: the GPUs stay reserved
                raise self.outcomes.no_answer(ref, placement.pod_uid, args.node, exc) from exc
            except Exception as exc:  # refused: nothing was applied
                raise self.outcomes.refused(ref, placement.pod_uid, args.node, exc) from exc
        except BindOutcomeUnknown:
            raise  # the pod may be bound and waiting for its GPU: the node stays claimed
        except Exception:
            if gated:
                self.state.handoffs.release(ref.uid or ref.key)
            raise
        if self.preemptor is not None:
            self.preemptor.bound(ref.uid)
        self.host_only.learn(ref.uid, args.node, demand.job.gpu_count, placement.mem_mib,
                             demand.job.host)
        if confirmed:
            self.state.confirm(dataclasses.replace(
                placement, annotations=tuple(sorted({**dict(inputs), **annotations}.items()))))
        else:
            self.state.finish_binding(placement.pod_uid)
        what = ("best-effort session" if placement.best_effort else "session") \
            if placement.workload is Workload.INFERENCE else "job"
        self.source.record_event(
            ref, "TandemBound",
            f"{what} placed on {args.node} GPU {annotations['tandem.io/gpu-index']} "
            f"(predicted util {placement.util_percent:.0f}%, {placement.mem_mib:.0f} MiB)", False)
        return {"Error": ""}

    def _refuse_if_held(self, node: str, uid: str) -> None:
        """BindConflict while ``node`` is being freed for another pod's preemption."""
        holder = self.preemptor.holder(node, uid) if self.preemptor else None
        if holder is not None:
            raise BindConflict(f"{node} is being freed for higher-priority pod {holder.key} "
                               "(preemption)", None)

    def _assume(self, node: str, demand: ResolvedDemand, ref: PodRef,
                inputs: tuple[tuple[str, str], ...], container_gpus: Any,
                ) -> tuple[Decision, str]:
        """Decide the GPUs on ``node`` on a fresh snapshot and assume them if the node did not
        change since; again on a newer snapshot while it did (each change is another
        writer's progress: 50 binds racing for one node all settle). A preemptor's own reservation
        on ``node`` is set aside for the decision and replaced by the placement. Returns the
        decision and where its numbers came from (``tandem.io/...-source``)."""
        uid = ref.uid or ref.key
        held = self.preemptor.reservation(ref.uid, node) if self.preemptor else None
        for attempt in range(ASSUME_ATTEMPTS):
            snap = self.state.snapshot()
            reserved = snap.placement_of(held) if held is not None else None
            view = snap if reserved is None else without(snap, [reserved], observed=False)
            scored = self.scored.take(ref.uid, snap, node, demand) \
                if attempt == 0 and reserved is None else None
            decided = decision_at(*scored, uid, ref.key, inputs, container_gpus) if scored \
                else place(view, node, demand, self._inference, uid, ref.key, inputs,
                           container_gpus)
            if decided.placement is None:
                raise BindConflict(f"node {node} no longer fits pod {ref.key}",
                                   decided.rejection)
            stamp = snap.stamp(node)
            source_on = self._source_on(snap, demand, node, decided.placement.gpu_indices)
            del snap, view, scored  # let the snapshot go: the reservation then copies nothing
            if self.state.assume(stamp, decided.placement,
                                 held if reserved is not None else None):
                if reserved is not None and self.preemptor is not None:
                    self.preemptor.bound(ref.uid)  # its nomination ends with the reservation
                return decided, source_on
        raise BindConflict(f"{node} kept changing while pod {ref.key} was being placed; "
                           "retry", None)

    def _pod_for(self, args: BindingArgs) -> PodView:
        """The pod as the cluster has it (the API server, or the simulated registry), never a
        /filter body: anyone who reaches the extender can send one. The demand cache still
        saves the prediction when the contents are those filter saw (same digest)."""
        pod = self.source.current_pod(args.pod_namespace, args.pod_name)
        if pod is None:
            raise BindConflict(f"pod {args.pod_namespace}/{args.pod_name} not found", None)
        view = PodView.of(pod)  # read once: the demand, annotations and containers use it
        if args.pod_uid and view.uid != args.pod_uid:
            raise BindConflict(f"pod {args.pod_namespace}/{args.pod_name} has UID {view.uid}, "
                               f"not {args.pod_uid} (recreated?)", None)
        return view

    def preempt(self, pod: Mapping[str, Any], victims: Mapping[str, list[str]],
                ) -> dict[str, list[str]]:
        """Keep a node's proposed victims only if evicting them lets the pod fit there.

        We never add victims: the scheduler chose them for its own resources and
        only we know GPU capacity, so the useful answer is to drop nodes where the
        proposed evictions would not free enough GPU memory or co-location slots.
        """
        snap = self._require_synced(self.state.snapshot())
        if not gpu_pod(pod):
            return dict(victims)  # no GPU asked for: tandem has nothing to add
        try:
            _, demand = self.demand(pod, snap)
        except PodRejected:
            return {}
        return {node: uids for node, uids in victims.items()
                if fits_without(snap, node, uids, demand, self._inference)}
