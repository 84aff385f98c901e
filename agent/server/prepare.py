"""Model preparation off the serving process: checks, folding and cutting in a worker.

Parsing a model, checking it, inferring its shapes and cutting it into atoms is
Python and C++ work that holds the interpreter lock for tens of milliseconds at a
time (a 24-layer MLP: 60 ms in one protobuf parse). Done on a server thread, it
stalls the executor loop as surely as a device run would. So it runs in a worker
process (one, spawned on first use and shared), which hands back serialized
graphs; the server only builds ONNX Runtime sessions from those bytes (which
releases the lock) and times them in the loop's probe slices.

A hostile file that crashes the parser takes the worker down, not the server:
the registration is refused and the next one starts a fresh worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.server.errors import ModelRejected

if TYPE_CHECKING:
    from agent.server.executors import ModelLimits


@dataclass(frozen=True)
class PreparedModel:
    """A checked, constant-folded model as bytes, with its atoms (cut at every valid cut)."""

    ref: str
    model: bytes
    input_name: str
    input_dtype: np.dtype
    sample_shape: tuple[int | None, ...]
    cuts: int
    atoms: tuple[bytes, ...]


def prepare_model(ref: str, limits: ModelLimits) -> PreparedModel:
    """Check (size limits first, no runtime session), fold constants, find cuts and atoms."""
    from agent.server.modelcheck import check_model_file
    from agent.server.segments import SegmentError, atoms, find_cuts, fold_constants

    model, input_name, dtype, sample_shape = check_model_file(ref, limits)
    # Cuts and segments are found on the folded graph (segments.py says why).
    model = fold_constants(model)
    try:
        cuts = find_cuts(model)
        pieces = atoms(model) if cuts else []
    except SegmentError:
        cuts, pieces = [], []
    return PreparedModel(
        ref, model.SerializeToString(), input_name, dtype, sample_shape, len(cuts),
        tuple(p.SerializeToString() for p in pieces) if len(pieces) >= 2 else (),
    )  # fmt: skip


def split_at(model: bytes, ends: list[int]) -> list[bytes]:
    """The model split after atoms ``ends`` (indices into its cuts), as bytes per segment."""
    import onnx

    from agent.server.segments import find_cuts, split_model

    proto = onnx.ModelProto()
    proto.ParseFromString(model)
    cuts = find_cuts(proto)
    return [p.SerializeToString() for p in split_model(proto, [cuts[i] for i in ends])]


def _lower_priority() -> None:
    """The worker yields the CPU to the serving process (the host runs the loop too)."""
    with contextlib.suppress(OSError):  # not permitted: it still works, less politely
        os.nice(10)


class ModelPreparer:
    """Runs ``prepare_model`` and ``split_at`` in a worker process (or inline when asked)."""

    _lock = threading.Lock()
    _pool: ProcessPoolExecutor | None = None

    def __init__(self, in_process: bool = False):
        self.in_process = in_process

    def start(self) -> None:
        """Start the worker now, so that its start-up (imports) is not met mid-serving."""
        if not self.in_process:
            self._worker().submit(int).result()

    @classmethod
    def _worker(cls) -> ProcessPoolExecutor:
        with cls._lock:
            if cls._pool is None:
                # spawn: the server has threads, and a forked copy of them is not safe.
                cls._pool = ProcessPoolExecutor(
                    1, multiprocessing.get_context("spawn"), initializer=_lower_priority
                )
            return cls._pool

    @classmethod
    def _reset(cls, broken: ProcessPoolExecutor) -> None:
        with cls._lock:
            if cls._pool is broken:
                cls._pool = None
        broken.shutdown(wait=False, cancel_futures=True)

    def _call(self, ref: str, fn: Any, *args: Any) -> Any:
        if self.in_process:
            return fn(*args)
        pool = self._worker()
        try:
            return pool.submit(fn, *args).result()
        except BrokenProcessPool as exc:
            self._reset(pool)
            raise ModelRejected(f"model {ref!r}: preparing it crashed the model worker") from exc

    def prepare(self, ref: str, limits: ModelLimits) -> PreparedModel:
        """The checked, folded and cut model; raises ModelRejected (422)."""
        return self._call(ref, prepare_model, ref, limits)

    def split(self, ref: str, model: bytes, ends: list[int]) -> list[bytes]:
        """Segments of ``model`` ending after the given cuts, as bytes."""
        return self._call(ref, split_at, model, ends)
