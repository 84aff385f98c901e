"""Reading an ONNX file within limits, without loading its weights.

``load_model`` parses the protobuf (never its external data) and refuses files
that are too large or not ONNX. ``check_external_data`` refuses embedded tensors
whose dims claim more data than they carry, and external-data references outside
the model's directory, missing, or too short, checked against the referenced
files' sizes without reading them. Tensor sizes always come from declared dims
(``tensor_bytes``).

Hostile or broken files raise ``ModelRejected`` with the reason and the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.errors import ModelRejected, RejectReason

DTYPE_BYTES: dict[int, int] = {
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
"""Bytes per element of each ONNX ``TensorProto`` data type (4 when unknown)."""


@dataclass(frozen=True)
class FeatureLimits:
    """Bounds applied before and while parsing a model file."""

    max_model_bytes: int = 2_000_000_000
    """Size of the .onnx file itself (protobuf cannot exceed 2 GiB)."""
    max_external_bytes: int = 1 << 40
    """Sum of external-data lengths (declared sizes, never read)."""
    max_nodes: int = 500_000
    """Nodes in the main graph and all subgraphs together."""


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
        declared = tensor_bytes(tensor.data_type, tensor.dims)
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
        need = tensor_bytes(tensor.data_type, tensor.dims) if length < 0 else length
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


def tensor_bytes(dtype: int, dims: Any) -> int:
    """Bytes of a tensor of ``dtype`` with ``dims`` (its declared size)."""
    n = 1
    for d in dims:
        n *= int(d)
    return n * DTYPE_BYTES.get(dtype, 4)

