"""Online learning of each model's GPU utilisation from what the agents observe.

Agents report, per GPU, the processes on it with their pod UID and, where NVML
gives it, each process's utilisation (``nvmlDeviceGetProcessUtilization``). A
report becomes one *sample* per (placed training pod, GPU):

- the pod's per-process utilisation summed (capped at 100) when reported, else
- the GPU's utilisation when the pod is alone on the GPU (its processes are the
  only ones, none unattributed) and on each of its other GPUs (:func:`shared_pods`),
  else no sample (a shared GPU's total cannot be split fairly without per-process
  figures). A sample counts as *alone* only under that same condition.

A best-effort inference session runs inside its GPU's inference server, so its
processes teach nothing; the server counts the GPU time each session used and the
agent carries that counter in the report (``sessions``), from which the session's
utilisation is learned (:meth:`ObservationStore.observe_sessions`).

The pod must be placed by this extender on that node and GPU (its ledger
placement), so an agent cannot teach about pods it does not host. Samples are
keyed by (model file digest, batch size, workload, GPU type, GPU count), the reference
standing in for the digest until the extender has resolved it, and kept as a
bounded running estimate (:mod:`extender.learning.store`). Samples taken alone and
co-located are kept apart: resolution uses the alone estimate (what the
predictor models); a co-located one is a floor of it (sharing never raises a
job's own use), so it raises a prediction that is lower (``observed-shared:<n>``)
and is recorded for interference learning and export. A shared GPU whose every
pod has per-process figures and a trustworthy alone estimate also gives one
interference-curve point
(:mod:`extender.learning.curves`). Everything learned reaches decisions as one
frozen :class:`extender.learning.knowledge.Knowledge` (:meth:`Learner.knowledge`).

The leader persists the estimates in a ConfigMap (one JSON document under
:data:`~extender.learning.persistence.MAX_BYTES`, the least recently used estimates
evicted first; :mod:`extender.learning.persistence`). Every replica reloads it at
start, and a replica that becomes leader reloads and merges it before it writes;
each write is conditional on the ConfigMap's resourceVersion (a conflict merges and
retries), so a failover never loses what the old leader persisted. ``tandem
predictor export-observations`` turns that document into ``training_data/`` rows
(:mod:`predictor.observed`). :meth:`Learner.stats` feeds the learner's
Prometheus metrics (``tandem_learning_*``, docs/metrics.md).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from contracts.gpus import find_gpus
from contracts.logs import get_logger
from extender.cluster.namespace import own_namespace
from extender.config.sections import LearningConfig
from extender.core import Placement, UtilKnowledge, gpu_type_of
from extender.core.cost import CostPolicy
from extender.learning.bias import PriorBias
from extender.learning.curves import CurveGuards, CurveLearner, SharedGpuPoints
from extender.learning.document import DOCUMENT_VERSION
from extender.learning.estimate import INDEPENDENT_SECONDS, Estimate, Trust
from extender.learning.interference import DOCUMENT_KEY as PAIRS_KEY
from extender.learning.interference import PairLearner
from extender.learning.knowledge import Knowledge
from extender.learning.persistence import (
    DOCUMENT_KEY,
    MAX_BYTES,
    ConfigMapPersistence,
    WriteConflict,
    encode,
)
from extender.learning.readings import shares_only
from extender.learning.shapes import DOCUMENT_KEY as SHAPES_KEY
from extender.learning.shapes import ShapeLearner
from extender.learning.store import ObservationStore
from extender.state.reports import DecodedReport
from predictor.curves import InterferenceCurve

SAVE_ATTEMPTS = 3
"""Conditional writes per save (each conflict re-reads and merges first)."""
__all__ = ["DOCUMENT_KEY", "DOCUMENT_VERSION", "ConfigMapPersistence", "Estimate", "Learner",
           "ObservationStore", "build_learner"]


class Learner:
    """The store, its persistence (leader only, rate-limited) and the resolution hook."""

    def __init__(self, cfg: LearningConfig, persistence: ConfigMapPersistence | None = None,
                 may_persist: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic, *,
                 prior: CostPolicy | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 digest_of: Callable[[str], str | None] | None = None):
        self.cfg = cfg
        self.store = ObservationStore(trust_of(cfg), cfg.max_entries, wall_clock, digest_of)
        self._wall = wall_clock
        self.curves = CurveLearner(CurveGuards(
            cfg.curve_min_points, cfg.curve_max_step, cfg.curve_outlier_mads,
            cfg.curve_refit_interval_seconds), wall_clock)
        self.bias = PriorBias(self.store.trusted_items, lambda: self.store.samples_total,
                              lambda: self.store.clock(), cfg.max_entries)
        """The prior's bias where it was observed, for keys not observed yet."""
        self._prior = prior
        """The configured curves (a policy): where each GPU type's first refit starts."""
        self._knowledge: tuple[tuple[Any, ...], Knowledge] | None = None
        self.pairs = PairLearner(cfg.pair_max_entries, cfg.pair_explore_bonus,
                                 warmup_seconds=cfg.warmup_seconds, clock=wall_clock,
                                 prior=cfg.pair_prior_tables, groups=cfg.pair_groups)
        """Who slows whom (:mod:`extender.learning.interference`)."""
        self.shapes = ShapeLearner()
        """The pod shapes bound so far (:mod:`extender.learning.shapes`)."""
        self.persistence = persistence
        self._may_persist = may_persist
        self._clock = clock
        self._last_save = -math.inf
        self._save_lock = threading.Lock()
        self.persist_writes = 0
        self.persist_failures = 0
        self.persist_conflicts = 0
        self._leading = False
        self._synced = False
        self._last_sync_try = -math.inf
        """The persisted document was read (and merged) since this replica became leader."""
        self.persisted_at: float | None = None
        """Wall-clock seconds of the last successful write (or of the reloaded document)."""

    def start(self) -> None:
        """Reload what an earlier leader persisted; a bad document is logged and skipped."""
        if self.persistence is not None:
            self._reload(merge=False)

    def _reload(self, merge: bool) -> bool:
        """Read the ConfigMap and replace (``merge``: merge into) what this replica knows.

        False when it could not be read; a document that does not parse counts as
        read (it is overwritten by the next write: learning again beats garbage)."""
        assert self.persistence is not None
        try:
            doc = self.persistence.load()
        except Exception as exc:  # the API server is unreachable: try again later
            get_logger().warning("learning: cannot read persisted observations",
                                 extra={"error": repr(exc)})
            return False
        if doc is None:
            return True
        try:
            loaded = self.load_document(doc, merge)
        except Exception as exc:  # learning restarts from zero; placement must not stop
            get_logger().warning("learning: cannot reload persisted observations",
                                 extra={"error": repr(exc)})
            return True
        self.persisted_at = self._wall()
        get_logger().info("learning: observations reloaded",
                          extra={"entries": loaded, "merged": merge})
        return True

    def load_document(self, doc: Mapping[str, Any], merge: bool = False) -> int:
        """Replace (``merge``: merge into) what is learned by ``doc``, as :meth:`document`
        wrote it; returns the entries read. Raises on a document that does not parse."""
        loaded = self.store.merge_document(doc, replace=not merge)
        if doc.get("curves") is not None:  # older documents have none
            loaded += self.curves.load_document(doc["curves"], merge=merge)
        if doc.get(PAIRS_KEY) is not None and not (merge and self.pairs.samples_total):
            # merging keeps this replica's pairs once it learned some (the leader's own)
            loaded += self.pairs.load_document(doc[PAIRS_KEY])
        if doc.get(SHAPES_KEY) is not None:  # older documents have none
            loaded += self.shapes.load_document(doc[SHAPES_KEY], merge=merge)
        return loaded

    def use_wall_clock(self, wall_clock: Callable[[], float]) -> None:
        """Read time from ``wall_clock`` from now on (simulations and tests)."""
        self._wall = self.store.clock = self.curves.clock = self.pairs.clock = wall_clock

    def use_prior(self, policy: CostPolicy) -> None:
        """The configured curves from now on: where each GPU type's first refit starts (and
        the packing section's bounds on the learned shapes)."""
        self._prior = policy
        self.shapes.bounds(policy.packing)

    def prior(self, gpu_type: str) -> InterferenceCurve:
        """The configured curve of ``gpu_type`` (the default curve without a config)."""
        return InterferenceCurve() if self._prior is None else self._prior.curve_for(gpu_type)

    def knowledge(self, cfg: LearningConfig | None = None) -> Knowledge:
        """Everything learned, frozen, under ``cfg`` (default: the learner's own); the same
        value until a curve is refitted, the pair model is rebuilt or ``cfg`` changes."""
        cfg = self.cfg if cfg is None else cfg
        curves_on, pairs_on = cfg.enabled and cfg.curves, cfg.enabled and cfg.pairs
        pairs = self.pairs.current() if pairs_on else None
        key = (cfg, self.curves.version if curves_on else 0, id(pairs))
        cached = self._knowledge
        if cached is not None and cached[0][0] is cfg and cached[0][1:] == key[1:]:
            return cached[1]
        curves = self.curves.curves() if curves_on and self.curves.version else {}
        built = Knowledge(curves, pairs, self._util_of(cfg), cfg, self.shapes.shapes)
        self._knowledge = (key, built)
        return built

    def _util_of(self, cfg: LearningConfig) -> Callable[[int, str | None], UtilKnowledge]:
        """The resolution hook: the alone estimates, the shared floors and the prior's learned
        bias (when enabled), and the cold-start rule, for a pod of ``gpus`` GPUs in
        ``namespace``. An estimate learned from one namespace's pods only serves that
        namespace until a second confirms it (a tenant cannot set another's predictions by
        naming its model)."""
        store = self.store

        def util(gpus: int, namespace: str | None) -> UtilKnowledge:
            def alone(model: str, batch: int, gpu_type: str, workload: str,
                      ) -> tuple[float, int] | None:
                return store.lookup(model, batch, gpu_type, workload, gpus, namespace)

            def floor(model: str, batch: int, gpu_type: str, workload: str,
                      ) -> tuple[float, int] | None:
                return store.lookup(model, batch, gpu_type, workload, gpus, namespace, shared=True)

            def corrected(model: str, batch: int, gpu_type: str, workload: str,
                          predicted: float) -> tuple[float, int] | None:
                key = (store.model_key(model), batch, workload, gpu_type, gpus)
                return self.bias.corrected(key, predicted, namespace)
            return UtilKnowledge(alone if cfg.enabled else None, cfg.min_observations,
                                 cfg.cold_start_util_percent, floor if cfg.enabled else None,
                                 corrected if cfg.enabled and cfg.prior_correction else None)
        return util

    def observe(self, report: DecodedReport,
                placement_of: Callable[[str], Placement | None],
                inventory: frozenset[str] | None = None) -> int:
        """Samples from one agent report, then a save when due; returns samples taken.

        ``inventory``: the GPU types the cluster source lists for the report's node; a GPU
        reported as another type teaches nothing (an agent cannot invent GPU types)."""
        taken = 0
        moves: list[float] = []
        points = SharedGpuPoints(self.curves, self.store.trusted_alone)
        report, not_shares = shares_only(report)  # figures that are not shares teach nothing
        shared = shared_pods(report, placement_of)
        for position, (gpu, util, procs) in enumerate(zip(
                report.gpus, report.util_percent, report.processes, strict=False)):
            if inventory is not None and gpu_type_of(gpu.product) not in inventory:
                self.store.reject("gpu-type-not-in-inventory", len(procs))
                continue
            taken += self.store.observe_gpu(report.node, report.gpus, position, gpu.product,
                                            util, procs, placement_of,
                                            points if self.cfg.curves else None, moves, shared,
                                            position in not_shares)
        for position, (gpu, sessions) in enumerate(zip(report.gpus, report.sessions,
                                                       strict=False)):
            if sessions and (inventory is None or gpu_type_of(gpu.product) in inventory):
                taken += self.store.observe_sessions(report.node, report.gpus, position,
                                                     gpu.product, sessions, placement_of)
        if moves:
            self.store.last_change = sum(moves) / len(moves)
        points.refit(self.prior)
        if self.cfg.enabled and self.cfg.pairs:
            self.pairs.observe(report, placement_of, self._trusted_alone)
            self.pairs.observe_progress(report, placement_of)
        self.maybe_persist()
        return taken

    def _trusted_alone(self, model: str, batch: int, gpu_type: str) -> float | None:
        return self.store.trusted_alone((self.store.model_key(model), batch, "training",
                                         gpu_type))

    def document(self) -> dict[str, Any]:
        """What is persisted: the estimates and the curves with their points, within
        ``persistence.MAX_BYTES`` (least recently used estimates evicted first)."""
        curves = self.curves.to_document()
        limit = getattr(self.persistence, "MAX_BYTES", MAX_BYTES)
        # bounded by learning.pair_max_entries, and to half the document: long model
        # references in many group samples must not crowd out every estimate
        pairs = self.pairs.to_document(max_bytes=limit // 2)
        shapes = self.shapes.to_document()
        if self.persistence is not None:
            fixed = len(encode({**self.store.to_document(empty=True), "curves": curves,
                                PAIRS_KEY: pairs, SHAPES_KEY: shapes}))
            self.store.fit_bytes(limit - fixed)
        return {**self.store.to_document(), "curves": curves, PAIRS_KEY: pairs,
                SHAPES_KEY: shapes}

    def view(self) -> dict[str, Any]:
        """For ``/v1/state``: the estimates, the learned curves and the learned pairs."""
        return {**self.store.view(), "curves": self.curves.view(), PAIRS_KEY: self.pairs.view(),
                SHAPES_KEY: self.shapes.view()}

    def maybe_persist(self, force: bool = False) -> bool:
        """Write the ConfigMap if this replica leads, something changed and it is due.

        A replica that has just become leader first reads and merges the ConfigMap
        (the old leader may have written after this replica last read it)."""
        if self.persistence is None:
            return False
        leading = self._may_persist()
        with self._save_lock:
            if leading and not self._leading:
                self._synced, self._last_sync_try = False, -math.inf
            self._leading = leading
            if not leading:
                return False
            now = self._clock()
            if not self._synced:  # a failed read is retried once per persist interval
                if now - self._last_sync_try < self.cfg.persist_interval_seconds:
                    return False
                self._last_sync_try = now
                self._synced = self._reload(merge=True)
                if not self._synced:
                    return False
            if not (self.store.dirty or self.curves.dirty or self.pairs.dirty
                    or self.shapes.dirty) or \
                    not force and now - self._last_save < self.cfg.persist_interval_seconds:
                return False
            self._last_save = now
            return self._save()

    def _save(self) -> bool:
        """Conditional writes, merging the stored document after each conflict."""
        assert self.persistence is not None
        for _ in range(SAVE_ATTEMPTS):
            try:
                self.persistence.save(self.document())
            except WriteConflict:
                self.persist_conflicts += 1
                if not self._reload(merge=True):
                    break
                continue
            except Exception as exc:  # the next due save retries; reports must still be taken
                get_logger().warning("learning: cannot persist observations",
                                     extra={"error": repr(exc)})
                break
            self.persist_writes += 1
            self.persisted_at = self._wall()
            self.store.mark_synced()
            self.store.dirty = self.curves.dirty = self.pairs.dirty = self.shapes.dirty = False
            return True
        self.persist_failures += 1
        return False

    def stats(self) -> dict[str, Any]:
        """What the learner's metrics show (``extender.ops.metrics.LearnerCollector``)."""
        store = self.store
        return {"accepted": store.samples_total, "rejected": dict(store.rejected),
                "estimates": store.trust_counts(),
                "last_change_percent": store.last_change,
                "persist_writes": self.persist_writes,
                "persist_failures": self.persist_failures,
                "persist_conflicts": self.persist_conflicts,
                "evicted": store.evicted,
                "pairs": self.pairs.stats(),
                "persist_age_seconds": None if self.persisted_at is None
                else max(0.0, self._wall() - self.persisted_at)}


def shared_pods(report: DecodedReport, placement_of: Callable[[str], Placement | None],
                ) -> frozenset[str]:
    """Pods of ``report`` not alone on all their GPUs: one of them has another pod or an
    unattributed process, or is missing from the report (a data-parallel pod's GPU where it
    is alone still waits at each gradient exchange for its shared one)."""
    seen: dict[str, set[int]] = {}
    shared: set[str] = set()
    for position, procs in enumerate(report.processes):
        uids = {p.pod_uid for p in procs}
        for uid in uids - {None}:
            seen.setdefault(uid, set()).add(position)  # type: ignore[arg-type]
            if len(uids) > 1:
                shared.add(uid)  # type: ignore[arg-type]
    for uid, positions in seen.items():
        p = placement_of(uid)
        found = None if p is None else find_gpus(p.gpus, report.gpus)
        if p is not None and (found is None or not set(found) <= positions):
            shared.add(uid)
    return frozenset(shared)


def trust_of(cfg: LearningConfig) -> Trust:
    """The store's trust rule from the configuration (``ewma_alpha``: weight of one minute
    of samples once the estimate holds ``1/alpha`` minutes)."""
    return Trust(cfg.min_observations, cfg.min_observed_seconds, cfg.min_pods,
                 cfg.warmup_seconds, INDEPENDENT_SECONDS / cfg.ewma_alpha, cfg.spread_margin)


def build_learner(cfg: LearningConfig, source: Any, may_persist: Callable[[], bool],
                  prior: CostPolicy | None = None,
                  digest_of: Callable[[str], str | None] | None = None) -> Learner:
    """The learner for ``source``: persisted in a ConfigMap when the source is Kubernetes.

    ``prior``: the configured policy, whose curves are where curve refits start;
    ``digest_of``: the model file digest a reference resolved to (keys estimates).
    """
    api = source.api
    persistence = None
    if cfg.configmap and api is not None:
        persistence = ConfigMapPersistence(api, own_namespace(cfg.namespace), cfg.configmap)
    learner = Learner(cfg, persistence, may_persist, prior=prior, digest_of=digest_of)
    learner.start()
    return learner
