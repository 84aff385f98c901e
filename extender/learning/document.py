"""The learning document's entries as the store keeps them, and their bounds.

The document's shape, encoder and decoder are the contract in
:mod:`contracts.learningdoc`; this module converts its entries to and from the
store's estimates, keys each by (model, batch size, workload, GPU type, GPU count),
and bounds what a pod owner can make it hold: a ``tandem.io/model`` reference
longer than :data:`MAX_REFERENCE_CHARS` is keyed by its hash and stored shortened.
Entries of older documents (no ``seconds``, ``pods``, ``gpus``) read as one second
per sample, one pod, one GPU.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from contracts.learningdoc import (
    DIGEST_PREFIX,
    DOCUMENT_VERSION,
    MAX_GPUS,
    LearnedEntry,
    decode_document,
    encode_entry,
)
from extender.learning.estimate import Estimate

__all__ = ["DIGEST_PREFIX", "DOCUMENT_VERSION", "MAX_GPUS", "Key", "entry", "entry_text",
           "full_key", "learned", "parse_tables", "short_key", "shorten"]

MAX_REFERENCE_CHARS = 256
"""A longer ``tandem.io/model`` reference is keyed by its hash and stored shortened, so no
pod owner can grow the learning document with one long name."""
HASHED_PREFIX = "ref-sha256:"
Key = tuple[str, int, str, str, int]
"""(model digest ``sha256:<hex>`` or reference, batch size, workload, GPU type, the pod's
GPU count): a data-parallel pod's GPU idles at each gradient exchange, so it is learned
apart from the same model on one GPU."""


def learned(k: Key, e: Estimate) -> LearnedEntry:
    """The contract's entry of one estimate."""
    return LearnedEntry(k[0], k[1], k[2], k[3], e.mean, e.stddev, e.count, e.updated_at,
                        e.reference or k[0], gpus=k[4], seconds=e.seconds, pods=e.pods,
                        namespaces=e.namespaces, used_at=e.used_at)


def entry(k: Key, e: Estimate) -> dict[str, Any]:
    """One estimate as the document (and ``/v1/state``) writes it."""
    return encode_entry(learned(k, e))


def entry_text(row: Mapping[str, Any]) -> str:
    """One entry as the persisted document writes it (its size counts against the budget)."""
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


def parse_tables(doc: Any) -> dict[str, dict[Key, Estimate]]:
    """The ``alone`` and ``colocated`` tables of a document as estimates; ValueError (the
    contract's ``LearningDocumentError``) names what is wrong."""
    tables: dict[str, dict[Key, Estimate]] = {}
    for name, rows in decode_document(doc).items():
        table: dict[Key, Estimate] = {}
        for i, e in enumerate(rows):
            if len(e.model) > MAX_REFERENCE_CHARS:
                raise ValueError(f"learning document: {name}[{i}]: model key too long")
            seconds = e.seconds if e.seconds else float(e.samples)  # older: 1 s a sample
            table[(e.model, e.batch_size, e.workload, e.gpu_type, e.gpus)] = Estimate(
                e.util_percent, e.stddev_percent ** 2, e.samples, e.updated_at,
                shorten(e.reference), e.used_at if e.used_at is not None else e.updated_at,
                synced=e.samples, seconds=seconds, synced_seconds=seconds,
                pods=1 if e.pods is None else e.pods, namespaces=e.namespaces)
        tables[name] = table
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
    """A reference cut to :data:`MAX_REFERENCE_CHARS` (for people and export)."""
    return reference if len(reference) <= MAX_REFERENCE_CHARS \
        else reference[: MAX_REFERENCE_CHARS - 3] + "..."
