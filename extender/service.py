"""The extender's verbs: decode -> resolve demand -> core decision -> encode.

One :class:`Extender` per process. It owns the demand cache (filter and
prioritize see the full Pod; bind only gets its name and UID, and reads the pod
from the cluster) and the bind flow: decide again on fresh state and assume under
the state lock, write the annotations, create the binding, then confirm or start
the expiry clock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from contracts.state import StateDocument
from extender.cluster.source import ClusterSource, output_annotations, tandem_annotations
from extender.config import ConfigHolder
from extender.core import (
    DemandError,
    DemandUnavailable,
    InferenceContext,
    PodRef,
    ProfileIndex,
    Purpose,
    Reason,
    ResolvedDemand,
    UtilKnowledge,
    Workload,
    annotations_of,
    container_gpu_counts,
    gpu_type_of,
    parse_demand,
    pod_ref,
    resolve_demand,
)
from extender.core.decide import PlannerFn
from extender.errors import (
    BadRequest,
    BindConflict,
    BindOutcomeUnknown,
    NotLeader,
    NotReady,
    PodRejected,
    SourceError,
)
from extender.learning.learner import Learner
from extender.preemption.executor import build_preemptor
from extender.state.ledger import ClusterState
from extender.state.node_identity import agent_identity, check_node, may_read_full, speaks_for
from extender.state.reports import DecodedReport
from extender.transport.wire import (
    BindingArgs,
    EncodedJson,
    ExtenderArgs,
    encode_host_priorities,
    filter_result,
)

DEMAND_CACHE_LIMIT = 20_000
"""Most pods whose demand is cached between filter and bind (oldest evicted first)."""
FETCHING = "ModelBeingFetched"
"""Gap kind of a model still downloading (``predictor.fetch``): such demands are not cached."""

CacheEntry = tuple[ResolvedDemand, float]
"""(resolved demand, expiry), keyed by :func:`demand_digest`."""


def demand_digest(pod: Mapping[str, Any]) -> str:
    """A hash of everything the demand is computed from: the pod's UID, namespace and name
    (the session name), its ``tandem.io/*`` annotations and its containers' names and
    resources. The cache is keyed by it alone, so a body claiming a known pod's UID (and
    resourceVersion) with other contents never answers for the real pod."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    ann = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    containers = [[[c.get("name"), c.get("resources")] for c in spec.get(key) or []
                   if isinstance(c, Mapping)]
                  if isinstance(spec.get(key), list) else spec.get(key)
                  for key in ("containers", "initContainers")]
    who = [meta.get(k) for k in ("uid", "namespace", "name")]
    content = json.dumps([who, tandem_annotations(ann), containers], sort_keys=True,
                         default=repr)
    return hashlib.blake2b(content.encode(), digest_size=16).hexdigest()


class PredictionLike(Protocol):
    """What the predictor facade returns (``predictor.api.Prediction``)."""

    gpu_util_percent: float | None
    gpu_mem_mib: float
    source: str


class DemandPredictor(Protocol):
    """The predictor facade as the extender uses it (tests inject a fake)."""

    def predict(self, model_ref: str, batch_size: int, gpu_type: str | None,
                workload: str) -> PredictionLike:
        """Predicted utilisation and memory of one model at one batch size on one GPU type."""
        ...

    def known_digest(self, model_ref: str) -> str | None:
        """The digest of the file ``model_ref`` last resolved to (keys learned estimates)."""
        ...


def predict_fn(predictor: DemandPredictor) -> Callable[[str, int, str, str],
                                                       tuple[float | None, float, str]]:
    """Adapt the facade to the core's ``PredictFn``: its errors become DemandUnavailable."""
    def call(model_ref: str, batch_size: int, gpu_type: str, workload: str,
             ) -> tuple[float | None, float, str]:
        try:
            p = predictor.predict(model_ref, batch_size, gpu_type, workload)
        except Exception as exc:  # predictor errors (ModelRejected, NoTrainedModel, I/O)
            raise DemandUnavailable(type(exc).__name__, str(exc)) from exc
        util = None if p.gpu_util_percent is None else float(p.gpu_util_percent)
        return util, float(p.gpu_mem_mib), str(p.source)
    return call


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
    """The four scheduler verbs, agent reports and state reads, over a ClusterState and a
    source."""

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
        self._predict = predict_fn(predictor) if predictor is not None else None
        self._profiles = ProfileIndex(profiles or {})
        self._inference = InferenceContext(planner, self._profiles) if planner else None
        self.may_bind = may_bind
        self.learner = learner
        self._environ = environ
        """Where ``reports.token_env`` is looked up (None: the process environment)."""
        self._identity = agent_identity(source)
        """Reviews agents' pod tokens (``reports.identity: service-account``)."""
        self._cache: OrderedDict[str, CacheEntry] = OrderedDict()
        """Per :func:`demand_digest`: what filter (or bind) resolved."""
        self._cache_lock = threading.Lock()
        self._unknown: OrderedDict[str, None] = OrderedDict()
        """UIDs of pods whose last bind call got no answer (it may have been applied)."""
        self.preemptor = build_preemptor(source, state, self.demand, self._inference, may_bind,
                                         clock)
        """Preemption for GPU shortages (``extender.preemption``); None without an API server."""

    # ---- demand --------------------------------------------------------------------
    def demand(self, pod: Mapping[str, Any]) -> tuple[PodRef, ResolvedDemand]:
        """The pod's resolved demand (cached by :func:`demand_digest`); PodRejected if bad."""
        try:
            ref = pod_ref(pod)
        except DemandError as exc:
            raise BadRequest(exc.field, exc.problem) from None
        digest = demand_digest(pod)
        now = self.clock()
        with self._cache_lock:
            hit = self._cache.get(digest)
            if hit is not None and hit[1] > now:
                return ref, hit[0]
        try:
            job = parse_demand(pod)
        except DemandError as exc:
            raise PodRejected(f"tandem: bad pod request: {exc}", exc.field) from None
        predict = self._predict if self.config.current().predictor.enabled else None
        knowledge = self._knowledge(job.gpu_count, ref.namespace)
        resolved = resolve_demand(job, self.state.gpu_types(), predict, self._profiles,
                                  session_name=ref.key, knowledge=knowledge)
        ttl = self.config.current().state.demand_cache_seconds
        if any(g.startswith(FETCHING) for g in resolved.gaps.values()):
            return ref, resolved  # not cached: the next filter sees the model once it is here
        with self._cache_lock:
            self._cache[digest] = (resolved, now + ttl)
            self._cache.move_to_end(digest)
            while len(self._cache) > DEMAND_CACHE_LIMIT:
                self._cache.popitem(last=False)
        return ref, resolved

    def _knowledge(self, gpus: int, namespace: str) -> UtilKnowledge:
        cfg = self.config.current().learning
        if self.learner is not None:
            return self.learner.knowledge(cfg, gpus, namespace)
        return UtilKnowledge(None, cfg.min_observations, cfg.cold_start_util_percent)

    def _source_on(self, demand: ResolvedDemand, node: str, indices: tuple[int, ...]) -> str:
        """Where the bound numbers came from: the demand's source on the node's GPU type."""
        for gpu in self.state.node_gpus(node):  # not gpu_rows(): every GPU of the cluster
            if gpu.index in indices:
                found = demand.for_type(gpu_type_of(gpu.product))
                return found.source if found is not None else ""
        return ""

    def _require_synced(self) -> None:
        if not self.state.synced:
            raise NotReady("tandem: cluster state not synced yet")

    # ---- verbs -----------------------------------------------------------------------
    def filter(self, args: ExtenderArgs) -> tuple[dict[str, Any], FilterOutcome]:
        """Hard constraints; every rejected node gets a precise reason."""
        names = args.candidate_names()
        self._require_synced()
        try:
            ref, demand = self.demand(args.pod)
        except PodRejected as exc:
            result = filter_result(args, [], {}, {n: str(exc) for n in names})
            bad = Reason.BAD_POD_REQUEST.event_reason
            return dict(result), FilterOutcome(0, {bad: len(names)})
        ev = self.state.evaluate(names, demand, self._inference, Purpose.FILTER)
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
            passed = self.preemptor.filter_nodes(ref, demand, passed, failed)
        # Every rejection is unresolvable to kube-scheduler: its preemption cannot see
        # tandem.io/gpu (it would find "victims" for nothing), tandem preempts itself.
        return dict(filter_result(args, passed, {}, {**failed, **unresolvable})), \
            FilterOutcome(len(passed), reasons)

    def prioritize(self, args: ExtenderArgs) -> EncodedJson:
        """Integer 0..10 per candidate from the Horus cost (best fit for sessions), encoded."""
        names = args.candidate_names()
        try:
            self._require_synced()
            _, demand = self.demand(args.pod)
        except (PodRejected, NotReady):
            return encode_host_priorities(names, [0] * len(names))
        ev = self.state.evaluate(names, demand, self._inference)
        return encode_host_priorities(names, ev.scores())

    def _handoff_gated(self, handoff: Any) -> bool:
        """Whether bind waits for the device plugin's hand-off (a kubelet admits the pod)."""
        return handoff.mode == "device-plugin" and self.source.kubelet_admits

    def bind(self, args: BindingArgs) -> dict[str, str]:
        """Re-check on fresh state, assume, annotate, bind; Error on any failure."""
        if not self.may_bind():
            raise NotLeader("tandem: this replica is not the leader and may not bind")
        self._require_synced()
        existing = self.state.placement_of(args.pod_uid) if args.pod_uid else None
        bound_to = existing.node if existing is not None else None
        if existing is not None and self._outcome_unknown(args.pod_uid):
            bound_to = self._settle(args)  # an earlier attempt got no answer: ask the API
        if bound_to is not None:
            if bound_to == args.node:
                return {"Error": ""}  # a retried bind that already went through
            raise BindConflict(f"pod already bound to {bound_to}", None)
        handoff = self.config.current().handoff
        waiting = self.state.handoffs.holder(args.node, args.pod_uid) \
            if self._handoff_gated(handoff) else None
        if waiting is not None:
            raise _handoff_busy(args.node, waiting.pod)
        pod = self._pod_for(args)
        ref, demand = self.demand(pod)
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
            placement, plan, cost, uuids, interference = self._assume(
                args.node, demand, ref, inputs, container_gpu_counts(pod))
            annotations = output_annotations(placement, uuids, cost, plan,
                                             self._source_on(demand, args.node,
                                                             tuple(placement.gpu_indices)),
                                             interference)
            try:
                confirmed = self.source.bind(ref, args.node, annotations, placement)
            except BindOutcomeUnknown as exc:
                # The binding may be on the API server: keep the GPUs reserved (the expiry
                # clock starts now) until the watch shows the pod, a retry asks the API, or
                # the TTL passes.
                self.state.finish_binding(placement.pod_uid)
                self._mark_unknown(placement.pod_uid)
                self.source.record_event(ref, "TandemBindFailed",
                                         f"bind to {args.node}: {exc}", True)
                ttl = self.config.current().state.assume_ttl_seconds
                raise BindOutcomeUnknown(
                    f"tandem: bind to {args.node}: outcome unknown ({exc}); its GPUs stay "
                    f"reserved until the pod is seen bound, the bind is retried, or {ttl:g} s "
                    "pass") from exc
            except Exception as exc:
                # Refused: nothing was applied. A placement the watch confirmed meanwhile stays.
                self.state.forget_assumed(placement.pod_uid)
                self.source.record_event(ref, "TandemBindFailed",
                                         f"bind to {args.node}: {exc}", True)
                raise SourceError(f"tandem: bind to {args.node} failed: {exc}") from exc
        except BindOutcomeUnknown:
            raise  # the pod may be bound and waiting for its GPU: the node stays claimed
        except Exception:
            if gated:
                self.state.handoffs.release(ref.uid or ref.key)
            raise
        if self.preemptor is not None:
            self.preemptor.bound(ref.uid)
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
                ) -> tuple[Any, Any, float, list[str], str]:
        """The ledger's assume; a preemptor's reserved GPUs on ``node`` are its own."""
        def assume() -> tuple[Any, Any, float, list[str], str]:
            return self.state.assume_best(node, demand, self._inference, ref.uid or ref.key,
                                          ref.key, inputs, container_gpus)
        return self.preemptor.assume_for(ref.uid, node, assume) if self.preemptor else assume()

    def _mark_unknown(self, uid: str) -> None:
        with self._cache_lock:
            self._unknown[uid] = None
            while len(self._unknown) > DEMAND_CACHE_LIMIT:
                self._unknown.popitem(last=False)

    def _outcome_unknown(self, uid: str) -> bool:
        with self._cache_lock:
            return uid in self._unknown

    def _settle(self, args: BindingArgs) -> str | None:
        """After a bind with no answer: the node the API server has the pod on, or None when
        it is not bound (the held reservation is dropped and the caller binds afresh)."""
        try:
            pod = self.source.read_pod(args.pod_namespace, args.pod_name)
        except Exception as exc:  # still unknown: the reservation stays, the next retry asks
            raise BindOutcomeUnknown(f"tandem: bind to {args.node}: an earlier attempt got no "
                                     f"answer and the pod cannot be read ({exc})") from exc
        uid = str(((pod or {}).get("metadata") or {}).get("uid", ""))
        node = ((pod or {}).get("spec") or {}).get("nodeName") if uid == args.pod_uid else None
        with self._cache_lock:
            self._unknown.pop(args.pod_uid, None)
        if not node:
            self.state.forget_assumed(args.pod_uid)
            if pod is None or uid != args.pod_uid:
                raise BindConflict(f"pod {args.pod_namespace}/{args.pod_name} with UID "
                                   f"{args.pod_uid} no longer exists", None)
            return None
        return str(node)

    def _pod_for(self, args: BindingArgs) -> Mapping[str, Any]:
        """The pod as the cluster has it (the API server, or the simulated registry), never a
        /filter body: anyone who reaches the extender can send one. The demand cache still
        saves the prediction when the contents are those filter saw (same digest)."""
        pod = self.source.current_pod(args.pod_namespace, args.pod_name)
        if pod is None:
            raise BindConflict(f"pod {args.pod_namespace}/{args.pod_name} not found", None)
        uid = (pod.get("metadata") or {}).get("uid")
        if args.pod_uid and uid != args.pod_uid:
            raise BindConflict(f"pod {args.pod_namespace}/{args.pod_name} has UID {uid}, "
                               f"not {args.pod_uid} (recreated?)", None)
        return pod

    def preempt(self, pod: Mapping[str, Any], victims: Mapping[str, list[str]],
                ) -> dict[str, list[str]]:
        """Keep a node's proposed victims only if evicting them lets the pod fit there.

        We never add victims: the scheduler chose them for its own resources and
        only we know GPU capacity, so the useful answer is to drop nodes where the
        proposed evictions would not free enough GPU memory or co-location slots.
        """
        self._require_synced()
        try:
            _, demand = self.demand(pod)
        except PodRejected:
            return {}
        return {node: uids for node, uids in victims.items()
                if self.state.fits_without(node, uids, demand, self._inference)}

    # ---- agent reports and state reads -----------------------------------------------
    def authorize_agent(self, authorization: str | None) -> str | None:
        """The node an agent's report may be about: with ``reports.identity:
        service-account`` the node its reviewed pod token is bound to, else None (the shared
        agent token, any node). Unauthorized (or Forbidden) otherwise."""
        return speaks_for(authorization, self.config.current().reports, self._environ,
                          self._identity)

    def report(self, report: DecodedReport, speaks_for: str | None = None) -> dict[str, int]:
        """Keep a node's report (soft state) and learn from it; the answer to the agent.
        ``speaks_for``: the node the agent's identity allows (Forbidden for another)."""
        check_node(speaks_for, report.node)
        self.state.report(report.node, report.gpus, report.util_percent,
                          report.memory_used_mib)
        samples = self.learner.observe(report, self.state.placement_of,
                                       self.state.source_gpu_types(report.node)) \
            if self.learner is not None and self.config.current().learning.enabled else 0
        return {"accepted": len(report.gpus), "samples": samples}

    def read_state(self, authorization: str | None, node: str | None = None,
                   ) -> StateDocument:
        """``/v1/state``: in full (pod names, annotations, what was learned) for the agent
        token, redacted for anyone else (docs/security.md); ``node``: that node only."""
        if not may_read_full(authorization, node, self.config.current().reports,
                             self._environ, self._identity):
            return self.state.document(node=node).redacted_copy()
        learning = self.learner.view() if self.learner is not None else None
        return self.state.document(learning, node)
