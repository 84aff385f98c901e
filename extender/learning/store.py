"""Per-model utilisation estimates from agent samples, keyed by model file digest.

A report becomes one *sample* per (placed training pod, GPU) (the rules are in
:mod:`extender.learning.learner`). Samples are keyed by (model, batch size, workload,
GPU type) where *model* is the model file's digest, ``sha256:<hex>``, once the
extender has resolved the pod's ``tandem.io/model`` reference (the predictor
reads the file to estimate memory, so the digest is known from the first
scheduling of a model-only pod), and the reference itself before that (no
predictor, or a model still being fetched). So two pods that name the same ONNX
file by different references (a path and a URL, two paths to identical bytes)
share one estimate, and a changed file under the same reference starts a new
one. When a reference's digest becomes known, what was learned under the
reference is merged into the digest's estimate (weighted by sample counts) the
next time that reference is looked up or observed.

Each estimate is a bounded running mean: the mean of the first ``1/alpha``
samples, then an exponentially weighted mean with weight ``alpha`` (it follows
a model whose behaviour drifts), with its variance and sample count. Samples
taken alone and co-located are kept apart; resolution uses the alone estimate.

Persisted document (``observations.json``), version 2: ``alone`` and
``colocated`` lists of entries ``{model, reference, batch_size, workload,
gpu_type, util_percent, stddev_percent, samples, updated_at}`` (``model`` the key:
a digest or a reference; ``reference`` the last reference seen for it). Version
1 documents (entries keyed by reference, no ``reference`` field) are read as
reference-keyed entries and migrate as above.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.annotations import MODEL, read_bound_inputs
from contracts.gpus import GpuRef, holds
from contracts.learningdoc import (
    Key,
    LearnedEntry,
    decode_document,
    digest_key,
    encode_document,
    encode_entry,
    is_digest_key,
)
from extender.core import Placement, Workload, gpu_type_of
from extender.state.reports import ReportedProcess

REJECT_REASONS = ("not-placed-here", "not-training", "no-model", "shared-no-per-process",
                  "not-finite")
"""Why a reported process gave no sample (``tandem_learning_observations_rejected``)."""


@dataclass
class Estimate:
    """A running estimate of one key's utilisation: mean, variance, sample count."""

    mean: float = 0.0
    var: float = 0.0
    count: int = 0
    updated_at: float = 0.0
    reference: str = ""
    """The last ``tandem.io/model`` reference seen for this key (for people and export)."""

    def add(self, value: float, alpha: float, now: float) -> float:
        """Fold one sample in (running mean first, EWMA once past ``1/alpha`` samples).

        Returns how far the mean moved (absolute, percentage points)."""
        self.count += 1
        weight = max(alpha, 1.0 / self.count)
        delta = value - self.mean
        self.mean += weight * delta
        self.var = (1 - weight) * (self.var + weight * delta * delta)
        self.updated_at = now
        return abs(weight * delta)

    def merge(self, other: Estimate) -> None:
        """Pool ``other`` (the same model learned under another key) into this one."""
        n = self.count + other.count
        if n == 0:
            return
        mean = (self.mean * self.count + other.mean * other.count) / n
        self.var = (self.count * (self.var + (self.mean - mean) ** 2)
                    + other.count * (other.var + (other.mean - mean) ** 2)) / n
        self.mean, self.count = mean, n
        self.updated_at = max(self.updated_at, other.updated_at)
        self.reference = self.reference or other.reference

    @property
    def stddev(self) -> float:
        """Spread of the samples around the estimate (percentage points)."""
        return math.sqrt(max(self.var, 0.0))


class ObservationStore:
    """Per-(model, batch, workload, GPU type) estimates, alone and co-located; thread-safe.

    ``digest_of``: the digest (hex) the extender resolved a reference to, or None
    when not known yet; it must not do I/O (it is called on the report path).
    """

    def __init__(self, alpha: float = 0.1, max_entries: int = 2000,
                 wall_clock: Callable[[], float] = time.time,
                 digest_of: Callable[[str], str | None] | None = None):
        if not 0 < alpha <= 1 or max_entries < 1:
            raise ValueError("alpha must be in (0, 1] and max_entries >= 1")
        self.alpha = alpha
        self.max_entries = max_entries
        self._clock = wall_clock
        self._digest_of = digest_of
        self._alone: dict[Key, Estimate] = {}
        self._colocated: dict[Key, Estimate] = {}
        self._undigested: set[str] = set()
        """References that key some entry (so a lookup scans only when one may migrate)."""
        self._lock = threading.Lock()
        self.samples_total = 0
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self.last_change = 0.0
        """Mean absolute change of the estimates the last report moved (percentage points)."""
        self.dirty = False

    # ---- keys ------------------------------------------------------------------------
    def model_key(self, reference: str) -> str:
        """``sha256:<hex>`` when the reference's digest is known, else the reference.

        Entries learned under the reference are merged into the digest's first."""
        digest = self._digest_of(reference) if self._digest_of is not None else None
        if not digest:
            return reference
        key = digest_key(digest)
        with self._lock:
            if reference not in self._undigested:
                return key
            self._undigested.discard(reference)
            for table in (self._alone, self._colocated):
                for old in [k for k in table if k[0] == reference]:
                    moved = table.pop(old)
                    target = table.setdefault((key, *old[1:]), Estimate(reference=reference))
                    target.merge(moved)
                    self.dirty = True
        return key

    # ---- learning --------------------------------------------------------------------
    def add(self, key: Key, util_percent: float, alone: bool, reference: str = "") -> float:
        """One utilisation sample of ``key`` (0..100); returns how far its estimate moved."""
        if not math.isfinite(util_percent):
            with self._lock:
                self.rejected["not-finite"] += 1
            return 0.0
        value = min(max(util_percent, 0.0), 100.0)
        with self._lock:
            table = self._alone if alone else self._colocated
            est = table.setdefault(key, Estimate())
            if not is_digest_key(key[0]):
                self._undigested.add(key[0])
            est.reference = reference or est.reference or key[0]
            moved = est.add(value, self.alpha, self._clock())
            self.samples_total += 1
            self.dirty = True
            self._bound(table)
            return moved

    def _bound(self, table: dict[Key, Estimate]) -> None:
        while len(table) > self.max_entries:  # drop the least recently observed
            del table[min(table, key=lambda k: table[k].updated_at)]

    def observe_gpu(self, node: str, gpus: Sequence[GpuRef], position: int, product: str,
                    gpu_util: float, processes: Sequence[ReportedProcess],
                    placement_of: Callable[[str], Placement | None],
                    colocated: Callable[[list[tuple[Key, float]]], None] | None = None,
                    moves: list[float] | None = None) -> int:
        """Samples from GPU ``gpus[position]`` of one report (``gpus``: the node's GPUs as
        reported); returns how many were taken.

        ``colocated`` receives the shared GPU's ``(key, utilisation)`` per pod when
        every process on it is a placed pod's and has its own utilisation figure;
        ``moves`` collects how far each sample moved its estimate.
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
            found = self._key_of(placement_of(uid), node, gpus, position, product)
            if isinstance(found, str):
                self._reject(found)
                continue
            key, reference = found
            per_process = [p.util_percent for p in procs if p.util_percent is not None]
            if per_process:
                util = min(100.0, sum(per_process))
                if len(per_process) == len(procs):
                    shared.append((key, util))
            elif alone and math.isfinite(gpu_util):
                util = gpu_util
            else:
                self._reject("shared-no-per-process")
                continue
            moved = self.add(key, util, alone, reference)
            if moves is not None:
                moves.append(moved)
            taken += 1
        if colocated is not None and not foreign and len(by_pod) >= 2 \
                and len(shared) == len(by_pod):
            colocated(shared)
        return taken

    def _reject(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    def _key_of(self, p: Placement | None, node: str, gpus: Sequence[GpuRef], position: int,
                product: str) -> tuple[Key, str] | str:
        """The learning key and reference of a placed training pod on this GPU, else why not."""
        # UUID first, as the GPU table finds a placement's GPUs: after a renumbering the
        # index a pod recorded names another GPU.
        if p is None or p.node != node or not holds(p.gpus, gpus, position):
            return "not-placed-here"
        if p.workload is not Workload.TRAINING:
            return "not-training"  # sessions run inside the GPU's server: its processes
        ann = dict(p.annotations)
        model = ann.get(MODEL)
        if not model:
            return "no-model"
        batch = read_bound_inputs(ann).batch  # the codec's reader: the batch it was placed at
        return (self.model_key(model), batch, p.workload.value, gpu_type_of(product)), model

    def trusted_alone(self, key: Key, min_samples: int) -> float | None:
        """The alone estimate of ``key`` once it has ``min_samples`` samples, else None."""
        with self._lock:
            est = self._alone.get(key)
            return est.mean if est is not None and est.count >= min_samples else None

    # ---- answers ---------------------------------------------------------------------
    def lookup(self, model_ref: str, batch_size: int, gpu_type: str, workload: str,
               ) -> tuple[float, int] | None:
        """The alone estimate ``(util_percent, samples)`` (the core's ``ObservedFn``)."""
        key = (self.model_key(model_ref), batch_size, workload, gpu_type)
        with self._lock:
            est = self._alone.get(key)
            return None if est is None else (round(est.mean, 2), est.count)

    def lookup_shared(self, model_ref: str, batch_size: int, gpu_type: str, workload: str,
                      ) -> tuple[float, int] | None:
        """The co-located estimate ``(util_percent, samples)``: a floor of the alone one."""
        key = (self.model_key(model_ref), batch_size, workload, gpu_type)
        with self._lock:
            est = self._colocated.get(key)
            return None if est is None else (round(est.mean, 2), est.count)

    def trust_counts(self, min_samples: int) -> dict[str, int]:
        """Alone estimates that resolution uses (``trusted``) and those still ``learning``."""
        with self._lock:
            trusted = sum(1 for e in self._alone.values() if e.count >= min_samples)
            return {"trusted": trusted, "learning": len(self._alone) - trusted,
                    "colocated": len(self._colocated)}

    def view(self) -> dict[str, Any]:
        """For ``/v1/state``: entry counts and the estimates, alone and co-located."""
        with self._lock:
            return {"samples_total": self.samples_total,
                    "alone": [encode_entry(e) for e in _entries(self._alone)],
                    "colocated": [encode_entry(e) for e in _entries(self._colocated)]}

    # ---- persistence -----------------------------------------------------------------
    def to_document(self) -> dict[str, Any]:
        """The JSON document persisted in the ConfigMap (version 2)."""
        with self._lock:
            return encode_document(*(_entries(t) for t in (self._alone, self._colocated)))

    def load_document(self, doc: Any) -> int:
        """Replace the estimates by a persisted document (version 1 or 2); entries loaded.

        A document of another version or shape is refused with ValueError (the
        caller logs it and starts empty: learning again beats trusting garbage).
        """
        decoded = decode_document(doc)
        tables = {name: dict(_estimate(e) for e in rows) for name, rows in decoded.items()}
        with self._lock:
            self._alone, self._colocated = tables["alone"], tables["colocated"]
            self._undigested = {k[0] for t in tables.values() for k in t
                                if not is_digest_key(k[0])}
            self._bound(self._alone)
            self._bound(self._colocated)
            self.dirty = False
            return len(self._alone) + len(self._colocated)


def _entries(table: Mapping[Key, Estimate]) -> list[LearnedEntry]:
    return [LearnedEntry(*k, e.mean, e.stddev, e.count, e.updated_at, e.reference or k[0])
            for k, e in sorted(table.items())]


def _estimate(e: LearnedEntry) -> tuple[Key, Estimate]:
    return e.key, Estimate(e.util_percent, e.stddev_percent ** 2, e.samples, e.updated_at,
                           e.reference)
