"""Utilisation the cluster observed, as ``training_data/`` rows.

The extender's learning document (what the leader persists in its ConfigMap,
``observations.json``, and what ``GET /v1/state`` shows under ``learning``) holds
per (model, batch size, workload, GPU type) a running estimate of the model's
GPU utilisation *alone* on that GPU type, from the agents' NVML samples. This
module turns its ``alone`` entries into ``observed.csv`` rows, one directory per
GPU product as the rest of ``training_data/``:

``observed.csv``  model (the pod's ``tandem.io/model`` reference, the last one
    seen for the file), workload, batch_size, gpu_product, util_mean_percent (the
    estimate), util_stddev_percent (spread of the samples), n_samples (agent
    reports that fed it), updated_at (unix seconds of the last sample),
    model_digest (sha256 of the model file, empty when the extender keyed the
    estimate by reference because it never resolved the file).

These are fleet measurements of utilisation only: no step time or framework
memory, which ``isolated.csv`` requires, so they sit beside it rather than in it.
``tandem predictor train`` reads them as extra training rows
(:func:`predictor.training.build_table`).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from contracts.learningdoc import LearningDocumentError, decode_entries
from contracts.state import StateDocumentError, decode_state

OBSERVED_FILE = "observed.csv"
OBSERVED_COLUMNS: tuple[str, ...] = (
    "model", "workload", "batch_size", "gpu_product", "util_mean_percent",
    "util_stddev_percent", "n_samples", "updated_at", "model_digest",
)
_SAFE_DIR = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


ObservationDocumentError = LearningDocumentError
"""The learning document (or an ``observed.csv``) does not have the expected shape."""


def observed_rows(doc: Any, min_samples: int = 1) -> list[dict[str, Any]]:
    """``observed.csv`` rows from a learning document (or a ``/v1/state`` document)."""
    if isinstance(doc, Mapping) and "nodes" in doc:  # GET /v1/state: under "learning"
        try:
            doc = decode_state(doc).learning
        except StateDocumentError as exc:
            raise ObservationDocumentError(f"not a /v1/state document: {exc}") from None
        if doc is None:
            raise ObservationDocumentError(
                "this /v1/state answer has no 'learning': it was read without the agent token")
    if not isinstance(doc, Mapping) or not isinstance(doc.get("alone"), list):
        raise ObservationDocumentError("expected a learning document with an 'alone' list")
    rows = []
    for i, e in enumerate(decode_entries(doc["alone"], "alone")):
        if not _SAFE_DIR.fullmatch(e.gpu_type):  # it names a directory of training_data/
            raise ObservationDocumentError(f"alone[{i}]: unsafe GPU type {e.gpu_type!r}")
        if e.samples >= min_samples:
            rows.append({"model": e.reference or e.model, "workload": e.workload,
                         "batch_size": e.batch_size, "gpu_product": e.gpu_type,
                         "util_mean_percent": e.util_percent,
                         "util_stddev_percent": e.stddev_percent, "n_samples": e.samples,
                         "updated_at": e.updated_at, "model_digest": e.digest})
    return sorted(rows, key=lambda r: (r["gpu_product"], r["model"], r["workload"],
                                       r["batch_size"]))


def write_observed(rows: list[dict[str, Any]], root: Path) -> list[Path]:
    """Write ``<root>/<gpu_product>/observed.csv`` per GPU product; returns the files."""
    by_product: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_product.setdefault(row["gpu_product"], []).append(row)
    written = []
    for product, group in sorted(by_product.items()):
        path = root / product / OBSERVED_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=OBSERVED_COLUMNS)
            writer.writeheader()
            writer.writerows(group)
        written.append(path)
    return written


def ensure_provenance(directory: Path, version: str) -> bool:
    """Write ``provenance.json`` for exported rows where the directory has none; True if so.

    Training refuses a directory without provenance; for fleet rows it says they were
    observed by agents in a cluster, not measured by a profiling campaign."""
    path = directory / "provenance.json"
    if path.exists():
        return False
    import datetime as dt
    import json

    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    path.write_text(json.dumps({
        "command": "tandem predictor export-observations", "tandem_version": version,
        "started_at": now, "finished_at": now,
        "hardware": {"gpu_product": directory.name, "driver_version": "various",
                     "cuda_version": "various", "cpu": "various"},
        "software": {}, "simulated": False,
        "notes": "observed.csv: utilisation that tandem's node agents observed in a cluster "
                 "(NVML per-process samples, running estimates), not a profiling campaign"},
        indent=2) + "\n", encoding="utf-8")
    return True


def read_observed(path: Path) -> list[dict[str, Any]]:
    """Read and check one ``observed.csv``; ObservationDocumentError lists every problem.

    Files written before ``model_digest`` existed read with it empty."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in OBSERVED_COLUMNS[:-1] if c not in (reader.fieldnames or [])]
        if missing:
            raise ObservationDocumentError(f"{path}: missing columns {', '.join(missing)}")
        raw = list(reader)
    rows, problems = [], []
    for i, r in enumerate(raw, start=1):
        try:
            row = {"model": r["model"], "workload": r["workload"],
                   "batch_size": int(r["batch_size"]), "gpu_product": r["gpu_product"],
                   "util_mean_percent": float(r["util_mean_percent"]),
                   "util_stddev_percent": float(r["util_stddev_percent"]),
                   "n_samples": int(r["n_samples"]), "updated_at": float(r["updated_at"]),
                   "model_digest": r.get("model_digest") or ""}
        except (TypeError, ValueError) as exc:
            problems.append(f"{path.name}: row {i}: {exc}")
            continue
        if not row["model"] or row["workload"] not in ("training", "inference") \
                or row["batch_size"] < 1 or not 0 <= row["util_mean_percent"] <= 100:
            problems.append(f"{path.name}: row {i}: out of range")
            continue
        rows.append(row)
    if problems:
        raise ObservationDocumentError("; ".join(problems))
    return rows


FEATURE_KEYS = ("flops", "params_bytes", "activations_bytes", "peak_activation_bytes",
                "op_counts")
Featurise = Callable[[str, int], Any]
"""(model reference, batch size) -> GraphFeatures, or None when the file cannot be read."""


def _stem(model: str) -> str:
    name = model.rstrip("/").rsplit("/", 1)[-1]
    return name[: -len(".onnx")] if name.endswith(".onnx") else name


def observed_training_rows(datasets: Sequence[Any], featurise: Featurise | None = None,
                           ) -> tuple[list[dict[str, Any]], int]:
    """Observed rows as training rows (``isolated.csv`` fields) and how many were skipped.

    An observed row needs the graph features of its model at its batch size: from a
    profiled ``ok`` row of the same model (by name or file stem), workload and batch
    size on any GPU (features do not depend on the GPU; the row's family comes with
    them), else from ``featurise`` (reading the model file). Rows with neither are
    skipped (counted, so the model card says how many fleet rows could not be used).
    """
    donors: dict[tuple[str, str, int], dict[str, Any]] = {}
    for ds in datasets:
        for r in ds.isolated:
            if r["status"] == "ok" and r["flops"] is not None:
                for name in {r["model"], _stem(r["model"])}:
                    donors.setdefault((name, r["workload"], r["batch_size"]), r)
    rows, skipped = [], 0
    for ds in datasets:
        for o in getattr(ds, "observed", ()):
            donor = donors.get((o["model"], o["workload"], o["batch_size"])) or donors.get(
                (_stem(o["model"]), o["workload"], o["batch_size"]))
            if donor is not None:
                features = {k: donor[k] for k in FEATURE_KEYS}
                family = donor["family"]
            else:
                found = featurise(o["model"], o["batch_size"]) if featurise else None
                if found is None:
                    skipped += 1
                    continue
                features = {k: getattr(found, k) for k in FEATURE_KEYS}
                family = f"fleet:{_stem(o['model'])}"
            rows.append({**features, "model": o["model"], "family": family,
                         "workload": o["workload"], "batch_size": o["batch_size"],
                         "gpu_product": ds.gpu_product, "status": "ok",
                         "util_mean_percent": o["util_mean_percent"]})
    return rows, skipped


def local_featurise() -> Featurise:
    """Features of local model files and already-downloaded remote ones (never fetches)."""
    from predictor.features import FeatureExtractor
    from predictor.store import ModelStore

    store, extractor = ModelStore(), FeatureExtractor()

    def featurise(model: str, batch_size: int) -> Any:
        try:
            path = store.cached(model) if store.is_remote(model) else store.resolve(model)
            return None if path is None else extractor.extract(path, batch_size)
        except Exception:  # unreadable, refused or not an ONNX graph: the row is skipped
            return None
    return featurise
