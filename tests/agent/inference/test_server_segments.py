"""ONNX segment splitting and the ONNX Runtime executor on CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from server_helpers import chain_model, save

from agent.inference.errors import ModelRejected
from agent.inference.executors.executors import OrtExecutor
from agent.inference.preparation.limits import ModelLimits
from agent.inference.preparation.segments import (
    Cut,
    SegmentError,
    atoms,
    find_cuts,
    fold_constants,
    split_model,
)
from agent.inference.quanta import group_segments


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


def exported_style_model(layers: int = 6, width: int = 8) -> onnx.ModelProto:
    """A chain the way torch exports it: weights behind ``Identity(initializer)``, a
    ``Constant`` shape feeding a ``Reshape`` of a weight, and a Cast of a constant."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        flat = rng.standard_normal(width * width).astype(np.float32)
        inits.append(numpy_helper.from_array(flat, f"w{i}_flat"))
        nodes += [
            helper.make_node("Constant", [], [f"shape{i}"],
                             value=numpy_helper.from_array(np.array([width, width], np.int64))),
            helper.make_node("Reshape", [f"w{i}_flat", f"shape{i}"], [f"w{i}_2d"]),
            helper.make_node("Identity", [f"w{i}_2d"], [f"w{i}"]),
        ]  # fmt: skip
    inits.append(numpy_helper.from_array(np.array([0.5], np.float64), "half64"))
    nodes.append(helper.make_node("Cast", ["half64"], ["half"], to=TensorProto.FLOAT))
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]  # fmt: skip
        prev = f"r{i}"
    nodes.append(helper.make_node("Mul", [prev, "half"], ["y"]))
    graph = helper.make_graph(
        nodes, "exported", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])], initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def test_constant_heads_are_folded_so_cuts_run_through_the_whole_graph() -> None:
    model = exported_style_model(layers=6)
    # Unfolded, every weight is a live tensor from the head: no cut before the last layer.
    matmuls = [i for i, n in enumerate(model.graph.node) if n.op_type == "MatMul"]
    assert all(c.after_node >= matmuls[-1] for c in find_cuts(model))
    folded = fold_constants(model)
    assert {n.op_type for n in folded.graph.node} == {"MatMul", "Relu", "Mul"}
    cuts = find_cuts(folded)
    assert len(cuts) >= 2 * 6 - 1  # after every MatMul and Relu but the output's
    x = np.random.default_rng(4).standard_normal((3, 8)).astype(np.float32)
    whole = run(model, {"x": x})["y"]
    feed = {"x": x}
    for piece in atoms(model):
        feed = run(piece, feed)
    np.testing.assert_allclose(feed["y"], whole, rtol=1e-6)


def test_ort_executor_reports_cuts_of_the_folded_graph(executor, tmp_path) -> None:
    loaded = executor.load(str(save(exported_style_model(layers=4), tmp_path / "exp.onnx")))
    assert loaded.cuts == len(find_cuts(fold_constants(exported_style_model(layers=4))))
    assert loaded.cuts >= 7 and len(loaded.handle.atoms) == loaded.cuts + 1


def test_overhead_curve_counts_the_segments_built_for_each_quantum(executor, tmp_path) -> None:
    loaded = executor.load(str(save(chain_model(layers=8), tmp_path / "chain.onnx")))
    profile = executor.profile(loaded)
    handle = loaded.handle
    handle.boundary_cost_ms, handle.whole_ms = 0.01, 1.0  # fixed so the count is visible
    fraction = 0.25
    curve = executor.overhead_curve(loaded, profile, fraction)
    for q, overhead in zip(curve.curve.xs, curve.curve.ys, strict=True):
        built = len(group_segments(handle.atom_costs_ms, q * fraction))
        assert overhead == pytest.approx((built - 1) * 0.01)
    executor.prepare_segments(loaded, target_ms=sum(handle.atom_costs_ms) / 3)
    assert loaded.segment_overhead is not None and loaded.segment_overhead >= 0


@pytest.mark.slow
def test_every_zoo_family_gets_cuts_through_its_graph(tmp_path, capsys) -> None:
    from predictor.zoo import ZOO, export_onnx

    first = {}
    for name in sorted(ZOO):
        first.setdefault(ZOO[name].family, name)
    report = {}
    for family, name in sorted(first.items()):
        model = onnx.load(str(export_onnx(name, 1, tmp_path / f"{name}.onnx")))
        folded = fold_constants(model)
        cuts = find_cuts(folded)
        report[name] = (len(find_cuts(model)), len(cuts), len(folded.graph.node))
        assert cuts, f"{family} ({name}): no cut after folding"
        # Cuts reach the first half of the graph (before folding they sat at its end).
        assert cuts[0].after_node < len(folded.graph.node) // 2, (name, cuts[:3])
    with capsys.disabled():
        print("\ncuts per zoo model (before folding, after, folded nodes):", report)
