"""Validate a model file before anything loads it: path, size, graph, input contract.

A session's model path comes from a client, so it is hostile until checked: it
must resolve inside the model store (when one is configured), stay under the size
limit, carry no external-data references, pass the ONNX checker and have exactly
one graph input (the inference API takes one tensor).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from agent.server.errors import ModelRejected

if TYPE_CHECKING:
    from agent.server.executors import ModelLimits


def resolve_model_path(ref: str, limits: ModelLimits) -> Path:
    """The model's real path, inside the store if one is set; raises ModelRejected."""
    raw = ref.removeprefix("file://")
    path = Path(raw)
    if limits.store_root is not None:
        root = limits.store_root.resolve()
        path = (root / path).resolve() if not path.is_absolute() else path.resolve()
        if not path.is_relative_to(root):
            raise ModelRejected(f"model path {ref!r} is outside the model store", limit=str(root))
    else:
        path = path.resolve()
    if path.suffix != ".onnx":
        raise ModelRejected(f"model {ref!r} is not an .onnx file")
    if not path.is_file():
        raise ModelRejected(f"model file {ref!r} does not exist")
    size = path.stat().st_size
    if size > limits.max_model_bytes:
        raise ModelRejected(f"model {ref!r} is {size} bytes", limit_bytes=limits.max_model_bytes)
    return path


def check_model_file(
    ref: str, limits: ModelLimits
) -> tuple[Any, str, np.dtype, tuple[int | None, ...]]:
    """Load and check; returns (ModelProto, input name, input dtype, per-sample shape)."""
    path = resolve_model_path(ref, limits)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf decode errors have several types
        raise ModelRejected(f"{ref} is not a readable ONNX model: {exc}") from exc
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise ModelRejected(f"{ref}: external tensor data is not accepted ({tensor.name})")
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
    return model, inputs[0].name, dtype, tuple(dims[1:])
