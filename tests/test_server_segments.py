"""ONNX segment splitting and the ONNX Runtime executor on CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from server_helpers import chain_model, save

from agent.server.errors import ModelRejected
from agent.server.executors import ModelLimits, OrtExecutor
from agent.server.segments import Cut, SegmentError, atoms, find_cuts, split_model


def run(model, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed), strict=True))


def test_cuts_skip_boundaries_crossed_by_a_skip_connection() -> None:
    model = chain_model(layers=4, residual=True)
    tensors = [c.tensor for c in find_cuts(model)]
    # r1 is never a cut: the skip connection keeps r0 live beside it until a1.
    assert "r1" not in tensors and "m1" not in tensors
    assert "a1" in tensors and "r0" in tensors


@pytest.mark.parametrize(
    ("layers", "residual", "batch"),
    [
        pytest.param(6, True, 1, id="residual-b1"),
        pytest.param(6, True, 5, id="residual-b5"),
        pytest.param(4, False, 3, id="plain-chain"),
    ],
)
def test_segments_compute_exactly_what_the_whole_model_does(layers, residual, batch) -> None:
    model = chain_model(layers=layers, residual=residual)
    x = np.random.default_rng(1).standard_normal((batch, 8)).astype(np.float32)
    whole = run(model, {"x": x})["y"]
    pieces = atoms(model)
    assert len(pieces) >= 3
    feed = {"x": x}
    for piece in pieces:
        assert piece.ir_version <= 10
        feed = run(piece, feed)
    assert np.array_equal(feed["y"], whole)


def test_split_rejects_a_cut_that_is_not_valid() -> None:
    model = chain_model(layers=4)
    with pytest.raises(SegmentError):
        split_model(model, [Cut(2, "r1")])


@pytest.fixture()
def executor(tmp_path: Path) -> OrtExecutor:
    limits = ModelLimits(
        store_root=tmp_path, profile_batches=(1, 2, 4), profile_repeats=2, max_model_bytes=1 << 20
    )
    return OrtExecutor("cpu", limits=limits)


def test_ort_executor_profiles_and_runs_segments_like_the_whole_model(executor, tmp_path) -> None:
    path = save(chain_model(layers=8), tmp_path / "chain.onnx")
    loaded = executor.load(str(path))
    profile = executor.profile(loaded)
    assert profile.latency_ms(1) > 0 and profile.max_batch == executor.limits.max_batch
    total = sum(loaded.handle.atom_costs_ms)
    executor.prepare_segments(loaded, target_ms=total / 3)
    assert loaded.segment_fractions is not None
    assert sum(loaded.segment_fractions) == pytest.approx(1.0)
    x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    (whole,) = executor.run_batch(loaded, x)
    feed = {"x": x}
    for i in range(len(loaded.segment_fractions)):
        feed = executor.run_segment(loaded, i, feed, 0.0)
    assert np.array_equal(feed["y"], whole)
    curve = executor.overhead_curve(loaded, profile)
    assert all(y >= 0 for y in curve.curve.ys)


def _write_hostile(tmp_path: Path, name: str, content: bytes | str | None) -> str:
    """Lay out one hostile case in the store and return the reference a client sends."""
    if isinstance(content, bytes):
        (tmp_path / name).write_bytes(content)
    elif content is not None:  # weights in a side file, at the location given
        model = chain_model()
        onnx.save(
            model,
            str(tmp_path / name),
            save_as_external_data=True,
            location="w.bin",
            size_threshold=0,
        )
        if content != "w.bin":
            saved = onnx.load(str(tmp_path / name), load_external_data=False)
            for tensor in saved.graph.initializer:
                for entry in tensor.external_data:
                    if entry.key == "location":
                        entry.value = content
            onnx.save(saved, str(tmp_path / name))
    if name.startswith(".."):
        save(chain_model(), tmp_path.parent / "outside.onnx")
        return name
    return name if "://" in name else str(tmp_path / name)


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        pytest.param("../outside.onnx", None, "path_outside_store", id="outside-store"),
        pytest.param("missing.onnx", None, None, id="missing"),
        pytest.param("garbage.onnx", b"\x00not a protobuf" * 10, "decode_error", id="garbage"),
        pytest.param("big.onnx", b"\x00" * (2 << 20), "too_large", id="too-big"),
        pytest.param("model.txt", b"hello", None, id="not-onnx-suffix"),
        pytest.param("https://example.com/m.onnx", None, "bad_reference", id="remote-url"),
        pytest.param("side.onnx", "../w.bin", "external_data_outside", id="external-outside"),
        pytest.param("side.onnx", "w.bin", None, id="external-inside-not-inline"),
    ],
)
def test_hostile_model_files_are_rejected(executor, tmp_path, name, content, reason) -> None:
    ref = _write_hostile(tmp_path, name, content)
    with pytest.raises(ModelRejected) as info:
        executor.load(ref)
    assert info.value.details.get("reason") == reason
