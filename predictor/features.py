"""Graph features of an ONNX model at a batch size (Horus Table 3).

``extract_features(path, batch_size)`` returns a frozen ``GraphFeatures``: FLOPs
(``predictor.flops`` states the per-operator conventions), parameter bytes,
activation bytes (sum over every tensor the graph computes, and the peak of live
tensors when the nodes run in order and each tensor is freed after its last use),
operator counts, and the operators it could not cost.

Hostile or broken files raise ``ModelRejected`` with the reason and the limit.
Weights are never loaded: initializer sizes come from their declared dims, and
external-data references are checked (inside the model's directory, present,
long enough) without reading them. That is also why models whose weights exceed
protobuf's 2 GB limit work: their weights must be external, and the graph that
shape inference sees has its large initializers replaced by typed inputs.

Results are cached by the file's sha256 digest (and batch size); a file's digest
is itself memoised by (path, size, mtime, inode) so a cached answer costs a
``stat`` and two dictionary lookups.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from predictor.errors import ModelRejected, RejectReason
from predictor.flops import UnresolvedShape, node_flops

TABLE3_OPS: tuple[str, ...] = (
    "Exp",
    "Split",
    "Constant",
    "GlobalAveragePool",
    "ReduceMean",
    "MaxPool",
    "GRU",
    "Reshape",
    "LSTM",
    "Concat",
    "Gather",
    "Squeeze",
    "Pad",
    "BatchNormalization",
    "AveragePool",
    "Conv",
    "Slice",
    "Transpose",
    "Flatten",
    "Relu",
    "Gemm",
)
"""Operators Horus Table 3 counts ("Exponentials" is ``Exp``)."""
TRANSFORMER_OPS: tuple[str, ...] = (
    "MatMul",
    "Softmax",
    "LayerNormalization",
    "Erf",
    "Gelu",
    "Add",
    "Mul",
    "Div",
    "Sqrt",
    "Pow",
    "Tanh",
    "Sigmoid",
    "Unsqueeze",
    "Where",
    "Einsum",
    "RNN",
    "HardSwish",
)
FEATURE_OPS: tuple[str, ...] = TABLE3_OPS + TRANSFORMER_OPS

_DTYPE_BYTES = {
    1: 4,
    2: 1,
    3: 1,
    4: 2,
    5: 2,
    6: 4,
    7: 8,
    9: 1,
    10: 2,
    11: 8,
    12: 4,
    13: 8,
    14: 8,
    15: 16,
    16: 2,
    17: 1,
    18: 1,
    19: 1,
    20: 1,
    21: 1,
    22: 1,
    23: 1,
}
_PROTO_SOFT_LIMIT = 1_500_000_000  # above this, infer shapes from a file (protobuf's 2 GB cap)
_FOLD_PASSES = 64  # bound on fold/infer rounds (one per dependent reshape chain)
_INLINE_KEEP_ELEMENTS = 64  # small initializers (shape constants) stay for data propagation


@dataclass(frozen=True)
class FeatureLimits:
    """Bounds applied before and while parsing a model file."""

    max_model_bytes: int = 2_000_000_000
    """Size of the .onnx file itself (protobuf cannot exceed 2 GiB)."""
    max_external_bytes: int = 1 << 40
    """Sum of external-data lengths (declared sizes, never read)."""
    max_nodes: int = 500_000
    """Nodes in the main graph and all subgraphs together."""


@dataclass(frozen=True)
class GraphFeatures:
    """Graph features of one model at one batch size (bytes are bytes, not MiB)."""

    flops: int
    params_bytes: int
    activations_bytes: int
    peak_activation_bytes: int
    batch_size: int
    op_counts: Mapping[str, int]
    unknown_ops: Mapping[str, int] = field(default_factory=dict)
    """Operators with no FLOP formula (counted in op_counts too, cost 0)."""
    unresolved_nodes: int = 0
    """Nodes whose shapes stayed unknown (their FLOPs and bytes are not counted)."""
    n_nodes: int = 0
    opset: int = 0
    digest: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready mapping (the ``tandem predictor features --json`` object)."""
        return {
            "flops": self.flops,
            "params_bytes": self.params_bytes,
            "activations_bytes": self.activations_bytes,
            "peak_activation_bytes": self.peak_activation_bytes,
            "batch_size": self.batch_size,
            "op_counts": dict(sorted(self.op_counts.items())),
            "unknown_ops": dict(sorted(self.unknown_ops.items())),
            "unresolved_nodes": self.unresolved_nodes,
            "n_nodes": self.n_nodes,
            "opset": self.opset,
            "digest": self.digest,
        }


def file_digest(path: Path) -> str:
    """sha256 of a file, streamed."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class FeatureExtractor:
    """Feature extraction with bounded, thread-safe caches keyed by file digest."""

    def __init__(self, limits: FeatureLimits | None = None, cache_size: int = 256):
        self.limits = limits or FeatureLimits()
        self.cache_size = cache_size
        self._digests: OrderedDict[tuple, str] = OrderedDict()
        self._features: OrderedDict[tuple, GraphFeatures] = OrderedDict()
        self._lock = threading.Lock()

    def digest(self, path: Path) -> str:
        """The file's sha256, memoised by (path, size, mtime_ns, inode)."""
        path = Path(path)
        try:
            st = path.stat()
        except OSError as exc:
            raise ModelRejected(
                RejectReason.BAD_REFERENCE, f"cannot read: {exc}", model=str(path)
            ) from exc
        if not stat.S_ISREG(st.st_mode):
            raise ModelRejected(RejectReason.BAD_REFERENCE, "not a regular file", model=str(path))
        if st.st_size > self.limits.max_model_bytes:
            raise ModelRejected(
                RejectReason.TOO_LARGE,
                f"file is {st.st_size} bytes",
                self.limits.max_model_bytes,
                str(path),
            )
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        with self._lock:
            if key in self._digests:
                self._digests.move_to_end(key)
                return self._digests[key]
        value = file_digest(path)
        with self._lock:
            self._digests[key] = value
            _trim(self._digests, self.cache_size)
        return value

    def extract(
        self,
        path: Path | str,
        batch_size: int,
        dims: Mapping[str, int] | None = None,
        batch_dim: str | None = None,
    ) -> GraphFeatures:
        """Features at ``batch_size``; see ``_graph.bind_inputs`` for ``dims``/``batch_dim``."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        path = Path(path)
        digest = self.digest(path)
        key = (digest, batch_size, tuple(sorted((dims or {}).items())), batch_dim)
        with self._lock:
            cached = self._features.get(key)
            if cached is not None:
                self._features.move_to_end(key)
                return cached
        result = _extract(path, batch_size, dict(dims or {}), batch_dim, self.limits, digest)
        with self._lock:
            self._features[key] = result
            _trim(self._features, self.cache_size)
        return result


def _trim(cache: OrderedDict, size: int) -> None:
    while len(cache) > size:
        cache.popitem(last=False)


def extract_features(
    path: Path | str, batch_size: int, limits: FeatureLimits | None = None
) -> GraphFeatures:
    """Uncached one-shot extraction (use a FeatureExtractor to cache)."""
    path = Path(path)
    return FeatureExtractor(limits, cache_size=1).extract(path, batch_size)


def load_model(path: Path, limits: FeatureLimits) -> Any:
    """Parse an ONNX file without external data; ModelRejected on any decode problem."""
    import onnx
    from google.protobuf.message import DecodeError

    size = path.stat().st_size
    if size > limits.max_model_bytes:
        raise ModelRejected(
            RejectReason.TOO_LARGE, f"file is {size} bytes", limits.max_model_bytes, str(path)
        )
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except OSError as exc:
        raise ModelRejected(
            RejectReason.BAD_REFERENCE, f"cannot read: {exc}", model=str(path)
        ) from exc
    except (DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as exc:
        raise ModelRejected(
            RejectReason.DECODE_ERROR, f"not an ONNX protobuf ({exc})", model=str(path)
        ) from exc
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise ModelRejected(RejectReason.MALFORMED_GRAPH, "no graph or no nodes", model=str(path))
    return model


def external_tensors(model: Any) -> list[Any]:
    """Tensors whose data lives in another file (subgraphs and node attributes included)."""
    from onnx import TensorProto

    return [t for t in _all_initializers(model.graph) if t.data_location == TensorProto.EXTERNAL]


_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")


def check_tensor_data(model: Any, where: str) -> None:
    """Refuse an embedded tensor whose dims claim more data than it carries.

    A 16-byte initializer declaring 10^12 floats would otherwise be costed (and later
    allocated) as the 4 TB its dims say. Typed fields count 8 bytes per entry, the
    widest a numeric entry takes, so only a true shortfall is refused.
    """
    from onnx import TensorProto

    for tensor in _all_initializers(model.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            continue  # checked against its file by check_external_data
        declared = _tensor_bytes(tensor.data_type, tensor.dims)
        carried = len(tensor.raw_data) if tensor.raw_data else \
            8 * sum(len(getattr(tensor, f)) for f in _TYPED_FIELDS) + \
            sum(len(v) for v in tensor.string_data)
        if declared > carried:
            raise ModelRejected(
                RejectReason.MALFORMED_GRAPH,
                f"tensor {tensor.name!r}: dims {list(tensor.dims)} claim {declared} bytes "
                f"but it carries {carried}",
                model=where,
            )


def check_external_data(model: Any, base_dir: Path, limits: FeatureLimits) -> None:
    """Refuse embedded tensors shorter than their dims (:func:`check_tensor_data`), and
    external-data references outside ``base_dir``, missing, or too short."""
    check_tensor_data(model, str(base_dir))
    root = base_dir.resolve()
    total = 0
    for tensor in external_tensors(model):
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        target = (root / location).resolve()
        if not location or Path(location).is_absolute() or not target.is_relative_to(root):
            raise ModelRejected(
                RejectReason.EXTERNAL_DATA_OUTSIDE,
                f"tensor {tensor.name!r} points to {location!r}, outside {root}",
                model=str(base_dir),
            )
        if not target.is_file():
            raise ModelRejected(
                RejectReason.EXTERNAL_DATA_MISSING,
                f"tensor {tensor.name!r}: {location!r} does not exist",
                model=str(base_dir),
            )
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
        except ValueError as exc:
            raise ModelRejected(
                RejectReason.MALFORMED_GRAPH,
                f"tensor {tensor.name!r}: bad external offset/length",
                model=str(base_dir),
            ) from exc
        need = _tensor_bytes(tensor.data_type, tensor.dims) if length < 0 else length
        if offset < 0 or offset + need > target.stat().st_size:
            raise ModelRejected(
                RejectReason.EXTERNAL_DATA_MISSING,
                f"tensor {tensor.name!r}: {location!r} is shorter than "
                f"offset+length {offset + need}",
                model=str(base_dir),
            )
        total += need
        if total > limits.max_external_bytes:
            raise ModelRejected(
                RejectReason.TOO_LARGE,
                "external data too large",
                limits.max_external_bytes,
                str(base_dir),
            )


def _all_initializers(graph: Any) -> list[Any]:
    out = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                out.append(attr.t)
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                out.extend(_all_initializers(sub))
    return out


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
    light = _graph.strip_large_initializers(work, _INLINE_KEEP_ELEMENTS)
    order = _graph.topological_order(light.graph, str(path))
    shapes = _resolve_shapes(light, order, Path(path))
    best = ("", 0)
    for name, (dtype, dims) in shapes.items():
        if dims is None or name in weights:
            continue
        size = _tensor_bytes(dtype, dims)
        if size > best[1]:
            best = (name, size)
    return best


def _tensor_bytes(dtype: int, dims: Any) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n * _DTYPE_BYTES.get(dtype, 4)


def _extract(
    path: Path,
    batch_size: int,
    dims: dict[str, int],
    batch_dim: str | None,
    limits: FeatureLimits,
    digest: str,
) -> GraphFeatures:
    from predictor import _graph

    model = load_model(path, limits)
    check_external_data(model, path.parent, limits)
    graph = model.graph
    op_counts: Counter[str] = Counter()
    n_nodes = _graph.count_ops(graph, op_counts)
    if n_nodes > limits.max_nodes:
        raise ModelRejected(
            RejectReason.TOO_MANY_NODES, f"{n_nodes} nodes", limits.max_nodes, str(path)
        )
    order = _graph.topological_order(graph, str(path))
    params_bytes = sum(_tensor_bytes(t.data_type, t.dims) for t in graph.initializer)
    inputs = _graph.data_inputs(graph)
    _graph.bind_inputs(graph, batch_size, dims, batch_dim)
    light = _graph.strip_large_initializers(model, _INLINE_KEEP_ELEMENTS)
    shapes = _resolve_shapes(light, order, path)
    flops = 0
    unknown: Counter[str] = Counter()
    unresolved = 0
    for node in order:
        ins = [shapes.get(n, (None, None))[1] if n else None for n in node.input]
        outs = [shapes.get(n, (None, None))[1] for n in node.output]
        attrs = _graph.attributes(node)
        try:
            cost = (
                node_flops(node.op_type, ins, outs, attrs)
                if node.domain in ("", "ai.onnx")
                else None
            )
        except (UnresolvedShape, IndexError, ValueError, TypeError):
            unresolved += 1
            continue
        if cost is None:
            unknown[node.op_type if not node.domain else f"{node.domain}.{node.op_type}"] += 1
        else:
            flops += cost
    act_sum, act_peak, missing = _graph.activation_bytes(graph, order, shapes, _DTYPE_BYTES, inputs)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return GraphFeatures(
        flops=flops,
        params_bytes=params_bytes,
        activations_bytes=act_sum,
        peak_activation_bytes=act_peak,
        batch_size=batch_size,
        op_counts=MappingProxyType(dict(op_counts)),
        unknown_ops=MappingProxyType(dict(unknown)),
        unresolved_nodes=max(unresolved, missing),
        n_nodes=n_nodes,
        opset=opset,
        digest=digest,
    )


def _resolve_shapes(model: Any, order: list[Any], path: Path) -> dict[str, Any]:
    """Infer shapes, then fold shape arithmetic into constants and infer again (bounded)."""
    import onnx
    from onnx import numpy_helper

    from predictor import _fold, _graph

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
