"""Row tiles of a long convolution: yield points inside one Conv node.

A best-effort job yields to the SLO sessions only between its pieces, and a piece
is at least one node (``segments.py``). One 3x3 Conv of 64 channels on 192x192 is
1.4 GMAC: about 50 ms on one core here, longer than a 50 ms SLO less the request
path, so no duty cycle's slack could hold it and the job was throttled to nothing
beside such a session. Olympian yields between kernels; on a CPU one kernel is this
whole node, so the node is cut into kernels first.

``tile_convs`` rewrites every 2-D Conv (no groups, stride and dilation 1) of more
than ``MAX_TILE_MACS`` into row tiles: each tile slices the input rows its output
rows read (the kernel's halo included, the Conv's own padding only at the edges),
runs the same Conv on them, and one Concat joins the tiles' rows in the original
output. Every output element is computed from the same inputs and weights as
before. Between two tiles the input and the tiles done are live, so those
boundaries are cuts of several tensors (``segments.find_cuts`` knows them by the
tile nodes' name prefix). Only pieces run as tiles: a whole run (an SLO batch)
uses the model as it came.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from predictor._graph import attributes

MAX_TILE_MACS = 100e6
"""Multiply-adds a tile may have: about 3.5 ms on one core of this host's CPUs, so a
tile fits the slack an SLO session of 50 ms leaves (halo rows add 2 / rows a tile)."""
TILE_PREFIX = "tandem_tile/"
"""Names of the nodes and constants a rewrite adds; a cut after a tile's Conv is one."""
MIN_ROWS = 2
"""Output rows a tile has at least (fewer would mostly recompute the halo)."""


def _tiles(node: onnx.NodeProto, shape: list[int | None], weight: np.ndarray,
           max_macs: float) -> list[tuple[int, int]] | None:
    """The output row ranges to tile ``node`` into, or None to keep it whole."""
    if (node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or weight.ndim != 4
            or len(shape) != 4 or any(d is None for d in shape[1:])):
        return None
    attrs = attributes(node)
    if attrs.get("group", 1) != 1:
        return None
    if any(list(attrs.get(k, [1, 1])) != [1, 1] for k in ("strides", "dilations")):
        return None
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b""):
        return None
    m, c, kh, kw = weight.shape
    pt, pl, pb, pr = attrs.get("pads", [0, 0, 0, 0])
    rows = int(shape[2]) + pt + pb - kh + 1
    cols = int(shape[3]) + pl + pr - kw + 1
    if rows < 2 * MIN_ROWS or cols < 1:
        return None
    macs = float(m) * c * kh * kw * rows * cols
    count = min(math.ceil(macs / max_macs), rows // MIN_ROWS)
    if count < 2:
        return None
    bounds = [round(i * rows / count) for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _tile_nodes(node: onnx.NodeProto, height: int, kh: int, ranges: list[tuple[int, int]]
                ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Slice, Conv per tile, then the Concat that gives ``node``'s output."""
    pt, pl, pb, pr = attributes(node).get("pads", [0, 0, 0, 0])
    base = f"{TILE_PREFIX}{node.output[0]}/"
    kept = [a for a in node.attribute if a.name not in ("pads", "auto_pad")]
    nodes: list[onnx.NodeProto] = []
    consts = [numpy_helper.from_array(np.array([2], np.int64), base + "axes")]
    outs = []
    for k, (a, b) in enumerate(ranges):
        start, end = a - pt, b - pt + kh - 1  # the input rows output rows [a, b) read
        lo, hi = max(0, start), min(height, end)
        consts += [numpy_helper.from_array(np.array([lo], np.int64), f"{base}start{k}"),
                   numpy_helper.from_array(np.array([hi], np.int64), f"{base}end{k}")]
        rows_in, out = f"{base}x{k}", f"{base}y{k}"
        nodes.append(helper.make_node("Slice", [node.input[0], f"{base}start{k}",
                                                f"{base}end{k}", base + "axes"], [rows_in],
                                      name=f"{base}slice{k}"))
        conv = helper.make_node("Conv", [rows_in, *node.input[1:]], [out],
                                name=f"{base}conv{k}", pads=[lo - start, pl, end - hi, pr])
        conv.attribute.extend(kept)
        nodes.append(conv)
        outs.append(out)
    nodes.append(helper.make_node("Concat", outs, [node.output[0]], name=f"{base}concat",
                                  axis=2))
    return nodes, consts


def tile_convs(model: onnx.ModelProto, max_macs: float = MAX_TILE_MACS) -> onnx.ModelProto:
    """``model`` with every Conv over ``max_macs`` cut into row tiles (the same model
    where none is; constants must be initializers: ``segments.fold_constants``)."""
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=0)
    if opset < 10:  # Slice took its bounds as attributes before opset 10
        return model
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # onnx raises several types for broken graphs: keep it whole
        return model
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None
                       for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input]
              if v.type.tensor_type.HasField("shape")}
    weights = {t.name: t for t in model.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    added: list[onnx.TensorProto] = []
    for node in model.graph.node:
        conv = node.op_type == "Conv" and len(node.input) > 1
        w = weights.get(node.input[1]) if conv else None
        shape = shapes.get(node.input[0]) if conv else None
        ranges = None if w is None or not shape else \
            _tiles(node, shape, numpy_helper.to_array(w), max_macs)
        if ranges is None:
            nodes.append(node)
            continue
        more, consts = _tile_nodes(node, int(shape[2]), int(w.dims[2]), ranges)
        nodes += more
        added += consts
    if not added:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(added)
    return out
