"""Exact FLOP counts per ONNX operator from inferred shapes.

Conventions (stated once so every count can be checked by hand):

- A multiply-accumulate is 2 FLOPs. Conv: ``2 * prod(Y) * prod(W.shape[1:])`` (this
  is exact for groups, since ``W`` is ``(Cout, Cin/groups, k...)``, and for
  dilation and padding, which only change ``Y``'s shape), plus ``prod(Y)`` for the
  bias. ConvTranspose: ``2 * prod(X) * prod(W.shape[1:])`` plus bias.
- MatMul: ``2 * prod(Y) * K`` with numpy broadcasting (batched attention chains
  ``Q @ K^T`` and ``P @ V`` count per head and batch). Gemm: ``2*M*N*K`` plus
  ``M*N`` for ``C``.
- LSTM/GRU/RNN (``G`` = 4/3/1 gates, ``H`` hidden, ``I`` input, ``D`` directions):
  per step, batch row and direction ``2*G*H*(I+H)`` for the two matrix products,
  ``2*G*H`` for the two bias vectors when present, and a fixed point-wise cost
  (LSTM ``9*H``: 3 sigmoid, 2 tanh, 3 mul, 1 add; GRU ``8*H``; RNN ``H``).
- Pooling: ``prod(Y) * prod(kernel)``; global pooling ``prod(X)``.
- BatchNormalization: 2 per element in inference (folded scale and shift), 5 in
  training mode (mean, variance, normalise, scale, shift); LayerNormalization,
  InstanceNormalization, GroupNormalization: 5 per element.
- Softmax/LogSoftmax: 3 per element (exp, sum, divide). Reductions: 1 per input
  element (ReduceMean adds 1 per output element).
- Element-wise arithmetic and activations: 1 per output element.
- Data movement (Reshape, Transpose, Concat, Gather, ...): 0 FLOPs, known.

Operators with no formula here are *unknown*: counted and reported, 0 FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Shape = tuple[int, ...]
# (input shapes, output shapes, attributes, node) -> FLOPs; shapes are None when unknown.
Formula = Callable[[Sequence["Shape | None"], Sequence["Shape | None"], dict], int]


class UnresolvedShape(Exception):
    """A shape needed by a formula is unknown (symbolic dimension left unbound)."""


def _n(shape: Shape | None) -> int:
    if shape is None:
        raise UnresolvedShape
    return math.prod(shape)


def _need(shapes: Sequence[Shape | None], i: int) -> Shape:
    if i >= len(shapes) or shapes[i] is None:
        raise UnresolvedShape
    return shapes[i]  # type: ignore[return-value]


def _has(shapes: Sequence[Shape | None], i: int) -> bool:
    return i < len(shapes) and shapes[i] is not None


def _conv(ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict) -> int:
    y, w = _need(outs, 0), _need(ins, 1)
    return 2 * _n(y) * math.prod(w[1:]) + (_n(y) if _has(ins, 2) else 0)


def _conv_transpose(ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict) -> int:
    x, w, y = _need(ins, 0), _need(ins, 1), _need(outs, 0)
    return 2 * _n(x) * math.prod(w[1:]) + (_n(y) if _has(ins, 2) else 0)


def _matmul(ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict) -> int:
    a, y = _need(ins, 0), _need(outs, 0)
    k = a[-1] if a else 1
    return 2 * max(1, _n(y)) * k


def _gemm(ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict) -> int:
    a, y = _need(ins, 0), _need(outs, 0)
    k = a[0] if attrs.get("transA", 0) else a[1]
    return 2 * _n(y) * k + (_n(y) if _has(ins, 2) else 0)


def _recurrent(gates: int, pointwise: int) -> Formula:
    def formula(ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict) -> int:
        x, w = _need(ins, 0), _need(ins, 1)
        layout = attrs.get("layout", 0)
        seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
        directions, gh, inp = w
        hidden = gh // gates
        per_step = 2 * gates * hidden * (inp + hidden) + pointwise * hidden
        if _has(ins, 3):
            per_step += 2 * gates * hidden
        return seq * batch * directions * per_step

    return formula


def _pool(ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict) -> int:
    return _n(_need(outs, 0)) * math.prod(attrs.get("kernel_shape", [1]))


def _per_input(k: int) -> Formula:
    return lambda ins, outs, attrs: k * _n(_need(ins, 0))


def _per_output(k: int) -> Formula:
    return lambda ins, outs, attrs: k * _n(_need(outs, 0))


def _batchnorm(ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict) -> int:
    training = attrs.get("training_mode", 0) or len(outs) > 1
    return (5 if training else 2) * _n(_need(ins, 0))


def _reduce_mean(ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict) -> int:
    return _n(_need(ins, 0)) + _n(_need(outs, 0))


def _zero(ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict) -> int:
    return 0


ELEMENTWISE = (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Sqrt",
    "Exp",
    "Log",
    "Neg",
    "Abs",
    "Reciprocal",
    "Relu",
    "LeakyRelu",
    "PRelu",
    "Elu",
    "Selu",
    "Celu",
    "Sigmoid",
    "HardSigmoid",
    "Tanh",
    "HardSwish",
    "Softplus",
    "Softsign",
    "Gelu",
    "Erf",
    "Clip",
    "Max",
    "Min",
    "Mean",
    "Sum",
    "Where",
    "Equal",
    "Greater",
    "GreaterOrEqual",
    "Less",
    "LessOrEqual",
    "Not",
    "And",
    "Or",
    "Xor",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Sin",
    "Cos",
    "Mish",
    "ThresholdedRelu",
    "Mod",
    "BitShift",
    "IsNaN",
    "IsInf",
    "Resize",
    "Upsample",
)
DATA_MOVEMENT = (
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "GatherElements",
    "GatherND",
    "Constant",
    "ConstantOfShape",
    "Shape",
    "Size",
    "Identity",
    "Pad",
    "Expand",
    "Tile",
    "Cast",
    "CastLike",
    "Range",
    "ScatterND",
    "ScatterElements",
    "DepthToSpace",
    "SpaceToDepth",
    "Dropout",
    "NonZero",
    "OneHot",
    "TopK",
    "ArgMax",
    "ArgMin",
    "Trilu",
    "EyeLike",
    "Compress",
    "SequenceConstruct",
)

FORMULAS: dict[str, Formula] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "LSTM": _recurrent(4, 9),
    "GRU": _recurrent(3, 8),
    "RNN": _recurrent(1, 1),
    "MaxPool": _pool,
    "AveragePool": _pool,
    "LpPool": _pool,
    "GlobalAveragePool": _per_input(1),
    "GlobalMaxPool": _per_input(1),
    "BatchNormalization": _batchnorm,
    "LayerNormalization": _per_input(5),
    "InstanceNormalization": _per_input(5),
    "GroupNormalization": _per_input(5),
    "LpNormalization": _per_input(3),
    "Softmax": _per_input(3),
    "LogSoftmax": _per_input(3),
    "ReduceMean": _reduce_mean,
    **{
        op: _per_input(1)
        for op in (
            "ReduceSum",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL1",
            "ReduceL2",
            "ReduceSumSquare",
            "ReduceLogSumExp",
            "ReduceLogSum",
        )
    },
    **{op: _per_output(1) for op in ELEMENTWISE},
    **{op: _zero for op in DATA_MOVEMENT},
}


def node_flops(
    op_type: str, ins: Sequence[Shape | None], outs: Sequence[Shape | None], attrs: dict
) -> int | None:
    """FLOPs of one node, or None when the operator has no formula (unknown)."""
    formula = FORMULAS.get(op_type)
    if formula is None:
        return None
    return int(formula(ins, outs, attrs))
