"""Run an ONNX graph with torch operations: the torch executor's interpreter.

Each node becomes one torch call, built once when the graph is compiled (its
attributes read, its kind checked), so an unsupported operator or attribute is
found at registration and named, never met mid-serving. Running a graph walks
the node list over a table of live tensors, freeing each tensor after its last
reader, so a run over nodes ``[start, stop)`` (a segment between two cuts of
``agent.inference.preparation.segments``) returns exactly the tensors live across ``stop``:
segments hand tensors to each other on the device, with no copies.

Where tensors live: float weights and activations on the executor's device;
integer shape arithmetic (``Shape`` and what is computed from it, small integer
constants) on the host, because its values become Python shapes (``Reshape``,
``Slice``, ``Pad``) and reading a device tensor would wait for the device.
Operators that meet tensors from both sides move the host one over.

This module imports torch: only the torch executor imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper

Builder = Callable[["NodeContext"], Callable[..., Any]]
"""Builds the torch call of one node; raises Unsupported for what it cannot run."""

HOST = torch.device("cpu")
_HOST_INT_MAX_ELEMENTS = 1024
"""Integer constants up to this size stay on the host (they are shapes, axes, pads)."""


class Unsupported(ValueError):
    """One node the interpreter cannot run (an operator, or an attribute value)."""


class UnsupportedGraph(ValueError):
    """A graph with nodes the interpreter cannot run; ``problems`` names each kind."""

    def __init__(self, problems: list[str]):
        self.problems = sorted(set(problems))
        super().__init__("unsupported by the torch executor: " + "; ".join(self.problems))


@dataclass(frozen=True)
class NodeContext:
    """What a builder may read: the node, its attributes, the opset and the device."""

    node: onnx.NodeProto
    attrs: Mapping[str, Any]
    opset: int
    device: torch.device

    def attr(self, name: str, default: Any = None) -> Any:
        """An attribute's value (bytes decoded to str), or ``default``."""
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    @property
    def outputs(self) -> int:
        """How many outputs the graph asks for (empty names are unused)."""
        return len(self.node.output)

    def needs_output(self, index: int) -> bool:
        """Whether output ``index`` is named (read by someone)."""
        return len(self.node.output) > index and bool(self.node.output[index])


def to_torch_dtype(onnx_type: int) -> torch.dtype:
    """The torch dtype of an ONNX element type; Unsupported for types torch lacks."""
    try:
        np_type = helper.tensor_dtype_to_np_dtype(onnx_type)
        return torch.from_numpy(np.zeros(0, dtype=np_type)).dtype
    except (KeyError, TypeError, ValueError) as exc:
        raise Unsupported(f"element type {onnx_type}") from exc


def constant_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A constant as a tensor: small integer ones on the host, the rest on ``device``."""
    array = np.array(array, copy=True)  # writable and owned: torch shares its memory
    tensor = torch.from_numpy(array)
    host = not torch.is_floating_point(tensor) and tensor.numel() <= _HOST_INT_MAX_ELEMENTS
    return tensor if host else tensor.to(device)


def aligned(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors on one device: a host tensor meeting a device tensor moves over."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) <= 1:
        return list(tensors)
    target = next(d for d in devices if d.type != "cpu")
    return [t.to(target) if t is not None and t.device != target else t for t in tensors]


def as_ints(tensor: torch.Tensor | None) -> list[int]:
    """A shape-like tensor's values as Python ints (a host read for host tensors)."""
    return [] if tensor is None else [int(v) for v in tensor.reshape(-1).tolist()]
