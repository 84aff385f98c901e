"""Carrying preemption out: evict the victims, nominate the node, keep the freed GPU.

Filter asks (:meth:`Preemptor.request`) when no node passed and some node failed
for a reason eviction can cure; a worker thread does the rest off the request
path, on the leader only:

1. read the pod from the API server (its priority and ``preemptionPolicy`` are
   the API server's, never the filter body's); ``preemptionPolicy: Never`` and
   pods already nominated stop here;
2. choose the node and victims (``extender.core.preemption``) among the tandem
   pods the ledger holds, with every PodDisruptionBudget's disruptions left;
3. hold the node (other pods' filter and bind skip it), evict each victim through
   the Eviction API, set the pod's ``status.nominatedNodeName``, post events;
4. once the ledger no longer holds the victims and the node's agents have reported
   since (what they observed still showed the victims' memory), reserve the pod's
   GPUs under ``nominated/<uid>`` (an assumed placement the ledger expires), which
   the pod's own filter and bind look through and every other pod sees as taken.

The choice asks the core's removal what-if (``extender.core.fits_without``): the
victims' reservations and what the agents observed of them are taken off a copy
of the snapshot. When no eviction can help, the pod gets a ``TandemNoPreemption``
event saying why.

A nomination lasts ``NOMINATION_SECONDS``; a refused eviction (a budget that
changed since the choice) ends it, and the pod's next failed filter tries again
after ``RETRY_SECONDS``.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.logs import get_logger
from contracts.pod import PodView
from extender.core import InferenceContext, PodRef, ResolvedDemand, Snapshot, fits_without, place
from extender.core.preemption import Candidate, PreemptionPlan, choose_preemption
from extender.preemption.kube_api import Budget, EvictionRefused, KubePreemptionApi

NOMINATION_SECONDS = 120.0
"""How long a node is held (then its GPU reserved) for a preemptor that does not bind."""
RETRY_SECONDS = 5.0
"""Least time between two preemption attempts for one pod."""
TICK_SECONDS = 0.1
"""How often the worker looks for victims gone (to reserve) and nominations expired."""
REPORT_WAIT_SECONDS = 15.0
"""How long a freed node waits for its agents to report the victims' memory gone before the
nomination ends (nodes without an agent report nothing to wait for)."""
RESERVED_PREFIX = "nominated/"


@dataclass
class Nomination:
    """A preemptor's node: held while its victims leave, then its GPUs reserved."""

    ref: PodRef
    node: str
    demand: ResolvedDemand
    victims: tuple[str, ...]
    expires_at: float
    reserved: bool = False
    freed_at: float | None = None
    """When the state's clock first saw every victim gone (the agents must report after)."""

    @property
    def reservation(self) -> str:
        """The ledger key of the reserved GPUs."""
        return RESERVED_PREFIX + self.ref.uid


class Preemptor:
    """Preemption for pods of one extender (kube source only)."""

    def __init__(self, state: Any, source: Any, api: KubePreemptionApi,
                 demand: Callable[[Mapping[str, Any]], tuple[PodRef, ResolvedDemand]],
                 inference: InferenceContext | None, may_act: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic):
        self.state, self.source, self.api = state, source, api
        self._demand, self._inference, self._may_act, self._clock = \
            demand, inference, may_act, clock
        self._lock = threading.Lock()
        self._nominated: dict[str, Nomination] = {}
        self._last_try: dict[str, float] = {}
        self._queue: queue.Queue[tuple[PodRef, tuple[str, ...]] | None] = queue.Queue(1000)
        self._log = get_logger()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ---- the request path (filter, bind) -------------------------------------------
    def request(self, ref: PodRef, nodes: Sequence[str]) -> None:
        """Ask for preemption on ``nodes`` (filter's resolvable failures); never blocks."""
        if not ref.uid or not nodes:
            return
        with self._lock:
            if ref.uid in self._nominated or \
                    self._clock() - self._last_try.get(ref.uid, -RETRY_SECONDS) < RETRY_SECONDS:
                return
            self._last_try[ref.uid] = self._clock()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait((ref, tuple(nodes)))
        if self._thread is None:  # started on first use: most extenders never preempt
            self.start()

    def stop(self) -> None:
        """Stop the worker (nominations stay until they expire)."""
        self._stop.set()

    def holder(self, node: str, uid: str) -> PodRef | None:
        """The other pod ``node`` is held for while its victims leave, if any."""
        with self._lock:
            for nom in self._nominated.values():
                if nom.node == node and not nom.reserved and nom.ref.uid != uid:
                    return nom.ref
        return None

    def filter_nodes(self, snap: Snapshot, ref: PodRef, demand: ResolvedDemand,
                     passed: list[str], failed: dict[str, str]) -> list[str]:
        """Filter's answer with preemption applied; asks for preemption when nothing passed.

        Nodes held for another pod's preemption fail; the node reserved for this pod
        passes when it fits there with its own reservation set aside.
        """
        resolvable = list(failed)
        with self._lock:  # one look at the nominations (usually none), not one per node
            nom = self._nominated.get(ref.uid)
            held = {n.node: n.ref for n in self._nominated.values()
                    if not n.reserved and n.ref.uid != ref.uid}
        if held:
            for name in [n for n in passed if n in held]:
                passed.remove(name)
                failed[name] = (f"tandem: {name} is being freed for higher-priority pod "
                                f"{held[name].key} (preemption)")
        if nom is not None and nom.reserved and nom.node in failed and \
                fits_without(snap, nom.node, [nom.reservation], demand, self._inference,
                             observed=False):
            del failed[nom.node]
            passed.append(nom.node)
        if not passed:
            self.request(ref, resolvable)
        return passed

    def reservation(self, uid: str, node: str) -> str | None:
        """The key of the GPUs reserved for pod ``uid`` on ``node``, if any: bind sets them
        aside when it decides and replaces them with the pod's placement."""
        with self._lock:
            nom = self._nominated.get(uid)
        return nom.reservation if nom is not None and nom.reserved and nom.node == node \
            else None

    def bound(self, uid: str) -> None:
        """The preemptor is bound (on its node or another): its nomination ends."""
        self._end(uid)

    # ---- the worker ------------------------------------------------------------------
    def start(self) -> None:
        """Run the worker until :meth:`stop`."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="tandem-preemption",
                                            daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=TICK_SECONDS)
            except queue.Empty:
                item = None
            try:
                if item is not None:
                    self.attempt(*item)
                self.tick()
            except Exception:  # one bad attempt must not end preemption
                self._log.exception("preemption failed")

    def attempt(self, ref: PodRef, nodes: Sequence[str]) -> PreemptionPlan | None:
        """Decide and carry out preemption for one pod; the plan carried out, if any."""
        if not self._may_act():
            return None
        pod = self.source.read_pod(ref.namespace, ref.name)
        view = PodView.of(pod or {})
        if pod is None or view.uid != ref.uid or view.node_name:
            return None
        if view.preemption_policy == "Never":
            self._log.debug("not preempting: preemptionPolicy Never", extra={"pod": ref.key})
            return None
        priority = view.priority
        _, demand = self._demand(pod)
        plan, why = self._choose(set(nodes), priority, demand)
        if plan is None:
            self._log.info("no preemption frees a GPU", extra={"pod": ref.key, "why": why})
            self.source.record_event(ref, "TandemNoPreemption",
                                     f"no eviction frees a GPU for this pod: {why}", True)
            return None
        nom = Nomination(ref, plan.node, demand, tuple(v.uid for v in plan.victims),
                         self._clock() + NOMINATION_SECONDS)
        with self._lock:
            if ref.uid in self._nominated:
                return None
            self._nominated[ref.uid] = nom  # hold the node before the first eviction
        return plan if self._carry_out(nom, plan, priority) else None

    def _choose(self, nodes: set[str], priority: int, demand: ResolvedDemand,
                ) -> tuple[PreemptionPlan | None, str]:
        """The plan, or None and why there is none (for the pod's event)."""
        with self._lock:
            taken = {n.node for n in self._nominated.values()}
        candidates: dict[str, list[Candidate]] = {}
        pods = [p for p in map(PodView.of, self.api.bound_pods())
                if p.node_name in nodes - taken and not p.deleting]
        if not pods:
            return None, "no running pod on the nodes that failed (or they are being freed)"
        budgets = self.api.budgets()
        snap = self.state.snapshot()
        for pod in pods:
            placed = snap.placement_of(pod.uid)
            if placed is None or placed.node != pod.node_name:
                continue  # only pods whose GPUs tandem placed free a GPU tandem can give
            candidates.setdefault(placed.node, []).append(Candidate(
                placed.pod_uid, placed.pod, pod.priority,
                tuple(b.key for b in budgets if b.selects(pod))))
        allowed = {b.key: b.disruptions_allowed for b in budgets}
        plan = choose_preemption(
            candidates, priority, allowed,
            lambda node, uids: fits_without(snap, node, uids, demand, self._inference))
        return plan, "" if plan is not None else _why_none(candidates, priority, allowed)

    def _carry_out(self, nom: Nomination, plan: PreemptionPlan, priority: int) -> bool:
        ref, names = nom.ref, ", ".join(f"{v.pod} (priority {v.priority})"
                                        for v in plan.victims)
        for victim in plan.victims:
            namespace, _, name = victim.pod.partition("/")
            try:
                self.api.evict(namespace, name, victim.uid)
            except EvictionRefused as exc:
                self._end(ref.uid)
                self._log.warning("preemption stopped: eviction refused",
                                  extra={"pod": ref.key, "victim": victim.pod,
                                         "node": plan.node, "error": str(exc)})
                self.source.record_event(ref, "TandemPreemptionBlocked",
                                         f"eviction of {victim.pod} on {plan.node} refused "
                                         f"({exc}); tandem retries later", True)
                return False
            self.source.record_event(
                PodRef(namespace, name, victim.uid), "TandemPreempted",
                f"evicted by tandem: its GPU on {plan.node} goes to higher-priority pod "
                f"{ref.key} (priority {priority})", True)
        try:
            self.api.nominate(ref.namespace, ref.name, plan.node)
        except Exception as exc:  # the GPU is still kept for it; the scheduler finds it anyway
            self._log.warning("nominatedNodeName not set", extra={"pod": ref.key,
                                                                  "error": repr(exc)})
        self._log.info("preempting", extra={"pod": ref.key, "node": plan.node,
                                            "victims": [v.pod for v in plan.victims]})
        self.source.record_event(ref, "TandemPreempting",
                                 f"evicting {len(plan.victims)} lower-priority pod(s) on "
                                 f"{plan.node}: {names}; their GPU is kept for this pod", False)
        return True

    def _end(self, uid: str) -> None:
        with self._lock:
            nom = self._nominated.pop(uid, None)
        if nom is not None and nom.reserved:
            self.state.forget(nom.reservation)

    def tick(self) -> None:
        """Reserve the GPUs of nominations whose victims are gone and reported freed; end
        expired ones."""
        now = self._clock()
        with self._lock:
            noms = list(self._nominated.values())
        for nom in noms:
            if now >= nom.expires_at:
                self._end(nom.ref.uid)
                continue
            snap = self.state.snapshot()
            if nom.reserved and snap.placement_of(nom.reservation) is not None:
                self.state.finish_binding(nom.reservation)  # the ledger's expiry, pushed on
            elif all(snap.placement_of(v) is None for v in nom.victims):
                if nom.freed_at is None:
                    nom.freed_at = snap.now
                if _reported_since(snap, nom.node, nom.freed_at):
                    self._reserve(nom, snap)
                elif snap.now - nom.freed_at > REPORT_WAIT_SECONDS:
                    self._end(nom.ref.uid)
                    self._log.warning("freed GPU not reported", extra={
                        "pod": nom.ref.key, "node": nom.node})

    def _reserve(self, nom: Nomination, snap: Snapshot) -> None:
        # (Also after a relist dropped the reservation: it is taken again.)
        decided = place(snap, nom.node, nom.demand, self._inference, nom.reservation,
                        nom.ref.key)
        if decided.placement is None:
            assert nom.freed_at is not None
            if snap.now - nom.freed_at <= REPORT_WAIT_SECONDS:
                return  # the agents may still show the victims' memory: the next report
            self._end(nom.ref.uid)  # the GPU went elsewhere (a bind raced the last victim out)
            self._log.warning("freed GPU not kept", extra={
                "pod": nom.ref.key, "node": nom.node,
                "error": decided.rejection.message() if decided.rejection else ""})
            return
        if not self.state.assume(snap.stamp(nom.node), decided.placement):
            return  # the node changed since the snapshot: the next tick decides again
        self.state.finish_binding(nom.reservation)
        with self._lock:
            ended = nom.ref.uid not in self._nominated  # the pod bound meanwhile
            nom.reserved = not ended
        if ended:
            self.state.forget(nom.reservation)


def _reported_since(snap: Snapshot, node: str, freed_at: float) -> bool:
    """Whether every GPU of ``node`` with a fresh agent observation was observed at or after
    ``freed_at`` (a node without a reporting agent has nothing to wait for)."""
    t = snap.table
    if node not in t.node_index:
        return True
    rows = t.node_rows(node)
    at = t.observed_at[rows.start:rows.stop]
    fresh = snap.now - at <= snap.policy.staleness_seconds
    return bool((at[fresh] >= freed_at).all())


def _why_none(candidates: Mapping[str, Sequence[Candidate]], priority: int,
              allowed: Mapping[str, int]) -> str:
    """Why no node has victims: no lower-priority pod, budgets, or too little freed."""
    lower = [c for pods in candidates.values() for c in pods if c.priority < priority]
    if not lower:
        return f"no pod tandem placed there has a priority below {priority}"
    if not any(all(allowed.get(b, 0) > 0 for b in c.budgets) for c in lower):
        return "every lower-priority pod is protected by a PodDisruptionBudget"
    return "evicting every lower-priority pod a budget allows would not free enough on any node"


def build_preemptor(source: Any, state: Any, demand: Any, inference: InferenceContext | None,
                    may_act: Callable[[], bool], clock: Callable[[], float]) -> Preemptor | None:
    """A preemptor for sources backed by an API server (the ``kube`` source); None otherwise."""
    core = getattr(source, "api", None)
    if core is None or not getattr(source, "kubelet_admits", False):
        return None
    return Preemptor(state, source, KubePreemptionApi(core), demand, inference, may_act, clock)


__all__ = ["Budget", "Nomination", "Preemptor", "build_preemptor"]
