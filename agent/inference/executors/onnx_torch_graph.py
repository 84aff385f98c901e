"""An ONNX graph compiled to torch calls on one device (over the operators of
``onnx_torch_ops``; the primitives they share are in ``onnx_torch``).

This module imports torch: only the torch executor imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import onnx
import torch
from onnx import helper, numpy_helper

from agent.inference.executors.onnx_torch import (
    Builder,
    NodeContext,
    Unsupported,
    UnsupportedGraph,
    constant_tensor,
)
from agent.inference.executors.onnx_torch_ops import OPS


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
