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
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

OBSERVED_FILE = "observed.csv"
OBSERVED_COLUMNS: tuple[str, ...] = (
    "model", "workload", "batch_size", "gpu_product", "util_mean_percent",
    "util_stddev_percent", "n_samples", "updated_at", "model_digest",
)
DIGEST_PREFIX = "sha256:"
_SAFE_DIR = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ObservationDocumentError(ValueError):
    """The learning document does not have the expected shape."""


def observed_rows(doc: Any, min_samples: int = 1) -> list[dict[str, Any]]:
    """``observed.csv`` rows from a learning document (or a ``/v1/state`` document)."""
    if isinstance(doc, Mapping) and isinstance(doc.get("learning"), Mapping):
        doc = doc["learning"]  # GET /v1/state carries the document under "learning"
    if not isinstance(doc, Mapping) or not isinstance(doc.get("alone"), list):
        raise ObservationDocumentError("expected a learning document with an 'alone' list")
    rows = []
    for i, e in enumerate(doc["alone"]):
        try:
            key = str(e["model"])  # the learning key: a file digest or a reference
            row = {"model": str(e.get("reference") or key), "workload": str(e["workload"]),
                   "batch_size": int(e["batch_size"]), "gpu_product": str(e["gpu_type"]),
                   "util_mean_percent": float(e["util_percent"]),
                   "util_stddev_percent": float(e["stddev_percent"]),
                   "n_samples": int(e["samples"]), "updated_at": float(e["updated_at"]),
                   "model_digest": key.removeprefix(DIGEST_PREFIX)
                   if key.startswith(DIGEST_PREFIX) else ""}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ObservationDocumentError(f"alone[{i}]: {exc!r}") from None
        if row["workload"] not in ("training", "inference") or row["batch_size"] < 1 \
                or not 0 <= row["util_mean_percent"] <= 100 \
                or not math.isfinite(row["util_stddev_percent"]) \
                or not _SAFE_DIR.fullmatch(row["gpu_product"]):
            raise ObservationDocumentError(f"alone[{i}]: out of range or unsafe GPU type")
        if row["n_samples"] >= min_samples:
            rows.append(row)
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
