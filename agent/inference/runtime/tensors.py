"""Decode and check request tensors (``.npy`` bodies and small JSON inputs), encode answers."""

from __future__ import annotations

import io
import threading
import tokenize
from collections.abc import Mapping
from typing import Any

import numpy as np

from agent.inference.errors import BadRequest
from contracts.bounded import BoundedMap

NPY_TYPE = "application/x-npy"

_HEADER_LOCK = threading.Lock()
"""numpy reads an .npy header with ``ast.literal_eval``; CPython 3.11 parses ASTs
from several threads wrongly now and then ("SystemError: AST constructor recursion
depth mismatch", a 500 to one request in a few thousand under load), so the HTTP
workers parse headers one at a time."""


def decode_npy(body: bytes) -> np.ndarray:
    """An array from an ``.npy`` body; never unpickles. The header is parsed once
    (numpy's ``np.load`` parses it again: a quarter of a request's decoding)."""
    shape, fortran, dtype, offset = _npy_header(body)
    if dtype.hasobject:
        raise BadRequest("body is not a valid .npy array: Object arrays cannot be loaded "
                         "when allow_pickle=False")
    flat = np.frombuffer(body, dtype, count=int(np.prod(shape, dtype=np.int64)), offset=offset)
    # A copy: the caller may write to it (``np.load`` gave a fresh array too).
    return (flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)).copy()


# What numpy's header reader raises on a header that is not a Python literal: it
# tokenizes the text first (TokenError on an unclosed bracket), then literal_evals
# it (SyntaxError, ValueError; RecursionError or MemoryError when nested deeply).
_HEADER_ERRORS = (ValueError, OSError, EOFError, SyntaxError, TypeError,
                  tokenize.TokenError, RecursionError, MemoryError)


_HEADERS: BoundedMap[bytes, tuple[tuple[int, ...], bool, np.dtype, int]] = BoundedMap(64)
"""Headers parsed before, by their bytes: a session's clients send one header again and
again, and parsing it (a tokenizer and ``ast.literal_eval``) was a few percent of a
request's CPU. Only a header that parsed is kept; an equal one parses equally."""


def _header_end(body: bytes) -> int:
    """Where an ``.npy`` header would end by its length field (0 when there is none)."""
    if len(body) < 10 or not body.startswith(b"\x93NUMPY"):
        return 0
    if body[6] == 1:
        return 10 + int.from_bytes(body[8:10], "little")
    return 12 + int.from_bytes(body[8:12], "little") if len(body) >= 12 else 0


def _npy_header(body: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Shape, Fortran order, dtype and the data's offset of an ``.npy`` body; BadRequest
    when the header does not parse, or its shape claims other than the bytes that
    follow it.

    numpy allocates what the header claims before reading the data, so a 100-byte
    body claiming (2^40, 4) floats would ask for 16 TiB.
    """
    known = _HEADERS.get(body[:_header_end(body)])
    if known is not None:
        shape, fortran, dtype, offset = known
    else:
        stream = io.BytesIO(body)
        try:
            version = np.lib.format.read_magic(stream)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                else np.lib.format.read_array_header_2_0
            with _HEADER_LOCK:
                shape, fortran, dtype = reader(stream)
        except _HEADER_ERRORS as exc:
            raise BadRequest(f"body is not a valid .npy array: its header does not parse "
                             f"({type(exc).__name__}: {exc})") from None
        offset = stream.tell()
        _HEADERS.put(body[:offset], (shape, fortran, dtype, offset))
    if dtype.hasobject:
        return shape, fortran, dtype, offset
    claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    present = len(body) - offset
    if claimed != present:
        raise BadRequest(f"body is not a valid .npy array: the header claims shape {shape} "
                         f"({claimed} bytes) but {present} bytes follow it")
    return shape, fortran, dtype, offset


def decode_json_inputs(document: Any, dtype: np.dtype) -> np.ndarray:
    """The single tensor of ``{"inputs": {NAME: nested list}}``, as ``dtype``."""
    if not isinstance(document, Mapping) or set(document) != {"inputs"}:
        raise BadRequest('JSON body must be {"inputs": {NAME: [...]}}')
    inputs = document["inputs"]
    if not isinstance(inputs, Mapping) or len(inputs) != 1:
        raise BadRequest('"inputs" must map exactly one input name to a nested list')
    (value,) = inputs.values()
    try:
        # A number the input's type cannot hold (10e38 as float32) is refused, not run as inf.
        with np.errstate(over="raise", invalid="raise"):
            array = np.asarray(value, dtype=dtype)
    except FloatingPointError as exc:
        raise BadRequest(f"input holds a number out of range for {dtype}") from exc
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
