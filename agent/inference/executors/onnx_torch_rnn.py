"""ONNX LSTM and GRU as torch ``nn.LSTM`` / ``nn.GRU`` layers (``RNN_OPS``).

The weights are graph constants, so each node's torch layer is built on its first
run from the tensors it is given (gates reordered from ONNX's to torch's) and kept:
on CUDA that is cuDNN's fused kernel over one flattened weight buffer. What torch's
layers cannot compute (peepholes, per-sample sequence lengths, other activations,
clipping, a GRU applying its reset gate before the linear map) is refused at build.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agent.inference.executors.onnx_torch import Builder, NodeContext, Unsupported

RNN_OPS: dict[str, Builder] = {}

# ONNX gate blocks -> torch's order: LSTM i,o,f,c -> i,f,g(c),o; GRU z,r,h -> r,z,n.
_ORDER = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2)}
_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _check(ctx: NodeContext) -> None:
    kind, node = ctx.node.op_type, ctx.node
    acts = [a.decode() if isinstance(a, bytes) else a for a in ctx.attr("activations") or []]
    dirs = 2 if ctx.attr("direction", "forward") == "bidirectional" else 1
    if acts and acts != _DEFAULT_ACTIVATIONS[kind] * dirs:
        raise Unsupported(f"{kind} activations={acts}")
    if ctx.attr("clip") is not None or ctx.attr("activation_alpha") is not None:
        raise Unsupported(f"{kind} with clip or activation parameters")
    if len(node.input) > 4 and node.input[4]:
        raise Unsupported(f"{kind} with sequence_lens")
    if kind == "LSTM" and (int(ctx.attr("input_forget", 0))
                           or (len(node.input) > 7 and node.input[7])):
        raise Unsupported("LSTM with peepholes or input_forget")
    if kind == "GRU" and int(ctx.attr("linear_before_reset", 0)) != 1:
        raise Unsupported("GRU with linear_before_reset=0")


def _reorder(weights: torch.Tensor, kind: str) -> torch.Tensor:
    blocks = weights.chunk(len(_ORDER[kind]), dim=0)
    return torch.cat([blocks[i] for i in _ORDER[kind]], dim=0)


def _layer(kind: str, w: torch.Tensor, r: torch.Tensor, b: torch.Tensor | None,
           hidden: int, batch_first: bool) -> torch.nn.Module:
    dirs = w.shape[0]
    cls = torch.nn.LSTM if kind == "LSTM" else torch.nn.GRU
    layer = cls(w.shape[2], hidden, batch_first=batch_first, bidirectional=dirs == 2)
    gates = len(_ORDER[kind]) * hidden
    with torch.no_grad():
        for d in range(dirs):
            suffix = "_l0_reverse" if d == 1 else "_l0"
            bias = b[d] if b is not None else torch.zeros(2 * gates, dtype=w.dtype)
            getattr(layer, "weight_ih" + suffix).copy_(_reorder(w[d], kind))
            getattr(layer, "weight_hh" + suffix).copy_(_reorder(r[d], kind))
            getattr(layer, "bias_ih" + suffix).copy_(_reorder(bias[:gates], kind))
            getattr(layer, "bias_hh" + suffix).copy_(_reorder(bias[gates:], kind))
    layer = layer.to(device=w.device, dtype=w.dtype).eval()
    layer.flatten_parameters()  # one weight buffer: cuDNN's fast path on CUDA
    return layer


def _rnn(ctx: NodeContext) -> Callable[..., Any]:
    _check(ctx)
    kind, hidden = ctx.node.op_type, int(ctx.attr("hidden_size"))
    direction = ctx.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    batch_first = int(ctx.attr("layout", 0)) == 1
    seq_axis = 1 if batch_first else 0
    built: dict[tuple[int, ...], torch.nn.Module] = {}

    def state(s: torch.Tensor | None) -> torch.Tensor | None:
        # ONNX states are [dirs, batch, H] ([batch, dirs, H] with layout 1); torch's the first.
        return None if s is None else (s.transpose(0, 1) if batch_first else s).contiguous()

    def run(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, b: torch.Tensor | None = None,
            _lens: Any = None, h0: torch.Tensor | None = None, c0: torch.Tensor | None = None,
            _peep: Any = None) -> tuple[torch.Tensor, ...]:
        key = (id(w), id(r), id(b))  # the graph's constants: one layer per node
        layer = built.get(key)
        if layer is None:
            built.clear()
            layer = built[key] = _layer(kind, w, r, b, hidden, batch_first)
        if direction == "reverse":
            x = x.flip(seq_axis)
        batch = x.shape[1 - seq_axis]
        zeros = torch.zeros(dirs, batch, hidden, dtype=x.dtype, device=x.device)
        h, c = state(h0), state(c0)
        if kind == "LSTM":
            y, (h_n, c_n) = layer(x, (zeros if h is None else h, zeros if c is None else c))
        else:
            y, h_n = layer(x, zeros if h is None else h)
            c_n = None
        if direction == "reverse":
            y = y.flip(seq_axis)
        if batch_first:  # Y [batch, seq, dirs, H]; Y_h [batch, dirs, H]
            outs = [y.reshape(batch, x.shape[1], dirs, hidden), h_n.transpose(0, 1)]
            outs += [c_n.transpose(0, 1)] if c_n is not None else []
        else:  # Y [seq, dirs, batch, H]; Y_h [dirs, batch, H]
            outs = [y.reshape(x.shape[0], batch, dirs, hidden).permute(0, 2, 1, 3), h_n]
            outs += [c_n] if c_n is not None else []
        return tuple(outs)

    return run


RNN_OPS["LSTM"] = RNN_OPS["GRU"] = _rnn
