"""What a model may be before the agent loads it: where it may come from, how big it
and its tensors may be, and the batches it is profiled at. Read by the executors, the
model check and the preparation worker alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelLimits:
    """Where models may come from and how big they may be."""

    store_root: Path | None = None
    """If set, model paths must resolve inside this directory."""
    max_model_bytes: int = 2 * 2**30
    max_input_bytes: int = 2**30
    """Declared input of one batch of ``max_batch`` samples (static dims only)."""
    max_tensor_bytes: int = 4 * 2**30
    """Largest tensor ONNX shape inference finds at ``max_batch`` (inputs and intermediates)."""
    profile_batches: tuple[int, ...] = (1, 2, 4, 8)
    max_batch: int = 64
    profile_repeats: int = 3
