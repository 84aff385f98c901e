"""Model preparation off the serving process: checks, folding and cutting in a worker.

Parsing a model, checking it, inferring its shapes and cutting it into atoms is
Python and C++ work that holds the interpreter lock for tens of milliseconds at a
time (a 24-layer MLP: 60 ms in one protobuf parse). Done on a server thread, it
stalls the executor loop as surely as a device run would. So it runs in a worker
process (``python -m agent.inference.preparation.prepare``: one, started on first use or by
``start``, shared, at a lower CPU priority), which hands back serialized graphs;
the server only builds ONNX Runtime sessions from those bytes (which mostly
releases the lock) and times them in the loop's probe slices.

A hostile file that crashes the parser takes the worker down, not the server:
the registration is refused and the next one starts a fresh worker. The worker is
the process that reads untrusted files, so nothing it sends back is executable:
messages are a JSON header plus length-prefixed byte blobs (never pickles), with
bounded sizes, and only the server's own error types are rebuilt from them.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.inference.errors import BadRequest, ModelRejected, ServerError

if TYPE_CHECKING:
    from agent.inference.preparation.limits import ModelLimits


@dataclass(frozen=True)
class PreparedModel:
    """A checked, constant-folded model as bytes, with its atoms (cut at every valid cut
    once long convolutions are in row tiles, ``tiling.py``; ``model`` is untiled)."""

    ref: str
    model: bytes
    input_name: str
    input_dtype: np.dtype
    sample_shape: tuple[int | None, ...]
    cuts: int
    atoms: tuple[bytes, ...]
    cut_nodes: tuple[int, ...] = ()
    """Where ``model``'s own cuts are: the node each one follows (the torch executor splits
    by node, and runs no tiles)."""


def prepare_model(ref: str, limits: ModelLimits) -> PreparedModel:
    """Check (size limits first, no runtime session), fold constants, find cuts and atoms."""
    from agent.inference.preparation.modelcheck import check_model_file
    from agent.inference.preparation.segments import SegmentError, atoms, find_cuts, fold_constants

    model, input_name, dtype, sample_shape = check_model_file(ref, limits)
    # Cuts and segments are found on the folded graph (segments.py says why).
    model = fold_constants(model)
    try:
        cuts = find_cuts(model)
        pieces = atoms(model)  # long convolutions in row tiles: cuts the model lacks
    except SegmentError:
        cuts, pieces = [], []
    return PreparedModel(
        ref, model.SerializeToString(), input_name, dtype, sample_shape, len(cuts),
        tuple(p.SerializeToString() for p in pieces) if len(pieces) >= 2 else (),
        tuple(c.after_node for c in cuts) if len(pieces) >= 2 else (),
    )  # fmt: skip


def split_at(model: bytes, ends: list[int]) -> list[bytes]:
    """The model split after atoms ``ends`` (indices into its cuts), as bytes per segment."""
    import onnx

    from agent.inference.preparation.segments import find_cuts, split_model
    from agent.inference.preparation.tiling import tile_convs

    proto = onnx.ModelProto()
    proto.ParseFromString(model)
    proto = tile_convs(proto)  # the graph ``atoms`` cut: the same cuts, in the same order
    cuts = find_cuts(proto)
    return [p.SerializeToString() for p in split_model(proto, [cuts[i] for i in ends])]


_MAX_HEADER_BYTES = 1 << 20
_MAX_BLOB_BYTES = 8 << 30
_MAX_BLOBS = 100_000


class WorkerProtocolError(Exception):
    """A message from the other side is malformed or over a size bound."""


def _read_exact(source: Any, n: int) -> bytes:
    data = source.read(n)
    if data is None or len(data) != n:
        raise EOFError("pipe closed mid-message")
    return data


def write_message(sink: Any, header: dict[str, Any], blobs: list[bytes] = ()) -> None:
    """One message: 4-byte header length, the JSON header, then each blob with an 8-byte length."""
    head = json.dumps({**header, "blobs": len(blobs)}, default=str).encode()
    sink.write(struct.pack(">I", len(head)) + head)
    for blob in blobs:
        sink.write(struct.pack(">Q", len(blob)))
        sink.write(blob)
    sink.flush()


def read_message(source: Any) -> tuple[dict[str, Any], list[bytes]]:
    """The next message; EOFError when the pipe is closed before one starts."""
    raw = source.read(4)
    if not raw:
        raise EOFError("pipe closed")
    if len(raw) != 4:
        raise EOFError("pipe closed mid-message")
    (size,) = struct.unpack(">I", raw)
    if size > _MAX_HEADER_BYTES:
        raise WorkerProtocolError(f"header of {size} bytes")
    try:
        header = json.loads(_read_exact(source, size))
    except ValueError:
        raise WorkerProtocolError("header is not JSON") from None
    count = header.get("blobs") if isinstance(header, dict) else None
    if not isinstance(count, int) or not 0 <= count <= _MAX_BLOBS:
        raise WorkerProtocolError("bad blob count")
    blobs = []
    for _ in range(count):
        (length,) = struct.unpack(">Q", _read_exact(source, 8))
        if length > _MAX_BLOB_BYTES:
            raise WorkerProtocolError(f"blob of {length} bytes")
        blobs.append(_read_exact(source, length))
    return header, blobs


def _limits_to_json(limits: ModelLimits) -> dict[str, Any]:
    values = dataclasses.asdict(limits)
    values["store_root"] = None if limits.store_root is None else str(limits.store_root)
    return values


def _limits_from_json(values: dict[str, Any]) -> ModelLimits:
    from agent.inference.preparation.limits import ModelLimits

    root = values.get("store_root")
    return ModelLimits(**{**values, "store_root": None if root is None else Path(root),
                          "profile_batches": tuple(values["profile_batches"])})


def _answer(header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
    """Run one request in the worker; the answer as a header and blobs."""
    if header.get("call") == "prepare_model":
        model = prepare_model(str(header["ref"]), _limits_from_json(header["limits"]))
        return ({"ok": True, "ref": model.ref, "input_name": model.input_name,
                 "dtype": model.input_dtype.str, "sample_shape": list(model.sample_shape),
                 "cuts": model.cuts, "cut_nodes": list(model.cut_nodes)},
                [model.model, *model.atoms])
    if header.get("call") == "split_at":
        return {"ok": True}, split_at(blobs[0], [int(e) for e in header["ends"]])
    raise WorkerProtocolError(f"unknown call {header.get('call')!r}")


def _worker_main() -> None:
    """The worker: requests in on stdin, answers out on stdout, one message each."""
    with contextlib.suppress(OSError):  # not permitted: it still works, less politely
        os.nice(10)  # yield the CPU to the serving process
    # Answers go on a private copy of stdout; stray prints from libraries go to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    source = sys.stdin.buffer
    while True:
        try:
            header, blobs = read_message(source)
        except EOFError:  # the server closed the pipe: done
            return
        try:
            answer, data = _answer(header, blobs)
        except ServerError as exc:  # a refusal with its details, rebuilt on the other side
            answer, data = {"ok": False, "error": type(exc).__name__, "message": exc.message,
                            "details": exc.details}, []
        except Exception as exc:  # every other failure: its text
            answer, data = {"ok": False, "error": None,
                            "message": f"{type(exc).__name__}: {exc}"}, []
        write_message(out, answer, data)


def _raise_from(ref: str, header: dict[str, Any]) -> None:
    """Rebuild a worker's failure: only the server's own error types, else a 422."""
    message = str(header.get("message", "preparation failed"))
    details = header.get("details") if isinstance(header.get("details"), dict) else {}
    kind = {cls.__name__: cls for cls in (ModelRejected, BadRequest)}.get(
        str(header.get("error")))
    if kind is not None:
        raise kind(message, **details)
    raise ModelRejected(f"model {ref!r}: {message}")


class _Worker:
    """One worker process and its pipes; calls are serialized by the caller's lock."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # where ``agent`` is importable
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        # ``-m`` puts the working directory first on the path: started there, a server
        # whose working directory holds another checkout would prepare with its code.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.inference.preparation.prepare"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=root,
        )  # fmt: skip

    def call(self, ref: str, header: dict[str, Any], blobs: list[bytes] = ()
             ) -> tuple[dict[str, Any], list[bytes]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        write_message(self.proc.stdin, header, list(blobs))
        answer, data = read_message(self.proc.stdout)  # EOFError: the worker died
        if not answer.get("ok"):
            _raise_from(ref, answer)
        return answer, data

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

    def _call(self, ref: str, header: dict[str, Any], blobs: list[bytes] = ()
              ) -> tuple[dict[str, Any], list[bytes]]:
        with self._lock:
            worker = self._get_worker()
            try:
                return worker.call(ref, header, blobs)
            except (EOFError, BrokenPipeError, WorkerProtocolError) as exc:
                worker.close()  # the next registration starts a fresh one
                raise ModelRejected(
                    f"model {ref!r}: preparing it crashed the model worker"
                ) from exc

    def prepare(self, ref: str, limits: ModelLimits) -> PreparedModel:
        """The checked, folded and cut model; raises ModelRejected (422)."""
        if self.in_process:
            return prepare_model(ref, limits)
        answer, blobs = self._call(ref, {"call": "prepare_model", "ref": ref,
                                         "limits": _limits_to_json(limits)})
        if not blobs:
            raise ModelRejected(f"model {ref!r}: the model worker sent no model")
        return PreparedModel(
            str(answer["ref"]), blobs[0], str(answer["input_name"]), np.dtype(answer["dtype"]),
            tuple(None if d is None else int(d) for d in answer["sample_shape"]),
            int(answer["cuts"]), tuple(blobs[1:]),
            tuple(int(n) for n in answer.get("cut_nodes", ())),
        )  # fmt: skip

    def split(self, ref: str, model: bytes, ends: list[int]) -> list[bytes]:
        """Segments of ``model`` ending after the given cuts, as bytes."""
        if self.in_process:
            return split_at(model, ends)
        return self._call(ref, {"call": "split_at", "ends": list(ends)}, [model])[1]


if __name__ == "__main__":
    from agent.inference.preparation.prepare import _worker_main as main

    main()
