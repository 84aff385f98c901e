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
keyed by (model reference, batch size, workload, GPU type) and kept as a
bounded running estimate: the mean of the first ``1/alpha`` samples, then an
exponentially weighted mean with weight ``alpha`` (so it follows a model whose
behaviour drifts), with its variance and sample count. Samples taken alone and
co-located are kept apart: resolution uses the alone estimate (what the
predictor models), co-located ones are recorded for interference learning and
export. A shared GPU whose every pod has per-process figures and a trustworthy
alone estimate also gives one interference-curve point
(:mod:`extender.learning_curves`); the learned curves enter the cost through
:meth:`Learner.policy`.

The leader persists the estimates in a ConfigMap (one JSON document, at most
``max_entries`` estimates) and every replica reloads it at start. ``tandem
predictor export-observations`` turns that document into ``training_data/`` rows
(:mod:`predictor.observed`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.annotations import BATCH_SIZE, MODEL
from contracts.logs import get_logger
from extender.config import LearningConfig
from extender.core import Placement, UtilKnowledge, Workload, gpu_type_of
from extender.core.cost import CostPolicy
from extender.learning_curves import CurveGuards, CurveLearner, LearnedPolicy, SharedGpuPoints
from extender.reports import DecodedReport, ReportedProcess
from predictor.curves import InterferenceCurve

DOCUMENT_VERSION = 1
DOCUMENT_KEY = "observations.json"
DEFAULT_BATCH = {"training": 32, "inference": 1}

Key = tuple[str, int, str, str]
"""(model reference, batch size, workload, GPU type)."""


@dataclass
class Estimate:
    """A running estimate of one key's utilisation: mean, variance, sample count."""

    mean: float = 0.0
    var: float = 0.0
    count: int = 0
    updated_at: float = 0.0

    def add(self, value: float, alpha: float, now: float) -> None:
        """Fold one sample in (running mean first, EWMA once past ``1/alpha`` samples)."""
        self.count += 1
        weight = max(alpha, 1.0 / self.count)
        delta = value - self.mean
        self.mean += weight * delta
        self.var = (1 - weight) * (self.var + weight * delta * delta)
        self.updated_at = now

    @property
    def stddev(self) -> float:
        """Spread of the samples around the estimate (percentage points)."""
        return math.sqrt(max(self.var, 0.0))


class ObservationStore:
    """Per-(model, batch, workload, GPU type) estimates, alone and co-located; thread-safe."""

    def __init__(self, alpha: float = 0.1, max_entries: int = 2000,
                 wall_clock: Callable[[], float] = time.time):
        if not 0 < alpha <= 1 or max_entries < 1:
            raise ValueError("alpha must be in (0, 1] and max_entries >= 1")
        self.alpha = alpha
        self.max_entries = max_entries
        self._clock = wall_clock
        self._alone: dict[Key, Estimate] = {}
        self._colocated: dict[Key, Estimate] = {}
        self._lock = threading.Lock()
        self.samples_total = 0
        self.dirty = False

    # ---- learning --------------------------------------------------------------------
    def add(self, key: Key, util_percent: float, alone: bool) -> None:
        """One utilisation sample of ``key`` (0..100)."""
        if not math.isfinite(util_percent):
            return
        value = min(max(util_percent, 0.0), 100.0)
        with self._lock:
            table = self._alone if alone else self._colocated
            table.setdefault(key, Estimate()).add(value, self.alpha, self._clock())
            self.samples_total += 1
            self.dirty = True
            self._bound(table)

    def _bound(self, table: dict[Key, Estimate]) -> None:
        while len(table) > self.max_entries:  # drop the least recently observed
            del table[min(table, key=lambda k: table[k].updated_at)]

    def observe_gpu(self, node: str, gpu_index: int, product: str, gpu_util: float,
                    processes: Sequence[ReportedProcess],
                    placement_of: Callable[[str], Placement | None],
                    colocated: Callable[[list[tuple[Key, float]]], None] | None = None) -> int:
        """Samples from one GPU of one report; returns how many were taken.

        ``colocated`` receives the shared GPU's ``(key, utilisation)`` per pod when
        every process on it is a placed pod's and has its own utilisation figure.
        """
        by_pod: dict[str, list[ReportedProcess]] = {}
        foreign = False
        for p in processes:
            if p.pod_uid:
                by_pod.setdefault(p.pod_uid, []).append(p)
            else:
                foreign = True
        alone = len(by_pod) == 1 and not foreign
        taken = 0
        shared: list[tuple[Key, float]] = []
        for uid, procs in sorted(by_pod.items()):
            key = _key_of(placement_of(uid), node, gpu_index, product)
            if key is None:
                continue
            per_process = [p.util_percent for p in procs if p.util_percent is not None]
            if per_process:
                util = min(100.0, sum(per_process))
                if len(per_process) == len(procs):
                    shared.append((key, util))
            elif alone and math.isfinite(gpu_util):
                util = gpu_util
            else:
                continue
            self.add(key, util, alone)
            taken += 1
        if colocated is not None and not foreign and len(by_pod) >= 2 \
                and len(shared) == len(by_pod):
            colocated(shared)
        return taken

    def trusted_alone(self, key: Key, min_samples: int) -> float | None:
        """The alone estimate of ``key`` once it has ``min_samples`` samples, else None."""
        with self._lock:
            est = self._alone.get(key)
            return est.mean if est is not None and est.count >= min_samples else None

    # ---- answers ---------------------------------------------------------------------
    def lookup(self, model_ref: str, batch_size: int, gpu_type: str, workload: str,
               ) -> tuple[float, int] | None:
        """The alone estimate ``(util_percent, samples)`` (the core's ``ObservedFn``)."""
        with self._lock:
            est = self._alone.get((model_ref, batch_size, workload, gpu_type))
            return None if est is None else (round(est.mean, 2), est.count)

    def view(self) -> dict[str, Any]:
        """For ``/v1/state``: entry counts and the estimates, alone and co-located."""
        with self._lock:
            return {"samples_total": self.samples_total,
                    "alone": [_entry(k, e) for k, e in sorted(self._alone.items())],
                    "colocated": [_entry(k, e) for k, e in sorted(self._colocated.items())]}

    # ---- persistence -----------------------------------------------------------------
    def to_document(self) -> dict[str, Any]:
        """The JSON document persisted in the ConfigMap."""
        doc = self.view()
        return {"version": DOCUMENT_VERSION, "alone": doc["alone"], "colocated": doc["colocated"]}

    def load_document(self, doc: Any) -> int:
        """Replace the estimates by a persisted document; returns entries loaded.

        A document of another version or shape is refused with ValueError (the
        caller logs it and starts empty: learning again beats trusting garbage).
        """
        if not isinstance(doc, Mapping) or doc.get("version") != DOCUMENT_VERSION:
            raise ValueError(f"learning document: version must be {DOCUMENT_VERSION}")
        tables: dict[str, dict[Key, Estimate]] = {}
        for name in ("alone", "colocated"):
            rows = doc.get(name) or []
            if not isinstance(rows, list):
                raise ValueError(f"learning document: {name} must be a list")
            tables[name] = dict(_parse_entry(r, f"{name}[{i}]") for i, r in enumerate(rows))
        with self._lock:
            self._alone, self._colocated = tables["alone"], tables["colocated"]
            self._bound(self._alone)
            self._bound(self._colocated)
            self.dirty = False
            return len(self._alone) + len(self._colocated)


def _key_of(p: Placement | None, node: str, gpu_index: int, product: str) -> Key | None:
    """The learning key of a placed training pod on this node's GPU, else None."""
    if p is None or p.node != node or gpu_index not in p.gpu_indices \
            or p.workload is not Workload.TRAINING:
        return None  # sessions run inside the GPU's server: their processes are not theirs
    ann = dict(p.annotations)
    model = ann.get(MODEL)
    if not model:
        return None
    batch_text = ann.get(BATCH_SIZE, "")
    batch = int(batch_text) if batch_text.isdigit() else DEFAULT_BATCH[p.workload.value]
    return (model, batch, p.workload.value, gpu_type_of(product))


def _entry(k: Key, e: Estimate) -> dict[str, Any]:
    return {"model": k[0], "batch_size": k[1], "workload": k[2], "gpu_type": k[3],
            "util_percent": round(e.mean, 3), "stddev_percent": round(e.stddev, 3),
            "samples": e.count, "updated_at": round(e.updated_at, 3)}


def _parse_entry(row: Any, path: str) -> tuple[Key, Estimate]:
    try:
        key = (str(row["model"]), int(row["batch_size"]), str(row["workload"]),
               str(row["gpu_type"]))
        mean, sd = float(row["util_percent"]), float(row["stddev_percent"])
        count, at = int(row["samples"]), float(row["updated_at"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"learning document: {path}: {exc!r}") from None
    if key[2] not in DEFAULT_BATCH or not (0 <= mean <= 100 and 0 <= sd <= 100 and count >= 1
                                            and key[1] >= 1 and math.isfinite(at)):
        raise ValueError(f"learning document: {path}: out of range")
    return key, Estimate(mean, sd * sd, count, at)


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
                 wall_clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.store = ObservationStore(cfg.ewma_alpha, cfg.max_entries, wall_clock)
        self.curves = CurveLearner(CurveGuards(
            cfg.curve_min_points, cfg.curve_max_step, cfg.curve_outlier_mads,
            cfg.curve_refit_interval_seconds), wall_clock)
        self.prior = prior
        """The configured curve of a GPU type: where its first refit starts from."""
        self._overlay = LearnedPolicy(self.curves)
        self.persistence = persistence
        self._may_persist = may_persist
        self._clock = clock
        self._last_save = -math.inf
        self._save_lock = threading.Lock()

    def start(self) -> None:
        """Reload what an earlier leader persisted; a bad document is logged and skipped."""
        if self.persistence is None:
            return
        try:
            doc = self.persistence.load()
            loaded = 0 if doc is None else self.store.load_document(doc)
            if doc is not None and doc.get("curves") is not None:  # older documents have none
                loaded += self.curves.load_document(doc["curves"])
        except Exception as exc:  # learning restarts from zero; placement must not stop
            get_logger().warning("learning: cannot reload persisted observations",
                                 extra={"error": repr(exc)})
            return
        get_logger().info("learning: observations reloaded", extra={"entries": loaded})

    def knowledge(self, cfg: LearningConfig) -> UtilKnowledge:
        """What resolution uses: the alone estimates (when enabled) and the cold-start rule."""
        return UtilKnowledge(self.store.lookup if cfg.enabled else None, cfg.min_observations,
                             cfg.cold_start_util_percent)

    def observe(self, report: DecodedReport,
                placement_of: Callable[[str], Placement | None]) -> int:
        """Samples from one agent report, then a save when due; returns samples taken."""
        taken = 0
        points = SharedGpuPoints(self.curves, lambda key: self.store.trusted_alone(
            key, self.cfg.min_observations))
        for gpu, util, procs in zip(report.gpus, report.util_percent, report.processes,
                                    strict=False):
            taken += self.store.observe_gpu(report.node, gpu.index, gpu.product, util, procs,
                                            placement_of, points if self.cfg.curves else None)
        points.refit(self.prior)
        self.maybe_persist()
        return taken

    def policy(self, base: CostPolicy, cfg: LearningConfig) -> CostPolicy:
        """``base`` with the learned curves in place of its priors (when ``learning.curves``)."""
        return self._overlay(base, cfg.enabled and cfg.curves)

    def document(self) -> dict[str, Any]:
        """What is persisted: the estimates and the curves with their points."""
        return {**self.store.to_document(), "curves": self.curves.to_document()}

    def view(self) -> dict[str, Any]:
        """For ``/v1/state``: the estimates and the learned curves."""
        return {**self.store.view(), "curves": self.curves.view()}

    def maybe_persist(self, force: bool = False) -> bool:
        """Write the ConfigMap if this replica leads, something changed and it is due."""
        if self.persistence is None or not (self.store.dirty or self.curves.dirty) \
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
                get_logger().warning("learning: cannot persist observations",
                                     extra={"error": repr(exc)})
                return False
            self.store.dirty = self.curves.dirty = False
            return True


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
                  prior: Callable[[str], InterferenceCurve] | None = None) -> Learner:
    """The learner for ``source``: persisted in a ConfigMap when the source is Kubernetes.

    ``prior``: the configured curve of a GPU type (where curve refits start).
    """
    api = getattr(source, "api", None)
    persistence = None
    if cfg.configmap and api is not None and hasattr(api, "read_namespaced_config_map"):
        persistence = ConfigMapPersistence(api, cfg.namespace or own_namespace(), cfg.configmap)
    learner = Learner(cfg, persistence, may_persist,
                      prior=prior or (lambda _t: InterferenceCurve()))
    learner.start()
    return learner
