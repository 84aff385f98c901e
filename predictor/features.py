"""Graph features of an ONNX model at a batch size (Horus Table 3).

``extract_features(path, batch_size)`` returns a frozen ``GraphFeatures``: FLOPs
(``predictor.flops`` states the per-operator conventions), parameter bytes,
activation bytes (sum over every tensor the graph computes, and the peak of live
tensors when the nodes run in order and each tensor is freed after its last use),
operator counts, and the operators it could not cost.

Hostile or broken files raise ``ModelRejected`` with the reason and the limit.
Weights are never loaded: the file is read and checked by ``predictor.onnx_file``
(initializer sizes from their declared dims, external-data references checked
without reading them) and shapes come from ``predictor.shape_inference``. That is
also why models whose weights exceed protobuf's 2 GB limit work: their weights
must be external, and the graph that shape inference sees has its large
initializers replaced by typed inputs.

Results are cached by the file's sha256 digest (and batch size); a file's digest
is itself memoised by (path, size, mtime, inode) so a cached answer costs a
``stat`` and two dictionary lookups.
"""

from __future__ import annotations

import hashlib
import stat
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from predictor.errors import ModelRejected, RejectReason
from predictor.flops import UnresolvedShape, node_flops
from predictor.onnx_file import (
    DTYPE_BYTES,
    FeatureLimits,
    check_external_data,
    load_model,
    tensor_bytes,
)
from predictor.shape_inference import resolve_shapes

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
    params_bytes = sum(tensor_bytes(t.data_type, t.dims) for t in graph.initializer)
    inputs = _graph.data_inputs(graph)
    _graph.bind_inputs(graph, batch_size, dims, batch_dim)
    shapes = resolve_shapes(model, order, path)
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
    act_sum, act_peak, missing = _graph.activation_bytes(graph, order, shapes, DTYPE_BYTES, inputs)
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


