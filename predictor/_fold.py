"""Constant folding of shape arithmetic, so that shape inference resolves dynamic reshapes.

Exporters compute reshape targets at run time (``Shape -> Gather -> Div -> Concat ->
Reshape``, ``chunk`` as computed ``Slice`` bounds, ``F.pad`` widths). ONNX's data
propagation covers only part of that; this pass evaluates such small integer
subgraphs with numpy from the shapes inferred so far, replaces their nodes by
``Constant`` nodes in the (light) inference copy, and lets inference run again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

_MAX_ELEMENTS = 4096  # shape tensors are tiny; anything bigger is data, not shape


def _attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _slice(node: Any, v: list[np.ndarray | None]) -> np.ndarray:
    data, starts, ends = v[0], v[1], v[2]
    axes = v[3] if len(v) > 3 and v[3] is not None else np.arange(len(starts))
    steps = v[4] if len(v) > 4 and v[4] is not None else np.ones(len(starts), dtype=np.int64)
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        index[int(a)] = slice(int(s), int(e), int(st))
    return data[tuple(index)]


def _unsqueeze(node: Any, v: list[np.ndarray | None]) -> np.ndarray:
    axes = v[1] if len(v) > 1 and v[1] is not None else _attr(node, "axes")
    out = v[0]
    rank = out.ndim + len(axes)
    for a in sorted(int(a) % rank for a in axes):
        out = np.expand_dims(out, a)
    return out


def _squeeze(node: Any, v: list[np.ndarray | None]) -> np.ndarray:
    axes = v[1] if len(v) > 1 and v[1] is not None else _attr(node, "axes")
    return np.squeeze(v[0], axis=None if axes is None else tuple(int(a) for a in axes))


def _div(node: Any, v: list[np.ndarray | None]) -> np.ndarray:
    a, b = v[0], v[1]
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div truncates
    return a / b


def _cast(node: Any, v: list[np.ndarray | None]) -> np.ndarray:
    from onnx import helper

    return v[0].astype(helper.tensor_dtype_to_np_dtype(_attr(node, "to")))


def _constant(node: Any, v: list[np.ndarray | None]) -> np.ndarray:
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name in ("value_int", "value_ints"):
            return np.array(_attr(node, a.name), dtype=np.int64)
        if a.name in ("value_float", "value_floats"):
            return np.array(_attr(node, a.name), dtype=np.float32)
    raise ValueError("unsupported Constant")


def _constant_of_shape(node: Any, v: list[np.ndarray | None]) -> np.ndarray:
    from onnx import numpy_helper

    value = _attr(node, "value")
    fill = numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    return np.full(tuple(int(d) for d in v[0]), fill.reshape(-1)[0], dtype=fill.dtype)


_EVAL: dict[str, Callable[[Any, list[np.ndarray | None]], np.ndarray]] = {
    "Constant": _constant,
    "Identity": lambda n, v: v[0],
    "Gather": lambda n, v: np.take(v[0], v[1], axis=_attr(n, "axis", 0)),
    "Concat": lambda n, v: np.concatenate(v, axis=_attr(n, "axis", 0)),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Cast": _cast,
    "Add": lambda n, v: v[0] + v[1],
    "Sub": lambda n, v: v[0] - v[1],
    "Mul": lambda n, v: v[0] * v[1],
    "Div": _div,
    "Mod": lambda n, v: np.mod(v[0], v[1]),
    "Neg": lambda n, v: -v[0],
    "Floor": lambda n, v: np.floor(v[0]),
    "Ceil": lambda n, v: np.ceil(v[0]),
    "Sqrt": lambda n, v: np.sqrt(v[0]),
    "Equal": lambda n, v: v[0] == v[1],
    "Where": lambda n, v: np.where(v[0], v[1], v[2]),
    "Reshape": lambda n, v: v[0].reshape(tuple(int(d) for d in v[1])),
    "Range": lambda n, v: np.arange(v[0], v[1], v[2]),
    "Transpose": lambda n, v: np.transpose(v[0], _attr(n, "perm")),
    "ConstantOfShape": _constant_of_shape,
    "Expand": lambda n, v: v[0] * np.ones(tuple(int(d) for d in v[1]), dtype=v[0].dtype),
}


def fold(
    nodes: list[Any], initial: Mapping[str, np.ndarray], shapes: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Values of every small tensor computable from constants and known shapes."""
    values: dict[str, np.ndarray] = dict(initial)
    for node in nodes:
        if node.op_type in ("Shape", "Size"):
            shape = shapes.get(node.input[0], (None, None))[1]
            if shape is None:
                continue
            arr = np.array(shape, dtype=np.int64)
            if node.op_type == "Size":
                arr = np.array(int(np.prod(arr)), dtype=np.int64)
            else:
                arr = arr[_attr(node, "start", 0) : _attr(node, "end", len(shape))]
            values[node.output[0]] = arr
            continue
        evaluate = _EVAL.get(node.op_type)
        if evaluate is None or node.domain not in ("", "ai.onnx"):
            continue
        ins = [values.get(name) if name else None for name in node.input]
        if any(v is None for name, v in zip(node.input, ins, strict=True) if name):
            continue
        try:
            with np.errstate(all="ignore"):
                out = np.asarray(evaluate(node, ins))
        except (ValueError, TypeError, IndexError, ZeroDivisionError):
            continue
        if out.size <= _MAX_ELEMENTS:
            values[node.output[0]] = out
    return values


def replace_with_constants(graph: Any, values: Mapping[str, np.ndarray]) -> int:
    """Swap nodes whose single output was folded for Constant nodes; return how many."""
    from onnx import helper, numpy_helper

    replaced = 0
    new_nodes = []
    for node in graph.node:
        if node.op_type != "Constant" and len(node.output) == 1 and node.output[0] in values:
            tensor = numpy_helper.from_array(np.ascontiguousarray(values[node.output[0]]))
            new_nodes.append(helper.make_node("Constant", [], [node.output[0]], value=tensor))
            replaced += 1
        else:
            new_nodes.append(node)
    if replaced:
        del graph.node[:]
        graph.node.extend(new_nodes)
    return replaced
