"""The learning document: what the cluster taught, as the extender persists and shows it.

The leader persists it in its ``tandem-learning`` ConfigMap, ``GET /v1/state`` shows
its entries under ``learning``, and ``tandem predictor export-observations`` turns
them into ``observed.csv`` rows. One encoder and one decoder, here::

    {"version": 2,
     "alone":     [ENTRY, ...],   # the model's utilisation alone on a GPU of the type
     "colocated": [ENTRY, ...]}   # its utilisation beside others (a floor of the alone one)
    ENTRY = {"model": "sha256:<hex>" | REFERENCE, "reference": REFERENCE,
             "batch_size": B, "workload": "training" | "inference", "gpu_type": T,
             "util_percent": U, "stddev_percent": S, "samples": N, "updated_at": UNIX,
             # optional (absent in older documents):
             "gpus": G,                 # the pods' GPU count (absent: 1)
             "seconds": SECONDS,        # observed time the samples cover (absent: samples)
             "pods": P,                 # pods that contributed (absent: 1)
             "namespaces": [NS, ...],   # their namespaces, at most 8 (absent: unknown)
             "used_at": UNIX}           # last sample or lookup (absent: updated_at)

``model`` is the learning key: the model file's digest (``sha256:`` and the hex) when
the extender resolved the file, else the reference itself. Version 1 had no
``reference`` (the key was the reference) and still reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.annotations import WORKLOADS

DOCUMENT_VERSION = 2
READABLE_VERSIONS = (1, 2)
DIGEST_PREFIX = "sha256:"
TABLES = ("alone", "colocated")
MAX_GPUS = 64
MAX_NAMESPACES = 8

Key = tuple[str, int, str, str]
"""(model digest ``sha256:<hex>`` or reference, batch size, workload, GPU type)."""


class LearningDocumentError(ValueError):
    """The learning document (or one of its entries) does not have the contract's shape."""


@dataclass(frozen=True)
class LearnedEntry:
    """One estimate: its key, the reference last seen for it, and the running figures."""

    model: str
    batch_size: int
    workload: str
    gpu_type: str
    util_percent: float
    stddev_percent: float
    samples: int
    updated_at: float
    reference: str = ""
    gpus: int = 1
    seconds: float | None = None
    pods: int | None = None
    namespaces: tuple[str, ...] = ()
    used_at: float | None = None

    @property
    def key(self) -> Key:
        """The learning key."""
        return (self.model, self.batch_size, self.workload, self.gpu_type)

    @property
    def digest(self) -> str:
        """The model file's sha256 (hex) when the entry is keyed by it, else ``""``."""
        return self.model.removeprefix(DIGEST_PREFIX) if is_digest_key(self.model) else ""


def digest_key(digest_hex: str) -> str:
    """The learning key of a model file's sha256."""
    return DIGEST_PREFIX + digest_hex


def is_digest_key(model: str) -> bool:
    """Whether a learning key is a file digest (else it is a reference)."""
    return model.startswith(DIGEST_PREFIX)


def encode_entry(e: LearnedEntry) -> dict[str, Any]:
    """One entry as the document writes it."""
    return {"model": e.model, "reference": e.reference or e.model, "batch_size": e.batch_size,
            "workload": e.workload, "gpu_type": e.gpu_type,
            "util_percent": round(e.util_percent, 3),
            "stddev_percent": round(e.stddev_percent, 3),
            "samples": e.samples, "updated_at": round(e.updated_at, 3), "gpus": e.gpus,
            **({} if e.seconds is None else {"seconds": round(e.seconds, 3)}),
            **({} if e.pods is None else {"pods": e.pods}),
            **({"namespaces": list(e.namespaces)} if e.namespaces else {}),
            **({} if e.used_at is None else {"used_at": round(e.used_at, 3)})}


def decode_entry(row: Any, path: str) -> LearnedEntry:
    """One entry, every field typed and in range; LearningDocumentError naming ``path``."""
    try:
        e = LearnedEntry(
            model=str(row["model"]), batch_size=_int(row["batch_size"]),
            workload=str(row["workload"]), gpu_type=str(row["gpu_type"]),
            util_percent=float(row["util_percent"]),
            stddev_percent=float(row["stddev_percent"]),
            samples=_int(row["samples"]), updated_at=float(row["updated_at"]),
            reference=str(row.get("reference") or row["model"]),  # version 1: the key
            gpus=_int(row.get("gpus", 1)),
            seconds=None if row.get("seconds") is None else float(row["seconds"]),
            pods=None if row.get("pods") is None else _int(row["pods"]),
            namespaces=tuple(_namespaces(row.get("namespaces"))),
            used_at=None if row.get("used_at") is None else float(row["used_at"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LearningDocumentError(f"learning document: {path}: {exc!r}") from None
    if e.workload not in WORKLOADS or not (
            0 <= e.util_percent <= 100 and 0 <= e.stddev_percent <= 100 and e.samples >= 1
            and e.batch_size >= 1 and math.isfinite(e.updated_at)
            and 1 <= e.gpus <= MAX_GPUS and (e.pods is None or e.pods >= 0)
            and (e.seconds is None or 0 <= e.seconds < 1e12)
            and (e.used_at is None or math.isfinite(e.used_at))):
        raise LearningDocumentError(f"learning document: {path}: out of range")
    return e


def _namespaces(raw: Any) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_NAMESPACES \
            or not all(isinstance(n, str) and 0 < len(n) <= 63 for n in raw):
        raise ValueError(f"namespaces: at most {MAX_NAMESPACES} names, got {raw!r}")
    return sorted(set(raw))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def decode_entries(rows: Any, name: str) -> list[LearnedEntry]:
    """The entries of one table (``alone`` or ``colocated``); a missing table is empty."""
    rows = rows or []
    if not isinstance(rows, list):
        raise LearningDocumentError(f"learning document: {name} must be a list")
    return [decode_entry(r, f"{name}[{i}]") for i, r in enumerate(rows)]


def encode_document(alone: Sequence[LearnedEntry], colocated: Sequence[LearnedEntry],
                    ) -> dict[str, Any]:
    """The persisted document (version 2)."""
    return {"version": DOCUMENT_VERSION, "alone": [encode_entry(e) for e in alone],
            "colocated": [encode_entry(e) for e in colocated]}


def decode_document(doc: Any) -> dict[str, list[LearnedEntry]]:
    """A persisted document (version 1 or 2) as ``{"alone": [...], "colocated": [...]}``;
    LearningDocumentError for another version or shape. Other top-level keys (the
    learned curves, the learned pairs: extender.learning.interference) belong to their own
    readers."""
    if not isinstance(doc, Mapping) or doc.get("version") not in READABLE_VERSIONS:
        raise LearningDocumentError("learning document: version must be one of "
                                    f"{', '.join(map(str, READABLE_VERSIONS))}")
    return {name: decode_entries(doc.get(name), name) for name in TABLES}
