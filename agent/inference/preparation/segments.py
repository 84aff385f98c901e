"""Split an ONNX graph into sequential segments so a long model can yield between them.

A cut is possible after node ``k`` (in the graph's topological order) when exactly
one non-constant tensor is live across it: produced at or before ``k`` (or a graph
input) and consumed after it. Cutting there gives two models joined by that one
tensor, so running the pieces in order computes exactly what the whole graph does.
The smallest pieces ("atoms") are profiled on the executor and then grouped into
segments of about the target cost (``agent.inference.quanta.group_segments``).

Exporters put constants in nodes as well as initializers: torch emits
``Identity(initializer)`` for shared weights and ``Constant`` nodes for shapes.
Counted as tensors, these are live from the head of the graph to their last use
and hide every cut before it (a torch ResNet-50 had 4 cuts, all in its last five
nodes). ``fold_constants`` turns them into initializers first; ``find_cuts`` and
``split_model`` work on the folded model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from agent.inference.preparation.tiling import TILE_PREFIX, tile_convs

# ORT 1.31 reads IR version <= 13; pieces keep the source's version when lower.
MAX_IR_VERSION = 10


class SegmentError(ValueError):
    """The model cannot be split (or a requested cut is not a valid cut)."""


@dataclass(frozen=True)
class Cut:
    """A valid cut: after node ``after_node`` the live tensor is ``tensor`` (and, between
    the row tiles of one Conv, ``more``: its input and the tiles done, ``tiling.py``)."""

    after_node: int
    tensor: str
    more: tuple[str, ...] = ()

    @property
    def tensors(self) -> tuple[str, ...]:
        return (self.tensor, *self.more)


def _subgraph_names(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) may read from the outer scope."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
        for g in graphs:
            for inner in g.node:
                names.update(i for i in inner.input if i)
                names |= _subgraph_names(inner)
    return names


# Ops whose output is a pure function of constant inputs and no bigger than them in
# kind (no ConstantOfShape/Range/Expand: those can build huge tensors from tiny ones).
_FOLDABLE = frozenset({"Constant", "Identity", "Cast", "Reshape", "Unsqueeze", "Squeeze",
                       "Transpose", "Flatten", "Concat"})  # fmt: skip


def _fold_node(node: onnx.NodeProto, values: dict[str, onnx.TensorProto],
               opsets: list[onnx.OperatorSetIdProto]) -> list[onnx.TensorProto] | None:
    """The node's outputs as initializers, or None when it cannot be evaluated here."""
    if node.op_type == "Identity":
        out = onnx.TensorProto()
        out.CopyFrom(values[node.input[0]])
        out.name = node.output[0]
        return [out]
    from onnx.reference import ReferenceEvaluator

    inputs = [n for n in node.input if n]
    graph = helper.make_graph(
        [node], "fold", [], [helper.make_tensor_value_info(o, 0, None) for o in node.output],
        initializer=[values[n] for n in inputs],
    )
    try:
        results = ReferenceEvaluator(helper.make_model(graph, opset_imports=opsets)).run(None, {})
    except Exception:  # an op the reference runtime lacks: keep the node as it is
        return None
    return [numpy_helper.from_array(np.asarray(r), name)
            for name, r in zip(node.output, results, strict=True)]


def fold_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with constant-only nodes (Constant, Identity/Cast/Reshape...
    of initializers, chained) replaced by initializers; graph outputs are kept as nodes."""
    graph = model.graph
    values = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    folded: list[onnx.TensorProto] = []
    for node in graph.node:
        ins = [n for n in node.input if n]
        foldable = (
            node.op_type in _FOLDABLE and node.domain in ("", "ai.onnx")
            and all(n in values for n in ins) and not (set(node.output) & outputs)
            and all(o for o in node.output)
        )
        made = _fold_node(node, values, list(model.opset_import)) if foldable else None
        if made is None:
            kept.append(node)
            continue
        for tensor in made:
            values[tensor.name] = tensor
            folded.append(tensor)
    if not folded:
        return model
    used = {n for node in kept for n in node.input} | set().union(
        *(_subgraph_names(node) for node in kept))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    del out.graph.initializer[:]
    # Initializers no remaining node reads (the sources of folded chains) are dropped.
    keep = [t for t in list(graph.initializer) + folded if t.name in used or t.name in outputs]
    out.graph.initializer.extend(keep)
    # Old-IR models also list initializers as graph inputs; a dropped one must go too.
    names = {t.name for t in keep}
    dropped = {t.name for t in graph.initializer} - names
    inputs = [i for i in graph.input if i.name not in dropped]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    return out


def find_cuts(model: onnx.ModelProto) -> list[Cut]:
    """Every position where exactly one typed, non-constant tensor crosses the boundary.

    Constants held in nodes count as tensors here: pass ``fold_constants(model)``.
    """
    graph = model.graph
    constants = {t.name for t in graph.initializer}
    nodes = list(graph.node)
    producer: dict[str, int] = {i.name: -1 for i in graph.input if i.name not in constants}
    last_use: dict[str, int] = {}
    for idx, node in enumerate(nodes):
        for name in list(node.input) + sorted(_subgraph_names(node)):
            if name and name not in constants:
                last_use[name] = idx
        for name in node.output:
            if name:
                producer[name] = idx
    for out in graph.output:
        last_use[out.name] = len(nodes)
    typed = _typed_values(model)
    cuts: list[Cut] = []
    # Sweep: a tensor is live across boundary k when producer <= k < last_use.
    for k in range(len(nodes) - 1):
        live = [t for t, p in producer.items() if p <= k < last_use.get(t, -1)]
        if len(live) == 1 and live[0] in typed:
            cuts.append(Cut(k, live[0]))
        elif _between_tiles(nodes, k) and live and all(t in typed for t in live):
            cuts.append(Cut(k, live[0], tuple(live[1:])))
    return cuts


def _between_tiles(nodes: Sequence[onnx.NodeProto], k: int) -> bool:
    """Whether node ``k`` is a row tile's Conv, followed by the next tile or the Concat
    that joins them (a copy of the whole output: a piece of its own)."""
    return (nodes[k].name.startswith(TILE_PREFIX) and nodes[k].op_type == "Conv"
            and nodes[k + 1].name.startswith(TILE_PREFIX))


def _typed_values(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception as exc:  # onnx raises several types for broken graphs
        raise SegmentError(f"shape inference failed: {exc}") from exc
    infos = (
        list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)
    )
    return {v.name: v for v in infos if v.type.tensor_type.elem_type}


def split_model(model: onnx.ModelProto, cuts: Sequence[Cut]) -> list[onnx.ModelProto]:
    """The sequential pieces of ``model`` between ``cuts`` (which must come from find_cuts)."""
    valid = {c.after_node: c for c in find_cuts(model)}
    ordered = sorted(cuts, key=lambda c: c.after_node)
    for cut in ordered:
        if valid.get(cut.after_node) != cut:
            raise SegmentError(f"not a valid cut: {cut}")
    typed = _typed_values(model)
    graph = model.graph
    nodes = list(graph.node)
    constants = {t.name: t for t in graph.initializer}
    bounds = [-1] + [c.after_node for c in ordered] + [len(nodes) - 1]
    entry = [i for i in graph.input if i.name not in constants]
    pieces: list[onnx.ModelProto] = []
    for i in range(len(bounds) - 1):
        piece_nodes = nodes[bounds[i] + 1 : bounds[i + 1] + 1]
        used = set()
        made = set()
        for node in piece_nodes:
            used.update(node.input)
            used |= _subgraph_names(node)
            made.update(node.output)
        # A piece reads what crosses the cut before it and it uses, and gives what it
        # makes that crosses the cut after it (the runner carries the rest past it).
        inputs = entry if i == 0 else [typed[t] for t in ordered[i - 1].tensors if t in used]
        outputs = list(graph.output) if i == len(bounds) - 2 else \
            [typed[t] for t in ordered[i].tensors if t in made]
        inits = [constants[n] for n in sorted(used) if n in constants]
        piece_graph = helper.make_graph(
            piece_nodes, f"{graph.name}_seg{i}", inputs, outputs, initializer=inits
        )
        piece = helper.make_model(
            piece_graph, opset_imports=list(model.opset_import), producer_name="tandem-segments"
        )
        piece.ir_version = min(model.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
        piece.functions.extend(model.functions)
        pieces.append(piece)
    return pieces


def atoms(model: onnx.ModelProto) -> list[onnx.ModelProto]:
    """The model, constants folded and long convolutions tiled (``tiling.py``), split at
    every valid cut: the finest sequential pieces."""
    tiled = tile_convs(fold_constants(model))
    return split_model(tiled, find_cuts(tiled))
