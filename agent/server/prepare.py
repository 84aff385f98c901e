"""Model preparation off the serving process: checks, folding and cutting in a worker.

Parsing a model, checking it, inferring its shapes and cutting it into atoms is
Python and C++ work that holds the interpreter lock for tens of milliseconds at a
time (a 24-layer MLP: 60 ms in one protobuf parse). Done on a server thread, it
stalls the executor loop as surely as a device run would. So it runs in a worker
process (``python -m agent.server.prepare``: one, started on first use or by
``start``, shared, at a lower CPU priority), which hands back serialized graphs;
the server only builds ONNX Runtime sessions from those bytes (which mostly
releases the lock) and times them in the loop's probe slices.

A hostile file that crashes the parser takes the worker down, not the server:
the registration is refused and the next one starts a fresh worker.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
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


_WORKER_CALLS = {"prepare_model": prepare_model, "split_at": split_at}
"""What the worker runs: these two, by name (nothing else crosses the pipe as code)."""


def _worker_main() -> None:
    """The worker: (call name, args) pickles in on stdin, (ok, value) pickles out."""
    with contextlib.suppress(OSError):  # not permitted: it still works, less politely
        os.nice(10)  # yield the CPU to the serving process
    # Answers go on a private copy of stdout; stray prints from libraries go to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    source = sys.stdin.buffer
    while True:
        try:
            name, args = pickle.load(source)
        except EOFError:  # the server closed the pipe: done
            return
        try:
            answer: tuple[bool, Any] = (True, _WORKER_CALLS[name](*args))
        except Exception as exc:  # every failure goes back to the registration
            answer = (False, exc)
        try:
            data = pickle.dumps(answer)
        except Exception as exc:  # an exception that cannot be pickled: its text
            data = pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
        out.write(data)
        out.flush()


class _Worker:
    """One worker process and its pipes; calls are serialized by the caller's lock."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # where ``agent`` is importable
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.server.prepare"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )  # fmt: skip

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        pickle.dump((name, args), self.proc.stdin)
        self.proc.stdin.flush()
        ok, value = pickle.load(self.proc.stdout)  # EOFError: the worker died
        if not ok:
            raise value
        return value

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class ModelPreparer:
    """Runs ``prepare_model`` and ``split_at`` in a worker process (or inline when asked)."""

    _lock = threading.Lock()
    _worker: _Worker | None = None

    def __init__(self, in_process: bool = False):
        self.in_process = in_process

    def start(self) -> None:
        """Start the worker now, so that its start-up (imports) is not met mid-serving."""
        if not self.in_process:
            with self._lock:
                self._get_worker()

    @classmethod
    def _get_worker(cls) -> _Worker:
        if cls._worker is None or cls._worker.proc.poll() is not None:
            cls._worker = _Worker()
            atexit.register(cls._worker.close)
        return cls._worker

    def _call(self, ref: str, name: str, *args: Any) -> Any:
        if self.in_process:
            return _WORKER_CALLS[name](*args)
        with self._lock:
            worker = self._get_worker()
            try:
                return worker.call(name, args)
            except (EOFError, BrokenPipeError, pickle.UnpicklingError) as exc:
                worker.close()  # the next registration starts a fresh one
                raise ModelRejected(
                    f"model {ref!r}: preparing it crashed the model worker"
                ) from exc

    def prepare(self, ref: str, limits: ModelLimits) -> PreparedModel:
        """The checked, folded and cut model; raises ModelRejected (422)."""
        return self._call(ref, "prepare_model", ref, limits)

    def split(self, ref: str, model: bytes, ends: list[int]) -> list[bytes]:
        """Segments of ``model`` ending after the given cuts, as bytes."""
        return self._call(ref, "split_at", model, ends)


if __name__ == "__main__":
    # Through the module's own name, so what it pickles is ``agent.server.prepare.*``.
    from agent.server.prepare import _worker_main as main

    main()
