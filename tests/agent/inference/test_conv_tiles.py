"""Row tiles of a long Conv: yield points inside one node for best-effort pieces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from server_helpers import save

from agent.inference.executors.executors import OrtExecutor
from agent.inference.preparation.limits import ModelLimits
from agent.inference.preparation.segments import find_cuts, fold_constants, split_model
from agent.inference.preparation.tiling import tile_convs


def conv_model(channels: int = 8, size: int = 24, kernel: int = 3,
               pads: tuple[int, int, int, int] = (1, 1, 1, 1), seed: int = 0) -> onnx.ModelProto:
    """Conv 3->channels (with bias), Relu, Conv channels->channels, GlobalAveragePool."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32)
    b0 = rng.standard_normal(channels).astype(np.float32)
    w1 = rng.standard_normal((channels, channels, kernel, kernel)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=list(pads)),
             helper.make_node("GlobalAveragePool", ["c1"], ["y"])]
    graph = helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                       ["N", 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, 1, 1])],
        [numpy_helper.from_array(a, n) for a, n in ((w0, "w0"), (b0, "b0"), (w1, "w1"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in feed.items() if k in wanted})
    return dict(zip([o.name for o in sess.get_outputs()], outs, strict=True))


@pytest.mark.parametrize("kernel,pads", [(3, (1, 1, 1, 1)), (5, (2, 0, 1, 3)), (3, (0, 0, 0, 0))])
def test_tiles_compute_what_the_conv_does(kernel, pads) -> None:
    model = conv_model(kernel=kernel, pads=pads)
    tiled = tile_convs(model, max_macs=20_000)
    onnx.checker.check_model(tiled)
    tiles = [n for n in tiled.graph.node if n.name.startswith("tandem_tile/c1/conv")]
    assert len(tiles) >= 4
    x = np.random.default_rng(1).standard_normal((2, 3, 24, 24)).astype(np.float32)
    np.testing.assert_allclose(run(tiled, {"x": x})["y"], run(model, {"x": x})["y"],
                               rtol=1e-4, atol=1e-4)


def test_small_and_strided_convs_stay_whole() -> None:
    model = conv_model()
    assert tile_convs(model) is model  # both under MAX_TILE_MACS
    strided = conv_model()
    strided.graph.node[2].attribute.extend([helper.make_attribute("strides", [2, 2])])
    out = tile_convs(strided, max_macs=1.0)
    assert not any(n.name.startswith("tandem_tile/c1/") for n in out.graph.node)
    old = conv_model()
    old.opset_import[0].version = 9  # Slice had no bound inputs yet
    assert tile_convs(old, max_macs=1.0) is old


def test_cuts_between_tiles_carry_the_input_and_the_tiles_done() -> None:
    model = fold_constants(conv_model())
    plain = find_cuts(model)
    tiled = tile_convs(model, max_macs=20_000)
    cuts = find_cuts(tiled)
    inside = [c for c in cuts if len(c.tensors) > 1]
    assert len(inside) >= 3 and len(cuts) == len(plain) + len(inside)
    # The tiled Conv's input stays live until its last tile (both Convs are tiled here).
    assert sum("x" in c.tensors for c in inside) >= 2
    assert sum("r0" in c.tensors for c in inside) >= 2
    # Each piece reads only what it uses; what later pieces read is carried past it.
    x = np.random.default_rng(3).standard_normal((1, 3, 24, 24)).astype(np.float32)
    feed = {"x": x}
    for piece in split_model(tiled, cuts):
        feed = {**feed, **run(piece, feed)}
    np.testing.assert_allclose(feed["y"], run(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_ort_segments_of_one_long_conv_are_pieces_of_it(tmp_path: Path) -> None:
    """A best-effort job whose work is one long Conv (the benchmark's: 1.4 GMAC, longer
    than a 50 ms SLO on a CPU core) yields inside it: its longest piece is a fraction
    of the node, and the pieces run in turn give the model's output alone."""
    limits = ModelLimits(store_root=tmp_path, profile_batches=(1, 2), profile_repeats=3,
                         max_model_bytes=1 << 22)
    executor = OrtExecutor("cpu", limits=limits, prepare_in_process=True)
    loaded = executor.load(str(save(conv_model(channels=64, size=192), tmp_path / "w.onnx")))
    assert len(loaded.handle.atoms) >= 10
    executor.prepare_segments(loaded, target_ms=0.5)
    fractions = loaded.segment_fractions
    assert fractions is not None and len(fractions) >= 10 and max(fractions) < 0.4
    x = np.random.default_rng(2).standard_normal((1, 3, 192, 192)).astype(np.float32)
    feed = {loaded.input_name: x}
    for i in range(len(fractions)):
        feed = executor.run_segment(loaded, i, feed, 0.0)
    assert list(feed) == ["y"]
    np.testing.assert_allclose(feed["y"], executor.run_batch(loaded, x)[0],
                               rtol=1e-4, atol=1e-4)
