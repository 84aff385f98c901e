"""The learning document: its entries, keys and their bounds.

Persisted document (``observations.json``), version 2: ``alone`` and
``colocated`` lists of entries ``{model, reference, batch_size, workload,
gpu_type, util_percent, stddev_percent, samples, updated_at}`` and, additively,
``used_at``, ``seconds``, ``pods``, ``namespaces`` and ``gpus`` (absent: 1) (``model``
the key: a digest or a reference, hashed past :data:`MAX_REFERENCE_CHARS`;
``reference`` the last reference seen for it, shortened). Version 1 documents
(entries keyed by reference, no ``reference`` field) are read as reference-keyed
entries and migrate as :mod:`extender.learning.store` describes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from extender.learning.estimate import MAX_NAMESPACE_CHARS, MAX_NAMESPACES, Estimate

DOCUMENT_VERSION = 2
READABLE_VERSIONS = (1, 2)
DEFAULT_BATCH = {"training": 32, "inference": 1}
DIGEST_PREFIX = "sha256:"
MAX_REFERENCE_CHARS = 256
"""A longer ``tandem.io/model`` reference is keyed by its hash and stored shortened, so no
pod owner can grow the learning document with one long name."""
HASHED_PREFIX = "ref-sha256:"
Key = tuple[str, int, str, str, int]
"""(model digest ``sha256:<hex>`` or reference, batch size, workload, GPU type, the pod's
GPU count): a data-parallel pod's GPU idles at each gradient exchange, so it is learned
apart from the same model on one GPU."""
MAX_GPUS = 64


def parse_tables(doc: Any) -> dict[str, dict[Key, Estimate]]:
    """The ``alone`` and ``colocated`` tables of a document; ValueError names what is wrong."""
    if not isinstance(doc, Mapping) or doc.get("version") not in READABLE_VERSIONS:
        raise ValueError("learning document: version must be one of "
                         f"{', '.join(map(str, READABLE_VERSIONS))}")
    tables: dict[str, dict[Key, Estimate]] = {}
    for name in ("alone", "colocated"):
        rows = doc.get(name) or []
        if not isinstance(rows, list):
            raise ValueError(f"learning document: {name} must be a list")
        tables[name] = dict(parse_entry(r, f"{name}[{i}]") for i, r in enumerate(rows))
    return tables


def full_key(key: tuple[Any, ...]) -> Key:
    """``key`` with its GPU count (1 when it has none: a one-GPU pod's)."""
    return key if len(key) == 5 else (*key, 1)  # type: ignore[return-value]


def short_key(reference: str) -> str:
    """The reference itself, or its hash when longer than :data:`MAX_REFERENCE_CHARS`."""
    if len(reference) <= MAX_REFERENCE_CHARS:
        return reference
    return HASHED_PREFIX + hashlib.sha256(reference.encode()).hexdigest()


def shorten(reference: str) -> str:
    return reference if len(reference) <= MAX_REFERENCE_CHARS \
        else reference[: MAX_REFERENCE_CHARS - 3] + "..."


def encode_entry(row: Mapping[str, Any]) -> str:
    """One entry as the persisted document writes it (its size counts against the budget)."""
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


def entry(k: Key, e: Estimate) -> dict[str, Any]:
    return {"model": k[0], "reference": e.reference or k[0], "batch_size": k[1],
            "workload": k[2], "gpu_type": k[3], "gpus": k[4],
            "util_percent": round(e.mean, 3), "stddev_percent": round(e.stddev, 3),
            "samples": e.count, "updated_at": round(e.updated_at, 3),
            "used_at": round(e.used_at, 3), "seconds": round(e.seconds, 3), "pods": e.pods,
            "namespaces": list(e.namespaces)}


def parse_entry(row: Any, path: str) -> tuple[Key, Estimate]:
    try:
        key = (str(row["model"]), int(row["batch_size"]), str(row["workload"]),
               str(row["gpu_type"]), int(row.get("gpus") or 1))  # older documents: 1 GPU
        mean, sd = float(row["util_percent"]), float(row["stddev_percent"])
        count, at = int(row["samples"]), float(row["updated_at"])
        reference = shorten(str(row.get("reference") or row["model"]))  # v1: the key itself
        used = float(row.get("used_at") or at)  # older documents: last sample
        seconds = float(row.get("seconds") or count)  # older documents: one second a sample
        pods = int(row.get("pods") or 1)
        namespaces = tuple(sorted({str(n)[:MAX_NAMESPACE_CHARS]
                                   for n in row.get("namespaces") or ()}))[:MAX_NAMESPACES]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"learning document: {path}: {exc!r}") from None
    if key[2] not in DEFAULT_BATCH or not (0 <= mean <= 100 and 0 <= sd <= 100 and count >= 1
                                            and key[1] >= 1 and math.isfinite(at)
                                            and math.isfinite(used) and pods >= 0
                                            and 0 < seconds < 1e12) \
            or len(key[0]) > MAX_REFERENCE_CHARS or not 1 <= key[4] <= MAX_GPUS:
        raise ValueError(f"learning document: {path}: out of range")
    return key, Estimate(mean, sd * sd, count, at, reference, used, synced=count,
                         seconds=seconds, synced_seconds=seconds, pods=pods,
                         namespaces=namespaces)
