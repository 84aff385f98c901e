"""Validate a model file before the inference server loads it.

A session's model reference comes from a client, so it is hostile until checked.
The predictor owns the checks every reader shares, and the server uses them:
resolving the reference (``predictor.store``: store root, ``file://``, nothing
outside the store, no downloads), the size and decode limits and the
external-data policy (``predictor.onnx_file``). Their ``ModelRejected`` becomes
the server's 422 in one place (``errors.predictor_rejections``).

What stays here is what only the server needs:

- an ``.onnx`` file name (the API takes ``PATH.onnx``);
- weights inline: the graph goes to ONNX Runtime as bytes and is cut into
  segments, so tensors in side files would not come along;
- a graph the ONNX checker accepts (ONNX Runtime gets it next);
- exactly one graph input with a leading batch dimension and a NumPy element
  type (the inference API takes one tensor);
- size limits read from shapes alone, before any runtime session exists or any
  profiling runs: the declared input of a ``max_batch`` batch and the largest
  tensor ONNX shape inference finds (a ``ConstantOfShape`` of 40 GB is refused
  here, not met as ``MemoryError`` in the middle of serving).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from agent.inference.errors import ModelRejected, predictor_rejections
from predictor.errors import ModelRejected as PredictorRejected
from predictor.onnx_file import (
    FeatureLimits,
    check_external_data,
    external_tensors,
    load_model,
)
from predictor.shape_inference import largest_tensor
from predictor.store import ModelStore, StoreConfig

if TYPE_CHECKING:
    from agent.inference.preparation.limits import ModelLimits


def resolve_model_path(ref: str, limits: ModelLimits) -> Path:
    """The model's real path, inside the store if one is set; raises ModelRejected."""
    # Absolute paths stay accepted inside the store: clients name files they see mounted.
    store = ModelStore(
        StoreConfig(root=limits.store_root, allow_remote=False, absolute_inside_root=True)
    )
    with predictor_rejections(ref):
        path = store.resolve(ref)
    if path.suffix != ".onnx":
        raise ModelRejected(f"model {ref!r} is not an .onnx file")
    return path


def check_model_file(
    ref: str, limits: ModelLimits
) -> tuple[Any, str, np.dtype, tuple[int | None, ...]]:
    """Load and check; returns (ModelProto, input name, input dtype, per-sample shape)."""
    path = resolve_model_path(ref, limits)
    feature_limits = FeatureLimits(max_model_bytes=limits.max_model_bytes)
    with predictor_rejections(ref):
        model = load_model(path, feature_limits)
        # The shared policy first, so a hostile reference is reported as one.
        check_external_data(model, path.parent, feature_limits)
    external = external_tensors(model)
    if external:
        raise ModelRejected(
            f"{ref}: external tensor data is not accepted ({external[0].name}); "
            "the server needs the weights inside the .onnx file"
        )
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # ValidationError and friends
        raise ModelRejected(f"{ref} fails the ONNX checker: {exc}") from exc
    constants = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in constants]
    if len(inputs) != 1:
        raise ModelRejected(f"{ref}: the server needs exactly one graph input, found {len(inputs)}")
    tensor_type = inputs[0].type.tensor_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelRejected(f"{ref}: unsupported input element type") from exc
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    if not dims:
        raise ModelRejected(f"{ref}: the input needs a leading batch dimension")
    sample = tuple(dims[1:])
    check_sizes(ref, model, dtype, sample, limits)
    return model, inputs[0].name, dtype, sample


def check_sizes(
    ref: str, model: Any, dtype: np.dtype, sample: tuple[int | None, ...], limits: ModelLimits
) -> None:
    """Refuse (422, the limit named) a declared input or a tensor over the configured limits."""
    if all(d is not None for d in sample):
        per_sample = int(np.prod([int(d) for d in sample], dtype=np.int64)) * dtype.itemsize
        declared = per_sample * limits.max_batch
        if declared > limits.max_input_bytes:
            raise ModelRejected(
                f"{ref}: a batch of {limits.max_batch} declared inputs is {declared} bytes, "
                f"over the limit max_input_bytes={limits.max_input_bytes}",
                reason="too_large", limit="max_input_bytes", limit_bytes=limits.max_input_bytes,
                bytes=declared,
            )  # fmt: skip
    try:
        name, size = largest_tensor(model, limits.max_batch, ref)
    except PredictorRejected as exc:
        raise ModelRejected(f"model {ref!r}: {exc.reason.value}: {exc.detail}") from exc
    if size > limits.max_tensor_bytes:
        raise ModelRejected(
            f"{ref}: tensor {name!r} is {size} bytes at batch {limits.max_batch}, "
            f"over the limit max_tensor_bytes={limits.max_tensor_bytes}",
            reason="too_large", limit="max_tensor_bytes", limit_bytes=limits.max_tensor_bytes,
            tensor=name, bytes=size,
        )  # fmt: skip
