"""Graph features: exact FLOPs of hand-built graphs, bytes, op counts, hostile models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from predictor.errors import ModelRejected, RejectReason
from predictor.features import FeatureExtractor, extract_features
from predictor.onnx_file import FeatureLimits

F = TensorProto.FLOAT


def _save(tmp_path: Path, nodes, inputs, outputs, inits=(), name="m.onnx", opset=17) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _w(name: str, *shape: int) -> TensorProto:
    return numpy_helper.from_array(np.ones(shape, dtype=np.float32), name)


def _vi(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F, shape)


def _conv(groups: int, dilation: int, bias: bool):
    # X (N,8,16,16) -> Conv 3x3 pad 1, 16 out channels
    inputs = ["X", "W"] + (["B"] if bias else [])
    node = helper.make_node(
        "Conv",
        inputs,
        ["Y"],
        kernel_shape=[3, 3],
        pads=[1] * 4,
        group=groups,
        dilations=[dilation] * 2,
    )
    inits = [_w("W", 16, 8 // groups, 3, 3)] + ([_w("B", 16)] if bias else [])
    out_hw = 16 + 2 - dilation * 2  # (H + 2p - d(k-1) - 1)/s + 1
    y = 16 * out_hw * out_hw  # per sample
    flops = 2 * y * (8 // groups) * 9 + (y if bias else 0)
    return [node], [_vi("X", ["N", 8, 16, 16])], [_vi("Y", None)], inits, flops


def _gemm(trans_a: int):
    a_shape = ["N", 32] if not trans_a else [32, "N"]
    node = helper.make_node("Gemm", ["A", "B", "C"], ["Y"], transA=trans_a)
    inits = [_w("B", 32, 10), _w("C", 10)]
    # Gemm's first dim is M; with transA the batch sits in dim 1, so bind it there
    return [node], [_vi("A", a_shape)], [_vi("Y", None)], inits, 2 * 10 * 32 + 10


def _attention():
    # Q,K,V (N, 4 heads, 8 tokens, 16) -> softmax(Q K^T) V
    nodes = [
        helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["Q", "Kt"], ["S"]),
        helper.make_node("Softmax", ["S"], ["P"], axis=-1),
        helper.make_node("MatMul", ["P", "V"], ["Y"]),
    ]
    ins = [_vi(n, ["N", 4, 8, 16]) for n in "QKV"]
    per_sample = 2 * (4 * 8 * 8) * 16 + 3 * (4 * 8 * 8) + 2 * (4 * 8 * 16) * 8
    return nodes, ins, [_vi("Y", None)], [], per_sample


def _recurrent(op: str, gates: int, pointwise: int, bias: bool):
    hidden, inp, seq = 8, 5, 7
    inputs = ["X", "W", "R"] + (["B"] if bias else [])
    node = helper.make_node(op, inputs, ["Y"], hidden_size=hidden)
    inits = [_w("W", 1, gates * hidden, inp), _w("R", 1, gates * hidden, hidden)]
    if bias:
        inits.append(_w("B", 1, 2 * gates * hidden))
    per_step = 2 * gates * hidden * (inp + hidden) + pointwise * hidden
    per_step += 2 * gates * hidden if bias else 0
    # X is (seq, batch, input): the batch is dim 1, bound through the dims mapping
    return [node], [_vi("X", [seq, "N", inp])], [_vi("Y", None)], inits, seq * per_step


def _pool_norm():
    nodes = [
        helper.make_node("MaxPool", ["X"], ["P"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["P", "s", "b", "m", "v"], ["Z"]),
        helper.make_node("Relu", ["Z"], ["R"]),
        helper.make_node("GlobalAveragePool", ["R"], ["Y"]),
    ]
    inits = [_w(n, 4) for n in "sbmv"]
    per_sample = 4 * 4 * 4 * 4 + 2 * 64 + 64 + 64  # pool, BN, relu, global pool
    return nodes, [_vi("X", ["N", 4, 8, 8])], [_vi("Y", None)], inits, per_sample


CASES = {
    "conv-dense": _conv(1, 1, True),
    "conv-grouped": _conv(4, 1, False),
    "conv-depthwise-dilated": _conv(8, 2, True),
    "gemm": _gemm(0),
    "attention-chain": _attention(),
    "lstm-bias": _recurrent("LSTM", 4, 9, True),
    "gru-no-bias": _recurrent("GRU", 3, 8, False),
    "rnn-bias": _recurrent("RNN", 1, 1, True),
    "pool-bn-relu-gap": _pool_norm(),
}


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_flops_of_hand_built_graphs_are_exact(tmp_path: Path, case, batch: int) -> None:
    nodes, ins, outs, inits, per_sample = case
    path = _save(tmp_path, nodes, ins, outs, inits)
    is_recurrent = nodes[0].op_type in ("LSTM", "GRU", "RNN")
    if is_recurrent:  # the batch is not the leading dim: bind it by name
        feats = FeatureExtractor().extract(path, batch, batch_dim="N")
    else:
        feats = extract_features(path, batch)
    assert feats.unresolved_nodes == 0
    assert feats.unknown_ops == {}
    assert feats.flops == per_sample * batch


def test_gemm_transposed_a_counts_k_from_dim_zero(tmp_path: Path) -> None:
    nodes, ins, outs, inits, per_sample = _gemm(1)
    path = _save(tmp_path, nodes, ins, outs, inits)
    feats = FeatureExtractor().extract(path, 3, batch_dim="N")
    assert feats.flops == per_sample * 3


def test_bytes_and_peak_follow_a_chain(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["A"]),
        helper.make_node("Relu", ["A"], ["B"]),
        helper.make_node("MatMul", ["B", "W"], ["Y"]),
    ]
    path = _save(tmp_path, nodes, [_vi("X", ["N", 100])], [_vi("Y", None)], [_w("W", 100, 10)])
    f = extract_features(path, 4)
    assert f.params_bytes == 100 * 10 * 4
    # X, A, B are 4*100 floats each, Y is 4*10
    assert f.activations_bytes == (3 * 400 + 40) * 4
    # each Relu holds its input and output (2 x 1600 bytes); the MatMul holds B and Y
    assert f.peak_activation_bytes == 2 * 1600


def test_op_counts_and_unknown_ops_are_reported(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["A"]),
        helper.make_node("FancyOp", ["A"], ["B"], domain="com.example"),
        helper.make_node("Relu", ["B"], ["Y"]),
    ]
    graph = helper.make_graph(nodes, "g", [_vi("X", ["N", 4])], [_vi("Y", None)])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "u.onnx"))
    f = extract_features(tmp_path / "u.onnx", 2)
    assert f.op_counts == {"Relu": 2, "com.example.FancyOp": 1}
    assert f.unknown_ops == {"com.example.FancyOp": 1}
    assert f.flops == 8  # the first Relu; the second's input shape is unknown
    assert f.unresolved_nodes >= 1


def test_initializers_listed_as_inputs_are_not_batch_bound(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "g",
        [_vi("X", ["N", 6]), _vi("W", [6, 3])],
        [_vi("Y", None)],
        initializer=[_w("W", 6, 3)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3  # IR < 4 requires initializers to be listed as inputs
    onnx.save(model, str(tmp_path / "old.onnx"))
    f = extract_features(tmp_path / "old.onnx", 5)
    assert f.flops == 2 * 5 * 3 * 6
    assert f.params_bytes == 6 * 3 * 4


def test_external_data_inside_model_dir_is_accepted(tmp_path: Path) -> None:
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"])]
    graph = helper.make_graph(
        nodes, "g", [_vi("X", ["N", 64])], [_vi("Y", None)], initializer=[_w("W", 64, 32)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(
        model,
        str(tmp_path / "ext.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    f = extract_features(tmp_path / "ext.onnx", 2)
    assert f.params_bytes == 64 * 32 * 4
    assert f.flops == 2 * 2 * 32 * 64


def _external_model(tmp_path: Path, location: str, length: int = 64 * 4) -> Path:
    w = TensorProto(name="W", data_type=F, dims=[64])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(length))):
        w.external_data.add(key=k, value=v)
    nodes = [helper.make_node("Add", ["X", "W"], ["Y"])]
    graph = helper.make_graph(nodes, "g", [_vi("X", ["N", 64])], [_vi("Y", None)], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    sub = tmp_path / "store"
    sub.mkdir(exist_ok=True)
    path = sub / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _hostile(tmp_path: Path, kind: str) -> tuple[Path, FeatureLimits]:
    limits = FeatureLimits()
    if kind == "garbage-bytes":
        path = tmp_path / "g.onnx"
        path.write_bytes(b"\xff\xfe not a protobuf \x00\x01" * 10)
    elif kind == "directory":
        path = tmp_path / "dir.onnx"
        path.mkdir()
    elif kind == "empty-file":
        path = tmp_path / "e.onnx"
        path.write_bytes(b"")
    elif kind == "too-large":
        path = _save(
            tmp_path,
            [helper.make_node("Relu", ["X"], ["Y"])],
            [_vi("X", ["N", 4])],
            [_vi("Y", None)],
        )
        limits = FeatureLimits(max_model_bytes=10)
    elif kind == "too-many-nodes":
        path = _save(
            tmp_path,
            [helper.make_node("Relu", ["X"], ["A"]), helper.make_node("Relu", ["A"], ["Y"])],
            [_vi("X", ["N", 4])],
            [_vi("Y", None)],
        )
        limits = FeatureLimits(max_nodes=1)
    elif kind == "external-outside":
        (tmp_path / "secret.bin").write_bytes(b"\0" * 256)
        path, limits = _external_model(tmp_path, "../secret.bin"), limits
    elif kind == "external-absolute":
        (tmp_path / "secret.bin").write_bytes(b"\0" * 256)
        path = _external_model(tmp_path, str(tmp_path / "secret.bin"))
    elif kind == "external-missing":
        path = _external_model(tmp_path, "nothing.bin")
    elif kind == "external-short":
        path = _external_model(tmp_path, "short.bin")
        (path.parent / "short.bin").write_bytes(b"\0" * 10)
    elif kind == "external-symlink-out":
        (tmp_path / "secret.bin").write_bytes(b"\0" * 256)
        path = _external_model(tmp_path, "link.bin")
        (path.parent / "link.bin").symlink_to(tmp_path / "secret.bin")
    elif kind == "cycle":
        path = _save(
            tmp_path,
            [
                helper.make_node("Add", ["X", "B"], ["A"]),
                helper.make_node("Relu", ["A"], ["B"]),
                helper.make_node("Relu", ["A"], ["Y"]),
            ],
            [_vi("X", ["N", 4])],
            [_vi("Y", None)],
        )
    elif kind == "dangling-input":
        path = _save(
            tmp_path,
            [helper.make_node("Add", ["X", "ghost"], ["Y"])],
            [_vi("X", ["N", 4])],
            [_vi("Y", None)],
        )
    elif kind == "duplicate-output":
        path = _save(
            tmp_path,
            [helper.make_node("Relu", ["X"], ["Y"]), helper.make_node("Relu", ["X"], ["Y"])],
            [_vi("X", ["N", 4])],
            [_vi("Y", None)],
        )
    elif kind == "no-nodes":
        path = _save(tmp_path, [], [_vi("X", ["N", 4])], [_vi("X2", None)])
    else:  # output never produced
        path = _save(
            tmp_path,
            [helper.make_node("Relu", ["X"], ["A"])],
            [_vi("X", ["N", 4])],
            [_vi("Y", None)],
        )
    return path, limits


HOSTILE = {
    "garbage-bytes": RejectReason.DECODE_ERROR,
    "empty-file": RejectReason.MALFORMED_GRAPH,
    "directory": RejectReason.BAD_REFERENCE,
    "too-large": RejectReason.TOO_LARGE,
    "too-many-nodes": RejectReason.TOO_MANY_NODES,
    "external-outside": RejectReason.EXTERNAL_DATA_OUTSIDE,
    "external-absolute": RejectReason.EXTERNAL_DATA_OUTSIDE,
    "external-symlink-out": RejectReason.EXTERNAL_DATA_OUTSIDE,
    "external-missing": RejectReason.EXTERNAL_DATA_MISSING,
    "external-short": RejectReason.EXTERNAL_DATA_MISSING,
    "cycle": RejectReason.CYCLIC_GRAPH,
    "dangling-input": RejectReason.MALFORMED_GRAPH,
    "duplicate-output": RejectReason.MALFORMED_GRAPH,
    "no-nodes": RejectReason.MALFORMED_GRAPH,
    "output-never-produced": RejectReason.MALFORMED_GRAPH,
}


@pytest.mark.parametrize(("kind", "reason"), HOSTILE.items(), ids=HOSTILE.keys())
def test_hostile_models_are_rejected_with_a_reason(tmp_path: Path, kind: str, reason) -> None:
    path, limits = _hostile(tmp_path, kind)
    with pytest.raises(ModelRejected) as info:
        FeatureExtractor(limits).extract(path, 1)
    assert info.value.reason is reason
    if reason in (RejectReason.TOO_LARGE, RejectReason.TOO_MANY_NODES):
        assert info.value.limit is not None


def test_cache_returns_the_same_value_and_notices_changes(tmp_path: Path) -> None:
    path = _save(
        tmp_path, [helper.make_node("Relu", ["X"], ["Y"])], [_vi("X", ["N", 4])], [_vi("Y", None)]
    )
    fx = FeatureExtractor()
    first = fx.extract(path, 2)
    assert fx.extract(path, 2) is first
    assert fx.extract(path, 3).flops == 12
    _save(
        tmp_path,
        [helper.make_node("Relu", ["X"], ["A"]), helper.make_node("Relu", ["A"], ["Y"])],
        [_vi("X", ["N", 4])],
        [_vi("Y", None)],
    )
    changed = fx.extract(path, 2)
    assert changed.digest != first.digest
    assert changed.flops == 16


def test_features_json_has_the_contract_keys(tmp_path: Path) -> None:
    path = _save(
        tmp_path, [helper.make_node("Relu", ["X"], ["Y"])], [_vi("X", ["N", 4])], [_vi("Y", None)]
    )
    d = extract_features(path, 2).as_dict()
    assert {"flops", "params_bytes", "activations_bytes", "batch_size", "op_counts"} <= set(d)
    assert d["op_counts"] == {"Relu": 1}


def test_path_based_shape_inference_gives_the_same_features(tmp_path: Path, monkeypatch) -> None:
    import predictor.shape_inference as shape_inference

    nodes, ins, outs, inits, per_sample = CASES["conv-dense"]
    path = _save(tmp_path, nodes, ins, outs, inits)
    in_memory = extract_features(path, 2)
    monkeypatch.setattr(shape_inference, "_PROTO_SOFT_LIMIT", 0)  # as for a > 1.5 GB proto
    on_disk = extract_features(path, 2)
    assert on_disk == in_memory
    assert on_disk.flops == 2 * per_sample


def test_an_initializer_shorter_than_its_dims_is_refused(tmp_path: Path) -> None:
    """16 bytes of data under dims that claim 10^12 floats: refused, never costed as 4 TB."""
    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[1_000_000, 1_000_000],
                         raw_data=b"\0" * 16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 1_000_000])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], initializer=[weight])
    path = tmp_path / "short.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(ModelRejected) as info:
        extract_features(path, 1)
    assert info.value.reason is RejectReason.MALFORMED_GRAPH
    assert "'W'" in str(info.value) and "carries 16" in str(info.value)
    # typed fields are counted too: a float_data tensor that matches its dims passes
    ok = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    ok.ClearField("raw_data")
    ok.float_data.extend([1.0] * 12)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], initializer=[ok])
    onnx.save(helper.make_model(graph), str(path))
    assert extract_features(path, 2).batch_size == 2
