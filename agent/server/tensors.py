"""Decode and check request tensors (``.npy`` bodies and small JSON inputs), encode answers."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from agent.server.errors import BadRequest

NPY_TYPE = "application/x-npy"


def decode_npy(body: bytes) -> np.ndarray:
    """An array from an ``.npy`` body; never unpickles.

    The header is checked against the body first: a header claiming (2^40, 4) floats
    would otherwise make numpy allocate them before noticing the data is missing.
    """
    stream = io.BytesIO(body)
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = npy_format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, _, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise BadRequest(f".npy version {version[0]}.{version[1]} is not supported; "
                             "send 1.0 or 2.0")
    except (ValueError, OSError, EOFError, TypeError, SyntaxError) as exc:
        raise BadRequest(f"body is not a valid .npy array: {exc}") from exc
    if dtype.hasobject:
        raise BadRequest("body must not hold Python objects")
    claimed = math.prod(shape) * dtype.itemsize
    if claimed != len(body) - stream.tell():
        raise BadRequest(f"the .npy header claims shape {list(shape)} of {dtype} "
                         f"({claimed} bytes) but the body carries {len(body) - stream.tell()}")
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BadRequest(f"body is not a valid .npy array: {exc}") from exc
    if not isinstance(array, np.ndarray):
        raise BadRequest("body must hold one array, not an archive")
    return array


def decode_json_inputs(document: Any, dtype: np.dtype) -> np.ndarray:
    """The single tensor of ``{"inputs": {NAME: nested list}}``, as ``dtype``."""
    if not isinstance(document, Mapping) or set(document) != {"inputs"}:
        raise BadRequest('JSON body must be {"inputs": {NAME: [...]}}')
    inputs = document["inputs"]
    if not isinstance(inputs, Mapping) or len(inputs) != 1:
        raise BadRequest('"inputs" must map exactly one input name to a nested list')
    (value,) = inputs.values()
    try:
        array = np.asarray(value, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"input is not a rectangular array of numbers: {exc}") from exc
    return array


def coerce_input(
    array: np.ndarray, dtype: np.dtype, sample_shape: tuple[int | None, ...] | None, single: bool
) -> np.ndarray:
    """Check dtype and shape; add the batch dimension when the client left it out.

    ``single`` (SLO sessions): exactly one sample, since the server forms the batches.
    """
    if array.dtype != dtype:
        if array.dtype.kind in "OSUV" or not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise BadRequest(f"input dtype {array.dtype} does not match the model's {dtype}")
        array = array.astype(dtype)
    if sample_shape is None:
        if array.ndim == 0:
            array = array.reshape(1)
    elif array.ndim == len(sample_shape):
        array = array[np.newaxis, ...]
    if sample_shape is not None and (
        array.ndim != len(sample_shape) + 1
        or any(
            want is not None and got != want
            for got, want in zip(array.shape[1:], sample_shape, strict=True)
        )
    ):
        raise BadRequest(
            f"input shape {list(array.shape)} does not match [batch, "
            f"{', '.join('?' if d is None else str(d) for d in sample_shape)}]"
        )
    if array.shape[0] < 1:
        raise BadRequest("input has an empty batch dimension")
    if single and array.shape[0] != 1:
        raise BadRequest(f"an SLO session takes one sample per request, got {array.shape[0]}")
    return np.ascontiguousarray(array)


def encode_npy(array: np.ndarray) -> bytes:
    """An ``.npy`` body."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()
