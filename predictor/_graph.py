"""ONNX graph helpers for feature extraction: structure checks, shapes, live bytes."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

from predictor.errors import ModelRejected, RejectReason

ShapeInfo = tuple["int | None", "tuple[int, ...] | None"]  # (elem_type, shape)


def count_ops(graph: Any, counter: Counter[str]) -> int:
    """Add every node's op type (subgraphs included) to ``counter``; return the node count."""
    total = 0
    for node in graph.node:
        total += 1
        counter[
            node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        ] += 1
        for attr in node.attribute:
            subs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
            for sub in subs:
                total += count_ops(sub, counter)
    return total


def topological_order(graph: Any, model: str) -> list[Any]:
    """Nodes in dependency order; ModelRejected for dangling inputs, duplicates or cycles."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    available |= {t.name for t in graph.sparse_initializer} | {""}
    producer: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in producer or out in available - {""}:
                raise ModelRejected(
                    RejectReason.MALFORMED_GRAPH,
                    f"tensor {out!r} is produced twice (node {node.name!r})",
                    model=model,
                )
            producer[out] = idx
    indegree = [0] * len(graph.node)
    consumers: dict[int, list[int]] = {}
    for idx, node in enumerate(graph.node):
        for name in node.input:
            if name in available:
                continue
            if name not in producer:
                raise ModelRejected(
                    RejectReason.MALFORMED_GRAPH,
                    f"input {name!r} of node {node.name or node.op_type!r} is never produced",
                    model=model,
                )
            indegree[idx] += 1
            consumers.setdefault(producer[name], []).append(idx)
    ready = deque(i for i, d in enumerate(indegree) if d == 0)
    order: list[int] = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for j in consumers.get(i, ()):
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if len(order) != len(graph.node):
        stuck = [graph.node[i].name or graph.node[i].op_type for i, d in enumerate(indegree) if d]
        raise ModelRejected(
            RejectReason.CYCLIC_GRAPH,
            f"{len(stuck)} nodes are on or behind a cycle, e.g. {stuck[:3]}",
            model=model,
        )
    for out in graph.output:
        if out.name not in producer and out.name not in available:
            raise ModelRejected(
                RejectReason.MALFORMED_GRAPH,
                f"graph output {out.name!r} is never produced",
                model=model,
            )
    return [graph.node[i] for i in order]


def data_inputs(graph: Any) -> list[str]:
    """Graph inputs that are not initializers (old exporters list weights as inputs too)."""
    weights = {t.name for t in graph.initializer}
    return [i.name for i in graph.input if i.name not in weights]


def bind_inputs(
    graph: Any, batch_size: int, dims: Mapping[str, int], batch_dim: str | None = None
) -> None:
    """Bind the batch dimension of every data input to ``batch_size``.

    Without ``batch_dim`` the batch is each data input's leading dimension (the
    convention of exporters; a fixed leading dim is rebound too). With it, only
    dims named ``batch_dim`` are bound (time-major RNN inputs, say). ``dims`` binds
    any other named dims. Declared intermediate and output shapes are dropped so
    that shape inference recomputes them for the bound batch.
    """
    for name in data_inputs(graph):
        value = next(i for i in graph.input if i.name == name)
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            continue
        for k, dim in enumerate(value.type.tensor_type.shape.dim):
            named = dim.dim_param if dim.HasField("dim_param") else None
            if (batch_dim is None and k == 0) or (batch_dim is not None and named == batch_dim):
                dim.dim_value = batch_size
            elif named is not None and named in dims:
                dim.dim_value = int(dims[named])
    del graph.value_info[:]
    for out in graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")


def strip_large_initializers(model: Any, keep_elements: int) -> Any:
    """Turn initializers above ``keep_elements`` into typed graph inputs (in place).

    Shape inference needs their types, not their bytes; small ones (shape
    constants for Reshape) stay so that data propagation can read them.
    """
    from onnx import helper

    graph = model.graph
    listed = {i.name for i in graph.input}
    kept, moved = [], []
    for tensor in graph.initializer:
        n = 1
        for d in tensor.dims:
            n *= d
        if n <= keep_elements:
            kept.append(tensor)
        elif tensor.name not in listed:
            moved.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    if moved or len(kept) != len(graph.initializer):
        kept_copies = [type(t)() for t in kept]
        for copy, t in zip(kept_copies, kept, strict=True):
            copy.CopyFrom(t)
        del graph.initializer[:]
        graph.initializer.extend(kept_copies)
        graph.input.extend(moved)
    return model


def _shape(value_type: Any) -> ShapeInfo:
    if not value_type.HasField("tensor_type"):
        return None, None
    tt = value_type.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return tt.elem_type, None
        dims.append(int(d.dim_value))
    return tt.elem_type, tuple(dims)


def value_shapes(graph: Any) -> dict[str, ShapeInfo]:
    """Element type and static shape (None if any dim is unknown) of every named tensor."""
    shapes: dict[str, ShapeInfo] = {}
    for t in graph.initializer:
        shapes[t.name] = (t.data_type, tuple(int(d) for d in t.dims))
    for v in list(graph.input) + list(graph.value_info) + list(graph.output):
        shapes.setdefault(v.name, _shape(v.type))
        if shapes[v.name][1] is None:
            shapes[v.name] = _shape(v.type)
    return shapes


def attributes(node: Any) -> dict[str, Any]:
    """A node's scalar and list attributes (tensors and graphs are skipped)."""
    from onnx import AttributeProto, helper

    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS, AttributeProto.TENSOR):
            continue
        out[attr.name] = helper.get_attribute_value(attr)
    return out


def activation_bytes(
    graph: Any,
    order: list[Any],
    shapes: Mapping[str, ShapeInfo],
    dtype_bytes: Mapping[int, int],
    inputs: list[str],
) -> tuple[int, int, int]:
    """(sum, peak, unresolved) bytes of activations over an in-order run.

    Activations are the data inputs and every node output except Constant nodes'.
    A tensor is freed after its last consumer; graph outputs live to the end.
    ``unresolved`` counts tensors whose size is unknown (they count as 0).
    """

    def size(name: str) -> int | None:
        elem, shape = shapes.get(name, (None, None))
        if shape is None or elem is None:
            return None
        n = 1
        for d in shape:
            n *= d
        return n * dtype_bytes.get(elem, 4)

    last_use: dict[str, int] = {}
    for i, node in enumerate(order):
        for name in node.input:
            last_use[name] = i
    keep = {o.name for o in graph.output}
    live: dict[str, int] = {}
    total = unresolved = current = 0
    for name in inputs:
        nbytes = size(name)
        unresolved += nbytes is None
        live[name] = nbytes or 0
        current += nbytes or 0
    total = peak = current
    for i, node in enumerate(order):
        if node.op_type != "Constant":
            for out in node.output:
                if not out:
                    continue
                nbytes = size(out)
                unresolved += nbytes is None
                live[out] = nbytes or 0
                current += nbytes or 0
                total += nbytes or 0
        peak = max(peak, current)
        for name in list(node.input) + list(node.output):
            if name in live and name not in keep and last_use.get(name, -1) <= i:
                current -= live.pop(name)
    return total, peak, unresolved
