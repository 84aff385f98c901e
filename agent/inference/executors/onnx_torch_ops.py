"""ONNX operators as torch calls: one builder per operator (``OPS``).

A builder reads the node's attributes once and returns the call the interpreter
makes on every run. What it cannot honour exactly (an attribute value, an extra
output) raises ``Unsupported`` at build time, so the graph is refused at
registration with the reason named, never run with a silently different meaning.
Semantics follow the ONNX operator specification at the graph's opset.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)
from onnx import numpy_helper

from agent.inference.executors.onnx_torch import (
    HOST,
    Builder,
    NodeContext,
    Unsupported,
    aligned,
    as_ints,
    constant_tensor,
    to_torch_dtype,
)
from agent.inference.executors.onnx_torch_nn import NN_OPS
from agent.inference.executors.onnx_torch_rnn import RNN_OPS

OPS: dict[str, Builder] = {**NN_OPS, **RNN_OPS}


def op(*names: str) -> Callable[[Builder], Builder]:
    """Register a builder under one or more operator names."""

    def register(builder: Builder) -> Builder:
        for name in names:
            OPS[name] = builder
        return builder

    return register


def _binary(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Builder:
    return lambda ctx: lambda a, b: fn(*aligned(a, b))


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # ONNX integer division truncates toward zero (C semantics).
    if a.is_floating_point() or b.is_floating_point():
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


for _name, _fn in {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": _div, "Pow": torch.pow,
    "Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt, "LessOrEqual": torch.le,
    "GreaterOrEqual": torch.ge, "And": torch.logical_and, "Or": torch.logical_or,
    "Xor": torch.logical_xor,
}.items():  # fmt: skip
    OPS[_name] = _binary(_fn)

for _name, _fn in {
    "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Erf": torch.erf,
    "Sqrt": torch.sqrt, "Exp": torch.exp, "Log": torch.log, "Neg": torch.neg, "Abs": torch.abs,
    "Reciprocal": torch.reciprocal, "Floor": torch.floor, "Ceil": torch.ceil,
    "Not": torch.logical_not, "Sin": torch.sin, "Cos": torch.cos, "Sign": torch.sign,
    "Round": torch.round, "Softplus": F.softplus, "HardSwish": F.hardswish,
    "Identity": lambda x: x,
}.items():  # fmt: skip
    OPS[_name] = (lambda f: lambda ctx: f)(_fn)


def _variadic(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Builder:
    def build(ctx: NodeContext) -> Callable[..., Any]:
        def run(*xs: torch.Tensor) -> torch.Tensor:
            xs = tuple(aligned(*xs))
            out = xs[0]
            for x in xs[1:]:
                out = fn(out, x)
            return out

        return run

    return build


OPS["Max"], OPS["Min"], OPS["Sum"] = (
    _variadic(torch.maximum), _variadic(torch.minimum), _variadic(torch.add))  # fmt: skip


@op("Mean")
def _mean(ctx: NodeContext) -> Callable[..., Any]:
    total = _variadic(torch.add)(ctx)
    return lambda *xs: total(*xs) / len(xs)


@op("LeakyRelu")
def _leaky_relu(ctx: NodeContext) -> Callable[..., Any]:
    alpha = float(ctx.attr("alpha", 0.01))
    return lambda x: F.leaky_relu(x, alpha)


@op("Elu")
def _elu(ctx: NodeContext) -> Callable[..., Any]:
    alpha = float(ctx.attr("alpha", 1.0))
    return lambda x: F.elu(x, alpha)


@op("HardSigmoid")
def _hard_sigmoid(ctx: NodeContext) -> Callable[..., Any]:
    alpha, beta = float(ctx.attr("alpha", 0.2)), float(ctx.attr("beta", 0.5))
    return lambda x: torch.clamp(x * alpha + beta, 0.0, 1.0)


@op("Gelu")
def _gelu(ctx: NodeContext) -> Callable[..., Any]:
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"Gelu approximate={approximate}")
    return lambda x: F.gelu(x, approximate=approximate)


@op("Clip")
def _clip(ctx: NodeContext) -> Callable[..., Any]:
    if ctx.opset < 11:  # bounds were attributes
        lo, hi = ctx.attr("min"), ctx.attr("max")
        return lambda x: torch.clamp(x, lo, hi)

    def run(x: torch.Tensor, lo: torch.Tensor | None = None, hi: torch.Tensor | None = None):
        bounds = [None if b is None else b.to(x.device, x.dtype) for b in (lo, hi)]
        return torch.clamp(x, *bounds)

    return run


@op("Dropout")
def _dropout(ctx: NodeContext) -> Callable[..., Any]:
    # Inference: the identity; the mask, when asked for, keeps everything.
    if ctx.needs_output(1):
        return lambda x, *_: (x, torch.ones_like(x, dtype=torch.bool))
    return lambda x, *_: x


@op("Cast")
def _cast(ctx: NodeContext) -> Callable[..., Any]:
    dtype = to_torch_dtype(int(ctx.attr("to")))
    return lambda x: x.to(dtype)


@op("CastLike")
def _cast_like(ctx: NodeContext) -> Callable[..., Any]:
    return lambda x, like: x.to(like.dtype)


@op("Constant")
def _constant(ctx: NodeContext) -> Callable[..., Any]:
    if "value" in ctx.attrs:
        array = numpy_helper.to_array(ctx.attrs["value"])
    elif "value_float" in ctx.attrs or "value_floats" in ctx.attrs:
        array = np.array(ctx.attrs.get("value_float", ctx.attrs.get("value_floats")), np.float32)
    elif "value_int" in ctx.attrs or "value_ints" in ctx.attrs:
        array = np.array(ctx.attrs.get("value_int", ctx.attrs.get("value_ints")), np.int64)
    else:
        raise Unsupported(f"Constant with {sorted(ctx.attrs)}")
    value = constant_tensor(array, ctx.device)
    return lambda: value


@op("ConstantOfShape")
def _constant_of_shape(ctx: NodeContext) -> Callable[..., Any]:
    proto = ctx.attrs.get("value")
    fill = numpy_helper.to_array(proto) if proto is not None else np.zeros(1, np.float32)
    dtype = torch.from_numpy(fill.reshape(-1)[:1].copy()).dtype
    value = fill.reshape(-1)[0].item()
    # Integer fills are shape arithmetic (host); float fills are data (device).
    device = ctx.device if dtype.is_floating_point else HOST
    return lambda shape: torch.full(as_ints(shape), value, dtype=dtype, device=device)


@op("Shape")
def _shape(ctx: NodeContext) -> Callable[..., Any]:
    start, end = ctx.attr("start", 0), ctx.attr("end")
    return lambda x: torch.tensor(list(x.shape)[start:end], dtype=torch.int64)


@op("Size")
def _size(ctx: NodeContext) -> Callable[..., Any]:
    return lambda x: torch.tensor(x.numel(), dtype=torch.int64)


@op("Reshape")
def _reshape(ctx: NodeContext) -> Callable[..., Any]:
    allowzero = int(ctx.attr("allowzero", 0))

    def run(x: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
        dims = as_ints(shape)
        if not allowzero:  # 0 copies the input's dimension
            dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        return x.reshape(dims)

    return run


@op("Flatten")
def _flatten(ctx: NodeContext) -> Callable[..., Any]:
    axis = int(ctx.attr("axis", 1))

    def run(x: torch.Tensor) -> torch.Tensor:
        a = axis + x.ndim if axis < 0 else axis
        return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))

    return run


@op("Transpose")
def _transpose(ctx: NodeContext) -> Callable[..., Any]:
    perm = ctx.attr("perm")
    return lambda x: x.permute(perm if perm is not None else list(range(x.ndim))[::-1])


def _axes(ctx: NodeContext, tensor: torch.Tensor | None, since: int) -> list[int] | None:
    """Axes from the input (opset >= ``since``) or from the attribute (earlier)."""
    if ctx.opset >= since:
        return None if tensor is None else as_ints(tensor)
    value = ctx.attr("axes")
    return None if value is None else list(value)


@op("Unsqueeze")
def _unsqueeze(ctx: NodeContext) -> Callable[..., Any]:
    def run(x: torch.Tensor, axes_in: torch.Tensor | None = None) -> torch.Tensor:
        axes = _axes(ctx, axes_in, 13) or []
        rank = x.ndim + len(axes)
        for a in sorted(a + rank if a < 0 else a for a in axes):
            x = x.unsqueeze(a)
        return x

    return run


@op("Squeeze")
def _squeeze(ctx: NodeContext) -> Callable[..., Any]:
    def run(x: torch.Tensor, axes_in: torch.Tensor | None = None) -> torch.Tensor:
        axes = _axes(ctx, axes_in, 13)
        return x.squeeze() if axes is None else x.squeeze(tuple(axes))

    return run


@op("Concat")
def _concat(ctx: NodeContext) -> Callable[..., Any]:
    axis = int(ctx.attr("axis"))
    return lambda *xs: torch.cat(aligned(*xs), dim=axis)


@op("Split")
def _split(ctx: NodeContext) -> Callable[..., Any]:
    axis, count = int(ctx.attr("axis", 0)), ctx.outputs

    def run(x: torch.Tensor, split: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        sizes = as_ints(split) if ctx.opset >= 13 else list(ctx.attr("split") or [])
        if not sizes:  # equal parts, the last one smaller (opset 18's rule)
            step = -(-x.shape[axis] // count)
            sizes = [min(step, x.shape[axis] - i * step) for i in range(count)]
        return tuple(torch.split(x, sizes, dim=axis))

    return run


@op("Slice")
def _slice(ctx: NodeContext) -> Callable[..., Any]:
    def run(x: torch.Tensor, *args: torch.Tensor | None) -> torch.Tensor:
        if ctx.opset < 10:
            starts, ends = list(ctx.attr("starts")), list(ctx.attr("ends"))
            axes, steps = ctx.attr("axes"), None
        else:
            starts, ends = as_ints(args[0]), as_ints(args[1])
            axes = as_ints(args[2]) if len(args) > 2 and args[2] is not None else None
            steps = as_ints(args[3]) if len(args) > 3 and args[3] is not None else None
        axes = list(range(len(starts))) if axes is None else list(axes)
        steps = steps or [1] * len(starts)
        index: list[Any] = [slice(None)] * x.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            axis = axis + x.ndim if axis < 0 else axis
            dim = x.shape[axis]
            if step > 0:
                index[axis] = slice(*slice(start, end, step).indices(dim))
            else:  # torch has no negative steps: gather the indices ONNX names
                index[axis] = torch.arange(*slice(start, end, step).indices(dim), device=x.device)
        out = x
        for axis, ix in enumerate(index):
            if isinstance(ix, torch.Tensor):
                out = out.index_select(axis, ix)
                index[axis] = slice(None)
        return out[tuple(index)]

    return run


@op("Gather")
def _gather(ctx: NodeContext) -> Callable[..., Any]:
    axis = int(ctx.attr("axis", 0))

    def run(data: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        a = axis + data.ndim if axis < 0 else axis
        indices = indices.to(data.device)
        flat = indices.reshape(-1).long()
        flat = torch.where(flat < 0, flat + data.shape[a], flat)  # ONNX allows negatives
        out = data.index_select(a, flat)
        return out.reshape((*data.shape[:a], *indices.shape, *data.shape[a + 1 :]))

    return run


@op("Expand")
def _expand(ctx: NodeContext) -> Callable[..., Any]:
    # Bidirectional broadcast: the result has the larger of each dimension.
    return lambda x, shape: x.expand(torch.broadcast_shapes(x.shape, tuple(as_ints(shape))))


@op("Tile")
def _tile(ctx: NodeContext) -> Callable[..., Any]:
    return lambda x, repeats: x.repeat(as_ints(repeats))


@op("Range")
def _range(ctx: NodeContext) -> Callable[..., Any]:
    def run(start: torch.Tensor, limit: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype,
                            device=start.device)

    return run


@op("Where")
def _where(ctx: NodeContext) -> Callable[..., Any]:
    return lambda cond, x, y: torch.where(*aligned(cond, x, y))


@op("Pad")
def _pad(ctx: NodeContext) -> Callable[..., Any]:
    mode = ctx.attr("mode", "constant")
    modes = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}
    if mode not in modes:
        raise Unsupported(f"Pad mode={mode}")

    def run(x: torch.Tensor, pads: torch.Tensor | None = None, value: torch.Tensor | None = None,
            axes: torch.Tensor | None = None) -> torch.Tensor:
        amounts = list(ctx.attr("pads")) if ctx.opset < 11 else as_ints(pads)
        fill = float(ctx.attr("value", 0.0)) if ctx.opset < 11 else (
            0.0 if value is None else value.item())
        dims = as_ints(axes) if axes is not None else list(range(x.ndim))
        dims = [d + x.ndim if d < 0 else d for d in dims]
        n = len(dims)
        per_dim = {d: (amounts[i], amounts[i + n]) for i, d in enumerate(dims)}
        first = min((d for d, p in per_dim.items() if p != (0, 0)), default=x.ndim)
        spec: list[int] = []  # torch lists the last dimension first, down to the first padded
        for d in range(x.ndim - 1, first - 1, -1):
            spec += list(per_dim.get(d, (0, 0)))
        if not spec:
            return x
        if modes[mode] == "constant":
            return F.pad(x, spec, "constant", fill)
        return F.pad(x, spec, modes[mode])

    return run


@op("MatMul")
def _matmul(ctx: NodeContext) -> Callable[..., Any]:
    return lambda a, b: torch.matmul(*aligned(a, b))


@op("Gemm")
def _gemm(ctx: NodeContext) -> Callable[..., Any]:
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    trans_a, trans_b = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))

    def run(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
        a = a.t() if trans_a else a
        b = b.t() if trans_b else b
        if c is None:
            return torch.matmul(a, b) * alpha if alpha != 1.0 else torch.matmul(a, b)
        return torch.addmm(c, a, b, beta=beta, alpha=alpha)

    return run


@op("Einsum")
def _einsum(ctx: NodeContext) -> Callable[..., Any]:
    equation = ctx.attr("equation")
    return lambda *xs: torch.einsum(equation, *aligned(*xs))
