"""The model worker's wire: JSON headers and byte blobs, bounded, never pickles; only the
server's own error types are rebuilt from a worker's answer."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from agent.inference.errors import ModelRejected
from agent.inference.preparation.limits import ModelLimits
from agent.inference.preparation.prepare import (
    ModelPreparer,
    WorkerProtocolError,
    _limits_from_json,
    _limits_to_json,
    _raise_from,
    read_message,
    write_message,
)


def test_messages_round_trip_with_blobs():
    buf = io.BytesIO()
    write_message(buf, {"call": "split_at", "ends": [1, 3]}, [b"model", b""])
    write_message(buf, {"ok": True})
    buf.seek(0)
    assert read_message(buf) == ({"call": "split_at", "ends": [1, 3], "blobs": 2},
                                 [b"model", b""])
    assert read_message(buf) == ({"ok": True, "blobs": 0}, [])
    with pytest.raises(EOFError):
        read_message(buf)


@pytest.mark.parametrize("raw", [
    pytest.param(struct.pack(">I", 1 << 30), id="header-too-large"),
    pytest.param(struct.pack(">I", 5) + b"nope!", id="header-not-json"),
    pytest.param(struct.pack(">I", 13) + b'{"blobs": -1}', id="bad-blob-count"),
    pytest.param(struct.pack(">I", 12) + b'{"blobs": 1}' + struct.pack(">Q", 1 << 40),
                 id="blob-too-large"),
])
def test_malformed_or_oversized_messages_are_refused(raw):
    with pytest.raises(WorkerProtocolError):
        read_message(io.BytesIO(raw))


def test_a_message_cut_short_is_a_dead_worker():
    buf = io.BytesIO()
    write_message(buf, {"ok": True}, [b"0123456789"])
    with pytest.raises(EOFError):
        read_message(io.BytesIO(buf.getvalue()[:-3]))


def test_limits_cross_the_pipe_unchanged(tmp_path):
    limits = ModelLimits(store_root=tmp_path, max_tensor_bytes=123, profile_batches=(1, 4))
    assert _limits_from_json(_limits_to_json(limits)) == limits
    assert _limits_from_json(_limits_to_json(ModelLimits())) == ModelLimits()


def test_failures_come_back_as_server_errors_only():
    with pytest.raises(ModelRejected) as exc:
        _raise_from("m.onnx", {"ok": False, "error": "ModelRejected", "message": "too big",
                               "details": {"reason": "too_large", "limit": "max_tensor_bytes"}})
    assert exc.value.details == {"reason": "too_large", "limit": "max_tensor_bytes"}
    with pytest.raises(ModelRejected, match="SystemExit"):  # never another type
        _raise_from("m.onnx", {"ok": False, "error": "SystemExit", "message": "SystemExit: 0"})
    assert np.dtype(np.dtype(np.float32).str) == np.float32


def test_the_worker_prepares_with_the_server_s_code_whatever_its_directory(
        tmp_path, monkeypatch):
    """``python -m`` looks in the working directory first: a server started in another
    checkout prepared models with that checkout's code (a benchmark's baseline server
    ran the tree under test's cutting)."""
    from server_helpers import chain_model, save

    decoy = tmp_path / "agent" / "inference" / "preparation"
    decoy.mkdir(parents=True)
    for folder in (decoy, decoy.parent, decoy.parent.parent):
        (folder / "__init__.py").write_text("")
    (decoy / "prepare.py").write_text("raise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ModelPreparer, "_worker", None)  # a worker started here
    model = save(chain_model(layers=2), tmp_path / "m.onnx")
    try:
        prepared = ModelPreparer().prepare(str(model), ModelLimits(store_root=tmp_path))
    finally:
        if ModelPreparer._worker is not None:
            ModelPreparer._worker.close()
    assert prepared.input_name == "x" and prepared.cuts >= 1
