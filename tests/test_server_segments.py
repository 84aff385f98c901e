"""ONNX segment splitting and the ONNX Runtime executor on CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from test_server_helpers import chain_model, save

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


@pytest.mark.parametrize(
    ("name", "content"),
    [
        pytest.param("../outside.onnx", None, id="outside-store"),
        pytest.param("missing.onnx", None, id="missing"),
        pytest.param("garbage.onnx", b"\x00not a protobuf" * 10, id="garbage"),
        pytest.param("big.onnx", b"\x00" * (2 << 20), id="too-big"),
        pytest.param("model.txt", b"hello", id="not-onnx-suffix"),
    ],
)
def test_hostile_model_files_are_rejected(executor, tmp_path, name, content) -> None:
    if content is not None:
        (tmp_path / name).write_bytes(content)
    if name.startswith(".."):
        save(chain_model(), tmp_path.parent / "outside.onnx")
    with pytest.raises(ModelRejected):
        executor.load(str(tmp_path / name) if not name.startswith("..") else name)
