"""What a pod asks for, resolved once between filter and bind.

Filter and prioritize see the full Pod; bind only gets its name and UID and reads
the pod from the cluster. The resolved demand (annotations, predictor, learned
estimates, profiles) is cached by a digest of everything it is computed from, so
bind reuses filter's prediction only when the pod it reads is the one filter saw.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from contracts.bounded import BoundedMap
from contracts.pod import PodView
from extender.cluster.source import tandem_annotations
from extender.config.loader import ConfigHolder
from extender.core import (
    DemandError,
    DemandUnavailable,
    PodRef,
    ProfileIndex,
    ResolvedDemand,
    Snapshot,
    parse_demand,
    pod_ref,
    resolve_demand,
)
from extender.errors import BadRequest, PodRejected

DEMAND_CACHE_LIMIT = 20_000
"""Most pods whose demand is cached between filter and bind (oldest evicted first)."""
FETCHING = "ModelBeingFetched"
"""Gap kind of a model still downloading (``predictor.fetch``): such demands are not cached."""

CacheEntry = tuple[ResolvedDemand, float]
"""(resolved demand, expiry), keyed by :func:`demand_digest`."""


def demand_digest(pod: Mapping[str, Any] | PodView) -> str:
    """A hash of everything the demand is computed from: the pod's UID, namespace and name
    (the session name), its ``tandem.io/*`` annotations and its containers' names and
    resources. The cache is keyed by it alone, so a body claiming a known pod's UID (and
    resourceVersion) with other contents never answers for the real pod."""
    view = PodView.of(pod)
    containers = [[c.init, c.name, c.resources] for c in view.containers]
    who = [view.uid, view.namespace, view.name]
    content = json.dumps([who, tandem_annotations(view.annotations), containers,
                          view.problems], sort_keys=True, default=repr)
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


class DemandCache:
    """Each pod's resolved demand, per :func:`demand_digest`, for ``state.demand_cache_seconds``."""

    def __init__(self, config: ConfigHolder, clock: Callable[[], float],
                 predictor: DemandPredictor | None, profiles: ProfileIndex):
        self.config = config
        self.clock = clock
        self._predict = predict_fn(predictor) if predictor is not None else None
        self._profiles = profiles
        self._cache: BoundedMap[str, CacheEntry] = BoundedMap(DEMAND_CACHE_LIMIT)
        """Per :func:`demand_digest`: what filter (or bind) resolved."""

    def resolve(self, pod: Mapping[str, Any], snap: Snapshot) -> tuple[PodRef, ResolvedDemand]:
        """The pod's resolved demand on ``snap``'s GPU types with its knowledge (cached by
        :func:`demand_digest`); PodRejected if bad."""
        view = PodView.of(pod)  # read once
        try:
            ref = pod_ref(view)
        except DemandError as exc:
            raise BadRequest(exc.field, exc.problem) from None
        digest = demand_digest(view)
        now = self.clock()
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > now:
            return ref, hit[0]
        try:
            job = parse_demand(view)
        except DemandError as exc:
            raise PodRejected(f"tandem: bad pod request: {exc}", exc.field) from None
        predict = self._predict if self.config.current().predictor.enabled else None
        knowledge = replace(snap.knowledge.util(job.gpu_count, ref.namespace),
                            whole_gpu_mib=lambda gpu_type: _whole_gpu_mib(snap, gpu_type))
        resolved = resolve_demand(job, list(snap.table.type_names), predict, self._profiles,
                                  session_name=ref.key, knowledge=knowledge)
        ttl = self.config.current().state.demand_cache_seconds
        if any(g.startswith(FETCHING) for g in resolved.gaps.values()):
            return ref, resolved  # not cached: the next filter sees the model once it is here
        self._cache.put(digest, (resolved, now + ttl))
        return ref, resolved


def _whole_gpu_mib(snap: Snapshot, gpu_type: str) -> float | None:
    """The smallest memory of ``gpu_type``'s GPUs (asked only for pods stating none)."""
    return min((gpu.memory_mib for gpu in snap.table.gpus if gpu.gpu_type == gpu_type),
               default=None)
