"""The predictor facade the extender calls: model reference -> utilisation and memory.

``Predictor.predict`` resolves the reference through the model store, extracts
graph features (cached by file digest), asks the trained XGBoost model for the
utilisation and estimates memory with the fitted overhead. Answers are cached by
(model digest, batch size, GPU type, workload).

``Prediction.source`` says where the numbers came from, e.g.
``xgboost:3fa2c1d0e9b7+mem:fitted``; ``+mem:no-overhead`` means no framework
overhead was fitted and the memory figure excludes it (a lower bound),
``,unresolved=N`` that N graph nodes kept unknown shapes (features are lower bounds),
and ``,simulated`` (right after the digest) that the model was trained on synthetic
rows from the profiler's ``sim:`` backend: a dry run, not a measurement.

Without trained artifacts the memory estimate still works (Horus Eq. 2 from the
graph, no framework overhead), so ``predict`` answers ``gpu_util_percent`` None
with the source ``unknown+mem:no-overhead``: the caller decides what an unknown
utilisation means (the extender's cold-start rule, or what it observed).

With ``gpu_type`` None or a GPU type the model was not trained on, the answer is
the largest prediction over the trained GPU types (under-predicting utilisation
causes the interference Horus is avoiding), and the source says ``gpu=max``.
"""

from __future__ import annotations

import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from predictor.errors import NoTrainedModel
from predictor.features import FeatureExtractor, GraphFeatures
from predictor.fetch import BackgroundFetcher
from predictor.memory import MemoryEstimate, estimate_memory
from predictor.model import features_row
from predictor.onnx_file import FeatureLimits
from predictor.store import ModelStore, StoreConfig
from predictor.training import TrainedArtifacts, load_artifacts

UNKNOWN_UTIL = "unknown"
"""Utilisation source of a prediction made without a trained utilisation model."""
FETCH_TIMEOUT_SECONDS = 5.0
"""Background fetches: a remote host silent this long fails the fetch."""
FETCH_DEADLINE_SECONDS = 60.0
"""Background fetches: the whole download must finish within this."""
FETCH_MAX_BYTES = 512 * 1024 * 1024
"""Background fetches: larger models are refused (put them in the model store)."""


@dataclass(frozen=True)
class Prediction:
    """Predicted GPU utilisation (percent) and memory (MiB) of one job."""

    gpu_util_percent: float | None
    """None when no trained utilisation model covers the request (memory is still known)."""
    gpu_mem_mib: float
    source: str


class Predictor:
    """Resolve, extract, predict; thread-safe and cached."""

    def __init__(
        self,
        artifacts: TrainedArtifacts | None = None,
        store: ModelStore | None = None,
        extractor: FeatureExtractor | None = None,
        framework: str = "pytorch",
        optimizer: str = "adam",
        cache_size: int = 4096,
        fetcher: BackgroundFetcher | None = None,
    ):
        self.artifacts = artifacts
        self.store = store or ModelStore()
        self.extractor = extractor or FeatureExtractor()
        self.framework = framework
        self.optimizer = optimizer
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, Prediction] = OrderedDict()
        self._digests: OrderedDict[str, str] = OrderedDict()
        """Reference -> sha256 of the file it last resolved to (``known_digest``)."""
        self._lock = threading.Lock()
        self.fetcher = fetcher
        """Remote references go through it (never blocking the caller); None: fetched inline."""

    @classmethod
    def from_dirs(
        cls,
        artifacts_dir: Path | None,
        store_root: Path | None = None,
        limits: FeatureLimits | None = None,
        background_fetch: bool = False,
        allowed_sources: tuple[str, ...] | None = None,
    ) -> Predictor:
        """Load artifacts if ``artifacts_dir`` has them (else predictions carry memory only).

        ``background_fetch`` (servers): remote references are downloaded off the
        caller's thread with a short timeout and deadline (:mod:`predictor.fetch`),
        from ``allowed_sources`` only (URL prefixes; None: any), and without a store
        root local paths are refused (``predictor.store.NO_STORE``).
        """
        artifacts = None
        if artifacts_dir is not None:
            try:
                artifacts = load_artifacts(artifacts_dir)
            except NoTrainedModel:
                artifacts = None
        if not background_fetch:
            store = ModelStore(StoreConfig(root=store_root))
            return cls(artifacts, store, FeatureExtractor(limits))
        # Servers mount the model store read-only: downloads go to their own temp dir.
        store = ModelStore(StoreConfig(root=store_root, timeout_seconds=FETCH_TIMEOUT_SECONDS,
                                       deadline_seconds=FETCH_DEADLINE_SECONDS,
                                       max_download_bytes=FETCH_MAX_BYTES,
                                       allowed_sources=allowed_sources,
                                       local_files=False,
                                       cache_dir=Path(tempfile.gettempdir()) / "tandem-models"))
        return cls(artifacts, store, FeatureExtractor(limits), fetcher=BackgroundFetcher(store))

    def features(self, model_ref: str, batch_size: int) -> GraphFeatures:
        """Graph features of the referenced model at ``batch_size``."""
        path = (self.fetcher.resolve(model_ref) if self.fetcher is not None
                else self.store.resolve(model_ref))
        features = self.extractor.extract(path, batch_size)
        with self._lock:
            self._digests[model_ref] = features.digest
            self._digests.move_to_end(model_ref)
            while len(self._digests) > self.cache_size:
                self._digests.popitem(last=False)
        return features

    def known_digest(self, model_ref: str) -> str | None:
        """The sha256 of the file ``model_ref`` last resolved to, without any I/O; None
        before it was resolved (online learning keys its estimates by it)."""
        with self._lock:
            return self._digests.get(model_ref)

    def memory(self, features: GraphFeatures, workload: str) -> MemoryEstimate:
        """Memory estimate with the fitted overhead for this framework, if any."""
        overheads = self.artifacts.overheads if self.artifacts else {}
        return estimate_memory(
            features, workload, overheads.get((self.framework, workload)), self.optimizer
        )

    def estimate_memory(self, model_ref: str, batch_size: int, workload: str) -> MemoryEstimate:
        """Memory alone (needs no utilisation model; ``overhead_source`` says if fitted)."""
        return self.memory(self.features(model_ref, batch_size), workload)

    def predict(
        self, model_ref: str, batch_size: int, gpu_type: str | None, workload: str
    ) -> Prediction:
        """Utilisation and memory of ``model_ref`` at ``batch_size`` on ``gpu_type``."""
        if workload not in ("training", "inference"):
            raise ValueError(f"workload must be training or inference, got {workload!r}")
        # Without a trained model the graph is still read: its memory estimate places
        # the pod on day one (remote models are fetched off the request path).
        features = self.features(model_ref, batch_size)
        key = (features.digest, batch_size, gpu_type, workload)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        mem = self.memory(features, workload)
        mem_note = "fitted" if mem.overhead_source == "fitted" else "no-overhead"
        # unresolved shapes mean FLOPs/bytes are lower bounds: say so rather than hide it
        shape_note = f",unresolved={features.unresolved_nodes}" if features.unresolved_nodes else ""
        if self.artifacts is None:
            result = Prediction(None, round(mem.total_mib, 3),
                                f"{UNKNOWN_UTIL}{shape_note}+mem:{mem_note}")
        else:
            util, gpu_note = self._utilisation(features, gpu_type, workload)
            source = f"{self.artifacts.source}{gpu_note}{shape_note}+mem:{mem_note}"
            result = Prediction(round(util, 3), round(mem.total_mib, 3), source)
        with self._lock:
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return result

    def _utilisation(
        self, features: GraphFeatures, gpu_type: str | None, workload: str
    ) -> tuple[float, str]:
        assert self.artifacts is not None
        types = self.artifacts.gpu_types
        if gpu_type in types:
            row = features_row(features, workload, gpu_type, types)
            return float(self.artifacts.model.predict(np.array([row]))[0]), ""
        rows = [features_row(features, workload, g, types) for g in types]
        return float(self.artifacts.model.predict(np.array(rows)).max()), ",gpu=max"
