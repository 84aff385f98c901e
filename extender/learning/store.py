"""Per-model utilisation estimates from agent samples, keyed by model file digest.

A report becomes one *sample* per (placed training pod, GPU) (the rules are in
:mod:`extender.learning.learner`). Samples are keyed by (model, batch size, workload,
GPU type, the pod's GPU count) where *model* is the model file's digest, ``sha256:<hex>``, once the
extender has resolved the pod's ``tandem.io/model`` reference (the predictor
reads the file to estimate memory, so the digest is known from the first
scheduling of a model-only pod), and the reference itself before that (no
predictor, or a model still being fetched). So two pods that name the same ONNX
file by different references (a path and a URL, two paths to identical bytes)
share one estimate, and a changed file under the same reference starts a new
one. When a reference's digest becomes known, what was learned under the
reference is merged into the digest's estimate (weighted by sample counts) the
next time that reference is looked up or observed.

Agents report every second (NVML's 1 Hz sampling), so samples are weighed by time:
each sample stands for the seconds since its pod's previous report on that GPU
(at most :data:`MAX_SAMPLE_SECONDS`; reports closer than :data:`MIN_SAMPLE_SECONDS`
are dropped), whatever the cadence. Each pod's first ``warmup_seconds`` on a GPU
(data loading, compilation) are skipped. An estimate (:class:`Estimate`) is the
time-weighted mean over a horizon, with its variance, samples, seconds and pods;
resolution trusts it only after ``min_observations`` samples covering
``min_observed_seconds`` from ``min_pods`` pods (:class:`Trust`), and then uses
its mean plus ``spread_margin`` standard errors (one independent sample per minute). Samples
taken alone and co-located are kept apart; resolution uses the alone estimate.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from contracts.annotations import MODEL, read_bound_inputs
from contracts.gpus import GpuRef, holds
from extender.core import Placement, Workload, gpu_type_of
from extender.learning.document import (
    DIGEST_PREFIX,
    DOCUMENT_VERSION,
    MAX_GPUS,
    Key,
    entry,
    entry_text,
    full_key,
    parse_tables,
    short_key,
    shorten,
)
from extender.learning.estimate import MAX_NAMESPACE_CHARS, Estimate, Trust
from extender.state.reports import ReportedProcess, ReportedSession

MAX_SAMPLE_SECONDS = 300.0
"""Most time one sample stands for (a pod not reported for longer restarts from here)."""
MIN_SAMPLE_SECONDS = 0.5
"""Reports of one pod on one GPU closer than this are dropped (``rate-limited``)."""
MAX_TRACKED_PODS = 100_000
REJECT_REASONS = ("not-placed-here", "not-training", "no-model", "shared-no-per-process",
                  "per-process-not-shares", "not-finite", "warm-up", "rate-limited",
                  "gpu-type-not-in-inventory")
"""Why a reported process gave no sample (``tandem_learning_observations_rejected``)."""


class ObservationStore:
    """Per-(model, batch, workload, GPU type, GPUs) estimates, alone and co-located;
    thread-safe.

    ``digest_of``: the digest (hex) the extender resolved a reference to, or None
    when not known yet; it must not do I/O (it is called on the report path).
    """

    def __init__(self, trust: Trust = Trust(), max_entries: int = 2000,
                 wall_clock: Callable[[], float] = time.time,
                 digest_of: Callable[[str], str | None] | None = None):
        if max_entries < 1 or trust.horizon_seconds <= 0:
            raise ValueError("max_entries must be >= 1 and the horizon > 0")
        self.trust = trust
        self.max_entries = max_entries
        self._pods: OrderedDict[tuple[str, str, int], list[float]] = OrderedDict()
        self._gpu_ms: OrderedDict[tuple[str, int], float] = OrderedDict()
        """(session pod UID, GPU index) -> the server's GPU-time counter at its last report."""
        """(pod UID, node, GPU index) -> [first report, last report] (wall-clock seconds)."""
        self.clock = wall_clock
        self._digest_of = digest_of
        self._alone: dict[Key, Estimate] = {}
        self._colocated: dict[Key, Estimate] = {}
        self._undigested: set[str] = set()
        """References that key some entry (so a lookup scans only when one may migrate)."""
        self._lock = threading.Lock()
        self.samples_total = 0
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self.evicted = 0
        """Estimates dropped to keep the table or the persisted document within bounds."""
        self.last_change = 0.0
        """Mean absolute change of the estimates the last report moved (percentage points)."""
        self.dirty = False

    # ---- keys ------------------------------------------------------------------------
    def model_key(self, reference: str) -> str:
        """``sha256:<hex>`` when the reference's digest is known, else the reference.

        Entries learned under the reference are merged into the digest's first."""
        digest = self._digest_of(reference) if self._digest_of is not None else None
        if not digest:
            return short_key(reference)
        key = DIGEST_PREFIX + digest
        short = short_key(reference)
        with self._lock:
            if short not in self._undigested:
                return key
            self._undigested.discard(short)
            for table in (self._alone, self._colocated):
                for old in [k for k in table if k[0] == short]:
                    moved = table.pop(old)
                    target = table.setdefault((key, *old[1:]),
                                              Estimate(reference=shorten(reference)))
                    target.merge(moved)
                    self.dirty = True
        return key

    # ---- learning --------------------------------------------------------------------
    def add(self, key: tuple[Any, ...], util_percent: float, alone: bool, reference: str = "",
            seconds: float = 1.0, new_pod: bool = True, namespace: str = "") -> float:
        """One utilisation sample of ``key`` (0..100) covering ``seconds``; ``new_pod``: the
        first sample of its pod (per GPU) for this key. A key without a GPU count is a
        one-GPU pod's. Returns how far the estimate moved."""
        key = full_key(key)
        if not math.isfinite(util_percent):
            with self._lock:
                self.rejected["not-finite"] += 1
            return 0.0
        value = min(max(util_percent, 0.0), 100.0)
        with self._lock:
            table = self._alone if alone else self._colocated
            est = table.setdefault(key, Estimate())
            if not key[0].startswith(DIGEST_PREFIX):
                self._undigested.add(key[0])
            est.reference = shorten(reference or est.reference or key[0])
            est.pods += int(new_pod)
            est.add_namespace(namespace)
            moved = est.add(value, seconds, self.trust.horizon_seconds, self.clock())
            self.samples_total += 1
            self.dirty = True
            self._bound(table)
            return moved

    def _bound(self, table: dict[Key, Estimate]) -> None:
        while len(table) > self.max_entries:  # drop the least recently used
            del table[min(table, key=lambda k: table[k].used_at)]
            self.evicted += 1

    def fit_bytes(self, budget: int) -> int:
        """Evict the least recently used estimates (both tables) until their entries fit
        ``budget`` bytes of the persisted document; returns how many were evicted."""
        with self._lock:
            rows = [(e.used_at, name, k, len(entry_text(entry(k, e))) + 1)
                    for name, table in (("alone", self._alone), ("colocated", self._colocated))
                    for k, e in table.items()]
            total = sum(r[3] for r in rows)
            dropped = 0
            for _, name, k, size in sorted(rows, key=lambda r: r[0]):
                if total <= budget:
                    break
                del (self._alone if name == "alone" else self._colocated)[k]
                total -= size
                dropped += 1
            self.evicted += dropped
            return dropped

    def observe_gpu(self, node: str, gpus: Sequence[GpuRef], position: int, product: str,
                    gpu_util: float, processes: Sequence[ReportedProcess],
                    placement_of: Callable[[str], Placement | None],
                    colocated: Callable[[list[tuple[Key, float]], Any], None] | None = None,
                    moves: list[float] | None = None,
                    shared_pods: frozenset[str] = frozenset(),
                    figures_not_shares: bool = False) -> int:
        """Samples from GPU ``gpus[position]`` of one report (``gpus``: the node's GPUs as
        reported); returns how many were taken.

        ``colocated`` receives the shared GPU's ``(key, utilisation)`` per pod when
        every process on it is a placed pod's and has its own utilisation figure;
        ``moves`` collects how far each sample moved its estimate; ``shared_pods``: pods
        with a GPU shared elsewhere in the report (not alone, though alone here);
        ``figures_not_shares``: the GPU's per-process figures were set aside
        (:mod:`extender.learning.readings`), which is then the reason a shared pod gives none.
        """
        no_figures = "per-process-not-shares" if figures_not_shares else "shared-no-per-process"
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
        now = self.clock()
        gpu_index = gpus[position].index
        for uid, procs in sorted(by_pod.items()):
            found = self._key_of(placement_of(uid), node, gpus, position, product)
            if isinstance(found, str):
                self.reject(found)
                continue
            key, reference = found
            pod_alone = alone and uid not in shared_pods
            timing = self._elapsed(uid, node, gpu_index, now)
            if isinstance(timing, str):
                self.reject(timing)
                continue
            seconds, first = timing
            per_process = [p.util_percent for p in procs if p.util_percent is not None]
            if per_process:
                util = min(100.0, sum(per_process))
                if len(per_process) == len(procs):
                    shared.append((key, util))
            elif pod_alone and math.isfinite(gpu_util):
                util = gpu_util
            else:
                self.reject(no_figures)
                continue
            moved = self.add(key, util, pod_alone, reference, seconds, first,
                             _namespace_of(placement_of(uid)))
            if moves is not None:
                moves.append(moved)
            taken += 1
        if colocated is not None and not foreign and len(by_pod) >= 2 \
                and len(shared) == len(by_pod):
            colocated(shared, (node, gpu_index))
        return taken

    def observe_sessions(self, node: str, gpus: Sequence[GpuRef], position: int, product: str,
                         sessions: Sequence[ReportedSession],
                         placement_of: Callable[[str], Placement | None]) -> int:
        """Samples of best-effort inference sessions from their server's GPU time.

        The server counts the GPU time each session used; between two reports of one
        session its utilisation is the counter's growth over the time between them (at
        most 100%). The first report of a session, a counter that went back (the server
        restarted) and each pod's warm-up give no sample. Returns samples taken."""
        now = self.clock()
        taken = 0
        gpu_index = gpus[position].index
        for s in sessions:
            p = placement_of(s.pod_uid)
            if p is None or p.node != node or not holds(p.gpus, gpus, position):
                self.reject("not-placed-here")
                continue
            model = dict(p.annotations).get(MODEL)
            if not p.best_effort or not model:
                self.reject("no-model" if p.best_effort else "not-training")
                continue
            with self._lock:
                last = self._gpu_ms.get((s.pod_uid, gpu_index))
                self._gpu_ms[(s.pod_uid, gpu_index)] = s.gpu_time_ms
                self._gpu_ms.move_to_end((s.pod_uid, gpu_index))
                while len(self._gpu_ms) > MAX_TRACKED_PODS:
                    self._gpu_ms.popitem(last=False)
            timing = self._elapsed(s.pod_uid, node, gpu_index, now)
            if isinstance(timing, str) or last is None or s.gpu_time_ms < last:
                self.reject(timing if isinstance(timing, str) else "warm-up")
                continue
            seconds, first = timing
            key = (self.model_key(model), read_bound_inputs(dict(p.annotations)).batch,
                   p.workload.value, gpu_type_of(product), 1)
            util = min(100.0, (s.gpu_time_ms - last) / (10.0 * seconds))
            self.add(key, util, True, model, seconds, first, _namespace_of(p))
            taken += 1
        return taken

    def _elapsed(self, uid: str, node: str, gpu_index: int, now: float,
                 ) -> tuple[float, bool] | str:
        """Seconds since this pod's last report on this GPU (capped) and whether this is its
        first counted sample; or why none is taken (``warm-up``, ``rate-limited``)."""
        with self._lock:
            track = self._pods.get((uid, node, gpu_index))
            if track is None:
                self._pods[(uid, node, gpu_index)] = [now, now, 0.0]
                while len(self._pods) > MAX_TRACKED_PODS:
                    self._pods.popitem(last=False)
                return "warm-up"  # and the time its first sample stands for is unknown
            self._pods.move_to_end((uid, node, gpu_index))
            first, last, counted = track
            gap = now - last
            if gap < MIN_SAMPLE_SECONDS:
                return "rate-limited"  # the time is counted by the report that follows
            track[1] = now
            if now - first < self.trust.warmup_seconds:
                return "warm-up"
            track[2] = 1.0
            return min(gap, MAX_SAMPLE_SECONDS), not counted

    def reject(self, reason: str, n: int = 1) -> None:
        """Count ``n`` reported processes that gave no sample for ``reason``."""
        with self._lock:
            self.rejected[reason] += n

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
        return (self.model_key(model), batch, p.workload.value, gpu_type_of(product),
                len(p.gpu_indices)), model

    def trusted_alone(self, key: tuple[Any, ...]) -> float | None:
        """The alone estimate of ``key`` once trusted (:class:`Trust`), else None."""
        with self._lock:
            est = self._alone.get(full_key(key))
            return est.mean if est is not None and self.trust.trusted(est) else None

    def trusted_items(self) -> list[tuple[Key, Estimate]]:
        """The trusted alone estimates by key (what the prior's bias is learned from)."""
        with self._lock:
            return [(k, e) for k, e in self._alone.items() if self.trust.trusted(e)]

    # ---- answers ---------------------------------------------------------------------
    def lookup(self, model_ref: str, batch_size: int, gpu_type: str, workload: str,
               gpus: int = 1, namespace: str | None = None, shared: bool = False,
               ) -> tuple[float, int] | None:
        """The alone estimate ``(util_percent, samples)`` (the core's ``ObservedFn``) of a
        pod of ``gpus`` GPUs in ``namespace``. Until the pod's own GPU count has a trusted
        estimate, a multi-GPU pod takes that of the largest smaller GPU count that has one:
        an upper bound of its per-GPU use (with more GPUs, each waits longer at the gradient
        exchanges), so never an optimistic guess. ``shared``: the co-located estimate
        instead, a floor of the alone one (its own GPU count only)."""
        key = (self.model_key(model_ref), batch_size, workload, gpu_type, gpus)
        if shared:
            return self._lookup_shared(key, namespace)
        with self._lock:
            est = self._alone.get(key)
            answer = None if est is None else self._answer(est, namespace)
            for fewer in range(min(gpus, MAX_GPUS + 1) - 1, 0, -1):
                if answer is not None and answer[1] > 0:
                    break
                other = self._alone.get((*key[:4], fewer))
                if other is not None and self._answer(other, namespace)[1] > 0:
                    est, answer = other, self._answer(other, namespace)
            if est is not None:
                est.used_at = self.clock()
            return answer

    def _lookup_shared(self, key: Key, namespace: str | None) -> tuple[float, int] | None:
        with self._lock:
            est = self._colocated.get(key)
            if est is None:
                return None
            est.used_at = self.clock()
            return self._answer(est, namespace)

    def _answer(self, est: Estimate, namespace: str | None) -> tuple[float, int]:
        """``(upper bound of the mean, samples)``; samples 0 while not trusted, or not for
        ``namespace`` (so resolution keeps the prediction)."""
        if not self.trust.trusted(est) or not est.serves(namespace):
            return round(est.mean, 2), 0
        return round(est.upper(self.trust.spread_margin), 2), est.count

    def trust_counts(self) -> dict[str, int]:
        """Alone estimates that resolution uses (``trusted``) and those still ``learning``."""
        with self._lock:
            trusted = sum(1 for e in self._alone.values() if self.trust.trusted(e))
            return {"trusted": trusted, "learning": len(self._alone) - trusted,
                    "colocated": len(self._colocated)}

    def view(self) -> dict[str, Any]:
        """For ``/v1/state``: entry counts and the estimates, alone and co-located."""
        with self._lock:
            return {"samples_total": self.samples_total,
                    "alone": [entry(k, e) for k, e in sorted(self._alone.items())],
                    "colocated": [entry(k, e) for k, e in sorted(self._colocated.items())]}

    # ---- persistence -----------------------------------------------------------------
    def to_document(self, empty: bool = False) -> dict[str, Any]:
        """The JSON document persisted in the ConfigMap (version 2); ``empty``: its frame."""
        if empty:
            return {"version": DOCUMENT_VERSION, "alone": [], "colocated": []}
        doc = self.view()
        return {"version": DOCUMENT_VERSION, "alone": doc["alone"], "colocated": doc["colocated"]}

    def load_document(self, doc: Any) -> int:
        """Replace the estimates by a persisted document (version 1 or 2); entries loaded.

        A document of another version or shape is refused with ValueError (the
        caller logs it and starts empty: learning again beats trusting garbage).
        """
        return self.merge_document(doc, replace=True)

    def merge_document(self, doc: Any, replace: bool = False) -> int:
        """Merge a persisted document into the estimates; entries in the result.

        Per key, the persisted estimate plus the samples this replica took since it
        last read or wrote the document (:meth:`Estimate.merged_with_persisted`); keys
        only this replica knows are kept. ``replace``: the document alone (start).
        """
        tables = parse_tables(doc)
        with self._lock:
            if not replace:
                for name, mine in (("alone", self._alone), ("colocated", self._colocated)):
                    theirs = tables[name]
                    for k, e in mine.items():
                        theirs[k] = e.merged_with_persisted(theirs[k]) if k in theirs else e
            self._alone, self._colocated = tables["alone"], tables["colocated"]
            self._undigested = {k[0] for t in tables.values() for k in t
                                if not k[0].startswith(DIGEST_PREFIX)}
            self._bound(self._alone)
            self._bound(self._colocated)
            self.dirty = not replace
            return len(self._alone) + len(self._colocated)

    def mark_synced(self) -> None:
        """Every sample is in the persisted document now (after a successful write)."""
        with self._lock:
            for table in (self._alone, self._colocated):
                for e in table.values():
                    e.synced, e.synced_seconds = e.count, e.seconds


def _namespace_of(p: Placement | None) -> str:
    """The namespace of a placed pod (``namespace/name``)."""
    return "" if p is None else p.pod.partition("/")[0][:MAX_NAMESPACE_CHARS]

