"""Online learning of each model's GPU utilisation from what the agents observe.

Agents report, per GPU, the processes on it with their pod UID and, where NVML
gives it, each process's utilisation (``nvmlDeviceGetProcessUtilization``). A
report becomes one *sample* per (placed training pod, GPU):

- the pod's per-process utilisation summed (capped at 100) when reported, else
- the GPU's utilisation when the pod is alone on the GPU (its processes are the
  only ones, none unattributed), else no sample (a shared GPU's total cannot be
  split fairly without per-process figures).

The pod must be placed by this extender on that node and GPU (its ledger
placement), so an agent cannot teach about pods it does not host. Samples are
keyed by (model file digest, batch size, workload, GPU type), the reference
standing in for the digest until the extender has resolved it, and kept as a
bounded running estimate (:mod:`extender.learning.store`). Samples taken alone and
co-located are kept apart: resolution uses the alone estimate (what the
predictor models); a co-located one is a floor of it (sharing never raises a
job's own use), so it raises a prediction that is lower (``observed-shared:<n>``)
and is recorded for interference learning and export. A shared GPU whose every
pod has per-process figures and a trustworthy alone estimate also gives one
interference-curve point
(:mod:`extender.learning.curves`); the learned curves enter the cost through
:meth:`Learner.policy`.

The leader persists the estimates in a ConfigMap (one JSON document, at most
``max_entries`` estimates) and every replica reloads it at start. ``tandem
predictor export-observations`` turns that document into ``training_data/`` rows
(:mod:`predictor.observed`). :meth:`Learner.stats` feeds the learner's
Prometheus metrics (``tandem_learning_*``, docs/metrics.md).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from contracts.learningdoc import DOCUMENT_VERSION
from contracts.logs import get_logger
from extender.config import LearningConfig
from extender.core import Placement, UtilKnowledge
from extender.core.cost import CostPolicy
from extender.learning.curves import CurveGuards, CurveLearner, LearnedPolicy, SharedGpuPoints
from extender.learning.interference import DOCUMENT_KEY as PAIRS_KEY
from extender.learning.interference import PairLearner
from extender.learning.store import Estimate, ObservationStore
from extender.state.reports import DecodedReport
from predictor.curves import InterferenceCurve

DOCUMENT_KEY = "observations.json"
__all__ = ["DOCUMENT_VERSION", "ConfigMapPersistence", "Estimate", "Learner", "ObservationStore",
           "build_learner", "own_namespace"]


class ConfigMapPersistence:
    """The estimates in one ConfigMap (``data[observations.json]``), via a CoreV1Api."""

    MAX_BYTES = 900_000  # a ConfigMap holds at most 1 MiB; keep headroom for metadata

    def __init__(self, api: Any, namespace: str, name: str):
        self.api, self.namespace, self.name = api, namespace, name

    def load(self) -> Any | None:
        """The persisted document, or None when the ConfigMap does not exist."""
        from kubernetes.client.exceptions import ApiException
        try:
            response = self.api.read_namespaced_config_map(self.name, self.namespace,
                                                           _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        body = json.loads(response.data)
        text = (body.get("data") or {}).get(DOCUMENT_KEY)
        return None if text is None else json.loads(text)

    def save(self, doc: Mapping[str, Any]) -> None:
        """Write the document (replace, or create on 404); ValueError when too large."""
        from kubernetes.client.exceptions import ApiException
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        if len(text) > self.MAX_BYTES:
            raise ValueError(f"learning document is {len(text)} bytes (limit {self.MAX_BYTES}); "
                             "lower learning.max_entries")
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "tandem"}},
                "data": {DOCUMENT_KEY: text}}
        try:
            _drain(self.api.replace_namespaced_config_map(self.name, self.namespace, body,
                                                          _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                raise
            _drain(self.api.create_namespaced_config_map(self.namespace, body,
                                                         _preload_content=False))


class Learner:
    """The store, its persistence (leader only, rate-limited) and the resolution hook."""

    def __init__(self, cfg: LearningConfig, persistence: ConfigMapPersistence | None = None,
                 may_persist: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic, *,
                 prior: Callable[[str], InterferenceCurve] = lambda _t: InterferenceCurve(),
                 wall_clock: Callable[[], float] = time.time,
                 digest_of: Callable[[str], str | None] | None = None):
        self.cfg = cfg
        self.store = ObservationStore(cfg.ewma_alpha, cfg.max_entries, wall_clock, digest_of)
        self._wall = wall_clock
        self.curves = CurveLearner(CurveGuards(
            cfg.curve_min_points, cfg.curve_max_step, cfg.curve_outlier_mads,
            cfg.curve_refit_interval_seconds), wall_clock)
        self.prior = prior
        """The configured curve of a GPU type: where its first refit starts from."""
        self.pairs = PairLearner(cfg.pair_max_entries, cfg.pair_explore_bonus)
        """Who slows whom (:mod:`extender.learning.interference`)."""
        self._overlay = LearnedPolicy(self.curves)
        self.persistence = persistence
        self._may_persist = may_persist
        self._clock = clock
        self._last_save = -math.inf
        self._save_lock = threading.Lock()
        self.persist_writes = 0
        self.persist_failures = 0
        self.persisted_at: float | None = None
        """Wall-clock seconds of the last successful write (or of the reloaded document)."""

    def start(self) -> None:
        """Reload what an earlier leader persisted; a bad document is logged and skipped."""
        if self.persistence is None:
            return
        try:
            doc = self.persistence.load()
            loaded = 0 if doc is None else self.store.load_document(doc)
            if doc is not None and doc.get("curves") is not None:  # older documents have none
                loaded += self.curves.load_document(doc["curves"])
            if doc is not None and doc.get(PAIRS_KEY) is not None:
                loaded += self.pairs.load_document(doc[PAIRS_KEY])
        except Exception as exc:  # learning restarts from zero; placement must not stop
            get_logger().warning("learning: cannot reload persisted observations",
                                 extra={"error": repr(exc)})
            return
        if doc is not None:
            self.persisted_at = self._wall()
        get_logger().info("learning: observations reloaded", extra={"entries": loaded})

    def knowledge(self, cfg: LearningConfig) -> UtilKnowledge:
        """What resolution uses: the alone estimates and the shared floors (when enabled),
        and the cold-start rule."""
        return UtilKnowledge(self.store.lookup if cfg.enabled else None, cfg.min_observations,
                             cfg.cold_start_util_percent,
                             self.store.lookup_shared if cfg.enabled else None)

    def observe(self, report: DecodedReport,
                placement_of: Callable[[str], Placement | None]) -> int:
        """Samples from one agent report, then a save when due; returns samples taken."""
        taken = 0
        moves: list[float] = []
        points = SharedGpuPoints(self.curves, lambda key: self.store.trusted_alone(
            key, self.cfg.min_observations))
        for position, (gpu, util, procs) in enumerate(zip(
                report.gpus, report.util_percent, report.processes, strict=False)):
            taken += self.store.observe_gpu(report.node, report.gpus, position, gpu.product,
                                            util, procs,
                                            placement_of, points if self.cfg.curves else None,
                                            moves)
        if moves:
            self.store.last_change = sum(moves) / len(moves)
        points.refit(self.prior)
        if self.cfg.enabled and self.cfg.pairs:
            self.pairs.observe(report, placement_of, self._trusted_alone)
        self.maybe_persist()
        return taken

    def _trusted_alone(self, model: str, batch: int, gpu_type: str) -> float | None:
        found = self.store.lookup(model, batch, gpu_type, "training")
        return found[0] if found is not None and found[1] >= self.cfg.min_observations else None

    def policy(self, base: CostPolicy, cfg: LearningConfig) -> CostPolicy:
        """``base`` with the learned curves in place of its priors (when ``learning.curves``)
        and the learned pairwise interference (when ``learning.pairs``)."""
        policy = self._overlay(base, cfg.enabled and cfg.curves)
        return policy.with_pairs(self.pairs.model()) if cfg.enabled and cfg.pairs else policy

    def document(self) -> dict[str, Any]:
        """What is persisted: the estimates and the curves with their points."""
        return {**self.store.to_document(), "curves": self.curves.to_document(),
                PAIRS_KEY: self.pairs.to_document()}

    def view(self) -> dict[str, Any]:
        """For ``/v1/state``: the estimates and the learned curves."""
        return {**self.store.view(), "curves": self.curves.view(), PAIRS_KEY: self.pairs.view()}

    def maybe_persist(self, force: bool = False) -> bool:
        """Write the ConfigMap if this replica leads, something changed and it is due."""
        if self.persistence is None or not (self.store.dirty or self.curves.dirty
                                            or self.pairs.dirty) \
                or not self._may_persist():
            return False
        with self._save_lock:
            now = self._clock()
            if not force and now - self._last_save < self.cfg.persist_interval_seconds:
                return False
            self._last_save = now
            try:
                self.persistence.save(self.document())
            except Exception as exc:  # the next report retries; reports must still be taken
                self.persist_failures += 1
                get_logger().warning("learning: cannot persist observations",
                                     extra={"error": repr(exc)})
                return False
            self.persist_writes += 1
            self.persisted_at = self._wall()
            self.store.dirty = self.curves.dirty = self.pairs.dirty = False
            return True

    def stats(self) -> dict[str, Any]:
        """What the learner's metrics show (``extender.ops.metrics.LearnerCollector``)."""
        store = self.store
        return {"accepted": store.samples_total, "rejected": dict(store.rejected),
                "estimates": store.trust_counts(self.cfg.min_observations),
                "last_change_percent": store.last_change,
                "pairs": self.pairs.stats(),
                "persist_writes": self.persist_writes,
                "persist_failures": self.persist_failures,
                "persist_age_seconds": None if self.persisted_at is None
                else max(0.0, self._wall() - self.persisted_at)}


def _drain(response: Any) -> None:
    """Read and release an unparsed response (its body is a ConfigMap nobody needs)."""
    response.data  # noqa: B018 - reading the body returns the connection to the pool
    release = getattr(response, "release_conn", None)
    if release is not None:
        release()


def own_namespace(default: str = "default") -> str:
    """The pod's namespace in a cluster (service-account file), else ``default``."""
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace",
                  encoding="utf-8") as f:
            return f.read().strip() or default
    except OSError:
        return default


def build_learner(cfg: LearningConfig, source: Any, may_persist: Callable[[], bool],
                  prior: Callable[[str], InterferenceCurve] | None = None,
                  digest_of: Callable[[str], str | None] | None = None) -> Learner:
    """The learner for ``source``: persisted in a ConfigMap when the source is Kubernetes.

    ``prior``: the configured curve of a GPU type (where curve refits start);
    ``digest_of``: the model file digest a reference resolved to (keys estimates).
    """
    api = source.api
    persistence = None
    if cfg.configmap and api is not None:
        persistence = ConfigMapPersistence(api, cfg.namespace or own_namespace(), cfg.configmap)
    learner = Learner(cfg, persistence, may_persist,
                      prior=prior or (lambda _t: InterferenceCurve()), digest_of=digest_of)
    learner.start()
    return learner
