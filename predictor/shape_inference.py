"""Tensor shapes of an ONNX graph whose inputs are bound to a batch size.

ONNX shape inference with data propagation leaves shapes unknown behind shape
arithmetic (``Shape -> Gather -> Concat -> Reshape``); ``resolve_shapes`` folds
that arithmetic into constants (``predictor._fold``) and infers again, a bounded
number of passes. Large initializers are replaced by typed inputs first, so the
proto that inference sees stays small, and protos still over protobuf's 2 GB cap
are inferred through files. ``largest_tensor`` measures the biggest intermediate
tensor without running the graph.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from predictor.errors import ModelRejected, RejectReason
from predictor.onnx_file import tensor_bytes

_PROTO_SOFT_LIMIT = 1_500_000_000  # above this, infer shapes from a file (protobuf's 2 GB cap)
_FOLD_PASSES = 64  # bound on fold/infer rounds (one per dependent reshape chain)
_INLINE_KEEP_ELEMENTS = 64  # small initializers (shape constants) stay for data propagation


def largest_tensor(model: Any, batch_size: int, path: Path | str = "") -> tuple[str, int]:
    """(name, bytes) of the largest tensor ONNX shape inference finds at ``batch_size``.

    Reads shapes only: a graph that would build a huge tensor (``ConstantOfShape``
    of a constant shape, a declared input) is measured without running it. Tensors
    whose shape stays unknown are not counted. ``model`` is not modified.
    """
    import onnx

    from predictor import _graph

    work = onnx.ModelProto()
    work.CopyFrom(model)
    _graph.bind_inputs(work.graph, batch_size, {})
    weights = {t.name for t in work.graph.initializer}  # parameters, not intermediates
    order = _graph.topological_order(work.graph, str(path))
    shapes = resolve_shapes(work, order, Path(path))
    best = ("", 0)
    for name, (dtype, dims) in shapes.items():
        if dims is None or name in weights:
            continue
        size = tensor_bytes(dtype, dims)
        if size > best[1]:
            best = (name, size)
    return best


def resolve_shapes(model: Any, order: list[Any], path: Path) -> dict[str, Any]:
    """Name -> (elem_type, dims) of every value of ``model`` (inputs already bound).

    Infers shapes, then folds shape arithmetic into constants and infers again
    (bounded). ``order`` is the graph's nodes in topological order. Initializers
    above a few elements become typed inputs first, in place: inference needs
    their types, not their bytes.
    """
    import onnx
    from onnx import numpy_helper

    from predictor import _fold, _graph

    model = _graph.strip_large_initializers(model, _INLINE_KEEP_ELEMENTS)
    shapes = _graph.value_shapes(_infer_shapes(model, path).graph)
    initial = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            initial[tensor.name] = numpy_helper.to_array(tensor)
    work = None
    unresolved = _count_unresolved(order, shapes)
    for _ in range(_FOLD_PASSES):
        if unresolved == 0:
            break
        values = _fold.fold(order, initial, shapes)
        if work is None:
            work = onnx.ModelProto()
            work.CopyFrom(model)
        _fold.replace_with_constants(work.graph, values)
        shapes = _graph.value_shapes(_infer_shapes(work, path).graph)
        # each pass can unlock the next block's reshape; stop when a pass gains nothing
        before, unresolved = unresolved, _count_unresolved(order, shapes)
        if unresolved >= before:
            break
    return shapes


def _count_unresolved(order: list[Any], shapes: dict[str, Any]) -> int:
    return sum(1 for n in order for o in n.output if o and shapes.get(o, (None, None))[1] is None)


def _infer_shapes(model: Any, path: Path) -> Any:
    """ONNX shape inference with data propagation; path-based for very large protos."""
    import onnx

    try:
        if model.ByteSize() < _PROTO_SOFT_LIMIT:
            return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "in.onnx"), os.path.join(tmp, "out.onnx")
            onnx.save_model(model, src)
            onnx.shape_inference.infer_shapes_path(src, dst, strict_mode=False, data_prop=True)
            return onnx.load_model(dst, load_external_data=False)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError) as exc:
        raise ModelRejected(
            RejectReason.MALFORMED_GRAPH, f"shape inference failed: {exc}", model=str(path)
        ) from exc
