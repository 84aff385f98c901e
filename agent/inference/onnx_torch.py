"""Run an ONNX graph with torch operations: the torch executor's interpreter.

Each node becomes one torch call, built once when the graph is compiled (its
attributes read, its kind checked), so an unsupported operator or attribute is
found at registration and named, never met mid-serving. Running a graph walks
the node list over a table of live tensors, freeing each tensor after its last
reader, so a run over nodes ``[start, stop)`` (a segment between two cuts of
``agent.inference.segments``) returns exactly the tensors live across ``stop``:
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
from onnx import helper, numpy_helper

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


@dataclass(frozen=True)
class _Step:
    fn: Callable[..., Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    release: tuple[str, ...]
    """Tensors whose last reader is this node (or that no one reads): freed after it."""


class TorchGraph:
    """An ONNX graph compiled to torch calls on one device."""

    def __init__(self, model: onnx.ModelProto, device: torch.device | str):
        from agent.inference.onnx_torch_ops import OPS

        self.device = torch.device(device)
        graph = model.graph
        if len(graph.input) < 1:
            raise UnsupportedGraph(["a graph without inputs"])
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.constants: dict[str, torch.Tensor] = {
            t.name: constant_tensor(numpy_helper.to_array(t), self.device)
            for t in graph.initializer
        }
        self.input_names = [i.name for i in graph.input if i.name not in self.constants]
        self.output_names = [o.name for o in graph.output]
        nodes = list(graph.node)
        last_use: dict[str, int] = {}
        for idx, node in enumerate(nodes):
            for name in node.input:
                if name:
                    last_use[name] = idx
        for name in self.output_names:
            last_use[name] = len(nodes)
        steps, problems = [], []
        for idx, node in enumerate(nodes):
            try:
                fn = _build(node, opset, self.device, OPS)
            except Unsupported as exc:
                problems.append(str(exc))
                continue
            # Graph inputs read here for the last time are freed too (the feed's copy stays).
            release = tuple(
                n for n in dict.fromkeys([*node.input, *node.output])
                if n and n not in self.constants and last_use.get(n, -1) <= idx
            )  # fmt: skip
            steps.append(_Step(fn, tuple(node.input), tuple(node.output), release))
        if problems:
            raise UnsupportedGraph(problems)
        self.steps = steps

    def __len__(self) -> int:
        return len(self.steps)

    def run(self, feed: Mapping[str, torch.Tensor], start: int = 0, stop: int | None = None
            ) -> dict[str, torch.Tensor]:
        """Run nodes ``[start, stop)`` on ``feed``: the tensors live after ``stop``
        (the graph outputs, in order, when ``stop`` is the end)."""
        stop = len(self.steps) if stop is None else stop
        env: dict[str, Any] = {**self.constants, **feed}
        constants = self.constants
        with torch.inference_mode():
            for step in self.steps[start:stop]:
                result = step.fn(*[env[n] if n else None for n in step.inputs])
                if not isinstance(result, tuple):
                    result = (result,)
                for name, value in zip(step.outputs, result, strict=False):
                    if name:
                        env[name] = value
                for name in step.release:
                    env.pop(name, None)
        if stop == len(self.steps):
            return {n: env[n] for n in self.output_names}
        return {k: v for k, v in env.items() if k not in constants}


def _build(node: onnx.NodeProto, opset: int, device: torch.device,
           ops: Mapping[str, Builder]) -> Callable[..., Any]:
    if node.domain not in ("", "ai.onnx"):
        raise Unsupported(f"operator {node.domain}::{node.op_type}")
    builder = ops.get(node.op_type)
    if builder is None:
        raise Unsupported(f"operator {node.op_type}")
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for a in node.attribute):
        raise Unsupported(f"operator {node.op_type} with a subgraph")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return builder(NodeContext(node, attrs, opset, device))
