"""ONNX neural-network operators as torch calls: convolution, pooling, normalization,
softmax and reductions (``NN_OPS``; ``onnx_torch_ops.OPS`` includes them).

ONNX pads each spatial axis at both ends independently; torch's convolution and
pooling pad symmetrically. Symmetric pads go to torch as they are; asymmetric ones
(and ``auto_pad`` SAME, computed from the input's shape) are applied with
``F.pad`` first, with the value that keeps the operator's meaning (0 for
convolution, -inf for max pooling, and for average pooling without padded
elements in the count, a sum over a padded ones mask as the divisor).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)

from agent.inference.executors.onnx_torch import Builder, NodeContext, Unsupported, as_ints

NN_OPS: dict[str, Builder] = {}

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _op(*names: str) -> Callable[[Builder], Builder]:
    def register(builder: Builder) -> Builder:
        for name in names:
            NN_OPS[name] = builder
        return builder

    return register


class _Window:
    """Kernel, strides, dilations and the pads rule of a convolution or pooling node."""

    def __init__(self, ctx: NodeContext, kernel: list[int] | None):
        self.kernel = kernel
        self.auto_pad = ctx.attr("auto_pad", "NOTSET")
        if self.auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
            raise Unsupported(f"{ctx.node.op_type} auto_pad={self.auto_pad}")
        self.strides = ctx.attr("strides")
        self.dilations = ctx.attr("dilations")
        self.pads = ctx.attr("pads")

    def resolve(self, x: torch.Tensor, kernel: list[int]) -> tuple[list, list, list, list]:
        """(strides, dilations, begin pads, end pads) for input ``x``."""
        n = x.ndim - 2
        strides = list(self.strides or [1] * n)
        dilations = list(self.dilations or [1] * n)
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            begin, end = [], []
            for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations, strict=True):
                total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
                small, big = total // 2, total - total // 2
                begin.append(small if self.auto_pad == "SAME_UPPER" else big)
                end.append(big if self.auto_pad == "SAME_UPPER" else small)
            return strides, dilations, begin, end
        pads = list(self.pads or [0] * 2 * n) if self.auto_pad == "NOTSET" else [0] * 2 * n
        return strides, dilations, pads[:n], pads[n:]


def _torch_pads(begin: list[int], end: list[int]) -> list[int]:
    """ONNX begin/end pads per axis in F.pad's order (the last axis first)."""
    out: list[int] = []
    for b, e in zip(reversed(begin), reversed(end), strict=True):
        out += [b, e]
    return out


@_op("Conv")
def _conv(ctx: NodeContext) -> Callable[..., Any]:
    window, group = _Window(ctx, ctx.attr("kernel_shape")), int(ctx.attr("group", 1))

    def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        n = x.ndim - 2
        if n not in _CONV:
            raise RuntimeError(f"Conv over {n} spatial axes")
        strides, dilations, begin, end = window.resolve(x, list(w.shape[2:]))
        if begin != end:
            x, begin = F.pad(x, _torch_pads(begin, end)), [0] * n
        return _CONV[n](x, w, b, strides, begin, dilations, group)

    return run


@_op("ConvTranspose")
def _conv_transpose(ctx: NodeContext) -> Callable[..., Any]:
    if ctx.attr("output_shape") is not None or ctx.attr("auto_pad", "NOTSET") != "NOTSET":
        raise Unsupported("ConvTranspose with output_shape or auto_pad")
    window, group = _Window(ctx, ctx.attr("kernel_shape")), int(ctx.attr("group", 1))
    output_padding = ctx.attr("output_padding")

    def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        n = x.ndim - 2
        strides, dilations, begin, end = window.resolve(x, list(w.shape[2:]))
        out = _CONV_T[n](x, w, b, strides, 0, list(output_padding or [0] * n), group, dilations)
        # Output pads crop the full result at each end (they may differ per end).
        index = [slice(None), slice(None)] + [
            slice(bg, out.shape[2 + i] - e) for i, (bg, e) in enumerate(zip(begin, end,
                                                                              strict=True))]
        return out[tuple(index)]

    return run


def _pool_kernel(ctx: NodeContext) -> list[int]:
    kernel = ctx.attr("kernel_shape")
    if kernel is None:
        raise Unsupported(f"{ctx.node.op_type} without kernel_shape")
    return list(kernel)


@_op("MaxPool")
def _max_pool(ctx: NodeContext) -> Callable[..., Any]:
    if ctx.needs_output(1):
        raise Unsupported("MaxPool with its Indices output")
    kernel = _pool_kernel(ctx)
    window, ceil = _Window(ctx, kernel), bool(ctx.attr("ceil_mode", 0))

    def run(x: torch.Tensor) -> torch.Tensor:
        n = len(kernel)
        strides, dilations, begin, end = window.resolve(x, kernel)
        # torch pads at most half a kernel, symmetrically; anything else is padded first.
        if begin != end or any(p > k // 2 for p, k in zip(begin, kernel, strict=True)):
            x, begin = F.pad(x, _torch_pads(begin, end), value=-math.inf), [0] * n
        return _MAX[n](x, kernel, strides, begin, dilations, ceil_mode=ceil)

    return run


@_op("AveragePool")
def _average_pool(ctx: NodeContext) -> Callable[..., Any]:
    kernel = _pool_kernel(ctx)
    if any(d != 1 for d in ctx.attr("dilations") or []):
        raise Unsupported("AveragePool with dilations")
    window, ceil = _Window(ctx, kernel), bool(ctx.attr("ceil_mode", 0))
    include = bool(ctx.attr("count_include_pad", 0))

    def run(x: torch.Tensor) -> torch.Tensor:
        n = len(kernel)
        strides, _, begin, end = window.resolve(x, kernel)
        if begin == end and all(p <= k // 2 for p, k in zip(begin, kernel, strict=True)):
            return _AVG[n](x, kernel, strides, begin, ceil_mode=ceil, count_include_pad=include)
        pads = _torch_pads(begin, end)
        total = _AVG[n](F.pad(x, pads), kernel, strides, 0, ceil_mode=ceil)
        if include:
            return total
        ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
        return total / _AVG[n](F.pad(ones, pads), kernel, strides, 0, ceil_mode=ceil)

    return run


@_op("GlobalAveragePool")
def _global_average_pool(ctx: NodeContext) -> Callable[..., Any]:
    return lambda x: x.mean(dim=tuple(range(2, x.ndim)), keepdim=True)


@_op("GlobalMaxPool")
def _global_max_pool(ctx: NodeContext) -> Callable[..., Any]:
    return lambda x: x.amax(dim=tuple(range(2, x.ndim)), keepdim=True)


@_op("BatchNormalization")
def _batch_norm(ctx: NodeContext) -> Callable[..., Any]:
    if any(ctx.needs_output(i) for i in (1, 2, 3, 4)):
        raise Unsupported("BatchNormalization with running statistics outputs")
    eps, training = float(ctx.attr("epsilon", 1e-5)), bool(ctx.attr("training_mode", 0))

    def run(x, scale, bias, mean, var):  # type: ignore[no-untyped-def]
        if training:  # batch statistics; the stored ones are neither read nor updated
            return F.batch_norm(x, None, None, scale, bias, True, 0.0, eps)
        return F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)

    return run


@_op("LayerNormalization")
def _layer_norm(ctx: NodeContext) -> Callable[..., Any]:
    if ctx.needs_output(1) or ctx.needs_output(2):
        raise Unsupported("LayerNormalization with Mean/InvStdDev outputs")
    axis, eps = int(ctx.attr("axis", -1)), float(ctx.attr("epsilon", 1e-5))

    def run(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        a = axis + x.ndim if axis < 0 else axis
        shape = tuple(x.shape[a:])
        if tuple(scale.shape) == shape and (bias is None or tuple(bias.shape) == shape):
            return F.layer_norm(x, shape, scale, bias, eps)
        out = F.layer_norm(x, shape, None, None, eps) * scale  # broadcast scale and bias
        return out if bias is None else out + bias

    return run


@_op("Softmax", "LogSoftmax")
def _softmax(ctx: NodeContext) -> Callable[..., Any]:
    fn = F.softmax if ctx.node.op_type == "Softmax" else F.log_softmax
    if ctx.opset >= 13:
        axis = int(ctx.attr("axis", -1))
        return lambda x: fn(x, dim=axis)
    axis = int(ctx.attr("axis", 1))  # before 13: over the input flattened to 2-D at axis

    def run(x: torch.Tensor) -> torch.Tensor:
        a = axis + x.ndim if axis < 0 else axis
        return fn(x.reshape(math.prod(x.shape[:a]), -1), dim=1).reshape(x.shape)

    return run


# The opset from which each reduction takes its axes as an input, not an attribute.
_REDUCE = {"ReduceMean": (torch.mean, 18), "ReduceSum": (torch.sum, 13),
           "ReduceMax": (torch.amax, 18), "ReduceMin": (torch.amin, 18)}  # fmt: skip


@_op(*_REDUCE)
def _reduce(ctx: NodeContext) -> Callable[..., Any]:
    fn, since = _REDUCE[ctx.node.op_type]
    keep, noop = bool(ctx.attr("keepdims", 1)), bool(ctx.attr("noop_with_empty_axes", 0))
    attr_axes = ctx.attr("axes")

    def run(x: torch.Tensor, axes_in: torch.Tensor | None = None) -> torch.Tensor:
        axes = as_ints(axes_in) if ctx.opset >= since else list(attr_axes or [])
        if not axes:
            if noop:
                return x
            axes = list(range(x.ndim))
        return fn(x, dim=tuple(axes), keepdim=keep)

    return run


@_op("ArgMax", "ArgMin")
def _arg(ctx: NodeContext) -> Callable[..., Any]:
    if int(ctx.attr("select_last_index", 0)):
        raise Unsupported(f"{ctx.node.op_type} select_last_index=1")
    fn = torch.argmax if ctx.node.op_type == "ArgMax" else torch.argmin
    axis, keep = int(ctx.attr("axis", 0)), bool(ctx.attr("keepdims", 1))
    return lambda x: fn(x, dim=axis, keepdim=keep)
