"""Errors of the predictor, as one small hierarchy callers match on by type and fields.

::

    PredictorError
     ├── ModelRejected      the model file is hostile or broken (reason enum + limit); do not retry
     ├── ModelUnavailable   the reference could not be fetched (network, missing file); may retry
     ├── NoTrainedModel     no utilisation model / overhead for this request; fall back to
     │                      reservations or user annotations
     └── ProfileNotFound    no batching profile for (model, gpu_type)
"""

from __future__ import annotations

import enum


class PredictorError(Exception):
    """Base of every error the predictor raises on purpose."""


class RejectReason(enum.Enum):
    """Why a model was refused; stable names for events and logs."""

    TOO_LARGE = "too_large"
    DECODE_ERROR = "decode_error"
    EXTERNAL_DATA_OUTSIDE = "external_data_outside"
    EXTERNAL_DATA_MISSING = "external_data_missing"
    CYCLIC_GRAPH = "cyclic_graph"
    MALFORMED_GRAPH = "malformed_graph"
    BAD_REFERENCE = "bad_reference"
    PATH_OUTSIDE_STORE = "path_outside_store"
    TOO_MANY_NODES = "too_many_nodes"


class ModelRejected(PredictorError):
    """A hostile or broken model: ``reason`` says which check failed, ``limit`` its bound."""

    def __init__(
        self, reason: RejectReason, detail: str, limit: float | None = None, model: str = ""
    ):
        self.reason = reason
        self.detail = detail
        self.limit = limit
        self.model = model
        where = f"{model}: " if model else ""
        bound = f" (limit {limit:g})" if limit is not None else ""
        super().__init__(f"{where}{reason.value}: {detail}{bound}")


class ModelUnavailable(PredictorError):
    """The model reference could not be read right now (missing file, network error)."""


class ModelNotFound(ModelUnavailable):
    """No model file at the reference (a mistake in the input, not a failure to read)."""


class NoTrainedModel(PredictorError):
    """No trained artifact covers this request (``what`` names the missing piece)."""

    def __init__(self, what: str, detail: str = ""):
        self.what = what
        super().__init__(f"no trained {what}" + (f": {detail}" if detail else ""))


class ProfileNotFound(PredictorError, KeyError):
    """No batching profile for ``(model, gpu_type)``; ``known`` lists what exists."""

    def __init__(self, model: str, gpu_type: str, known: tuple[tuple[str, str], ...] = ()):
        self.model, self.gpu_type, self.known = model, gpu_type, known
        listed = ", ".join(f"{m}@{g}" for m, g in known[:10]) or "none"
        super().__init__(
            f"no batching profile for model {model!r} on {gpu_type!r}; known: {listed}"
        )

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]
