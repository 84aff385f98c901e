"""Model zoo: registry coverage and exported graphs against closed-form counts.

Exports are kept few and tiny (they cost CPU): an MLP and an LSTM checked against
their closed forms, a transformer with a symbolic batch bound at feature time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from predictor.features import FeatureExtractor
from predictor.zoo import ZOO, export_onnx

HORUS_TABLE2_FAMILIES = {
    "mobilenet", "mobilenet_v2", "mobilenet_v3", "googlenet", "resnet", "vgg", "squeezenet",
    "densenet", "shufflenet_v2", "mnasnet", "dpn", "pyramidnet", "resnext", "lstm", "gru", "mlp",
}  # fmt: skip


def test_zoo_covers_horus_table2_and_a_transformer() -> None:
    families = {e.family for e in ZOO.values()}
    assert HORUS_TABLE2_FAMILIES | {"transformer"} <= families
    for name in (
        "resnet18",
        "resnet18_bottleneck",
        "resnet34",
        "resnet50",
        "vgg11",
        "vgg19",
        "densenet121",
        "densenet161",
        "densenet169",
        "mobilenet_v3_075",
    ):
        assert name in ZOO


def test_importing_the_zoo_does_not_import_torch() -> None:
    import subprocess

    code = "import predictor.zoo, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_mlp_export_matches_closed_form(tmp_path: Path) -> None:
    d_in, hidden, layers, classes, batch = 20, 16, 3, 5, 4
    path = export_onnx(
        "mlp",
        batch,
        tmp_path / "mlp.onnx",
        input_dim=d_in,
        hidden=hidden,
        layers=layers,
        num_classes=classes,
    )
    f = FeatureExtractor().extract(path, batch)
    dims = [d_in] + [hidden] * layers + [classes]
    linear = sum(2 * batch * a * b + batch * b for a, b in zip(dims[:-1], dims[1:], strict=True))
    relu = layers * batch * hidden
    assert f.flops == linear + relu
    assert f.params_bytes == 4 * sum(a * b + b for a, b in zip(dims[:-1], dims[1:], strict=True))
    assert f.op_counts["Gemm"] == layers + 1
    assert f.op_counts["Relu"] == layers


def test_lstm_export_matches_closed_form(tmp_path: Path) -> None:
    vocab, emb, hidden, seq, batch = 50, 8, 12, 6, 3
    path = export_onnx(
        "lstm",
        batch,
        tmp_path / "lstm.onnx",
        vocab=vocab,
        embedding=emb,
        hidden=hidden,
        layers=1,
        seq_len=seq,
    )
    f = FeatureExtractor().extract(path, batch)
    lstm = seq * batch * (2 * 4 * hidden * (emb + hidden) + 2 * 4 * hidden + 9 * hidden)
    proj = 2 * batch * seq * hidden * vocab + batch * seq * vocab  # MatMul + bias Add
    assert f.op_counts["LSTM"] == 1
    assert f.unresolved_nodes == 0
    assert f.flops == lstm + proj
    assert f.unknown_ops == {}


def test_dynamic_batch_transformer_binds_any_batch(tmp_path: Path) -> None:
    params = dict(vocab=40, seq_len=8, d_model=16, heads=2, layers=1, ff=32)
    path = export_onnx("transformer_encoder", 2, tmp_path / "t.onnx", dynamic_batch=True, **params)
    fx = FeatureExtractor()
    one, five = fx.extract(path, 1), fx.extract(path, 5)
    assert one.unresolved_nodes == 0 and five.unresolved_nodes == 0
    assert one.op_counts["Softmax"] == 1 and one.op_counts["MatMul"] >= 2
    assert five.flops == 5 * one.flops  # every operator here is per-sample
    assert five.params_bytes == one.params_bytes


@pytest.mark.parametrize("name", ["resnet18", "shufflenet_v2_0.5", "pyramidnet56_a48"])
def test_builders_construct_without_export(name: str) -> None:
    model = ZOO[name].build()
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params > 10_000


def test_export_rejects_unknown_names_and_parameters(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        export_onnx("alexnet", 1, tmp_path / "x.onnx")
    with pytest.raises(TypeError, match="widht"):
        ZOO["resnet18"].build(widht=0.5)
