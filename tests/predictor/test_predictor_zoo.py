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


# One small member per family (the slow test below covers every entry).
FAMILY_REPRESENTATIVES = (
    "densenet121", "dpn26", "googlenet", "gru", "lstm", "mlp", "mnasnet_0.5", "mobilenet_v1",
    "mobilenet_v2", "mobilenet_v3_075", "pyramidnet56_a48", "resnet18", "resnext11_2x16d",
    "shufflenet_v2_0.5", "squeezenet1_0", "transformer_encoder", "vgg11",
)  # fmt: skip
# Inputs shrunk so that the default suite stays fast; the graph's operators are the same.
_SMALL_INPUTS = {"cv224": {"resolution": 64}, "nlp": {"seq_len": 16, "vocab": 500}}


def _small_inputs(name: str) -> dict[str, int]:
    entry = ZOO[name]
    if entry.kind == "cv" and entry.input_params.get("resolution") == 224:
        return _SMALL_INPUTS["cv224"]
    return dict(_SMALL_INPUTS["nlp"]) if entry.kind == "nlp" else {}


def _assert_dynamic_batch(path: Path) -> None:
    import onnx

    dim = (
        onnx.load(str(path), load_external_data=False).graph.input[0].type.tensor_type.shape.dim[0]
    )
    assert dim.dim_param == "batch"
    features = FeatureExtractor().extract(path, 3)  # bound to a batch it was not traced at
    assert features.unresolved_nodes == 0
    assert features.batch_size == 3 and features.flops > 0


# Families alternate between inference (constant folding on: a folded batch would show
# here) and training graphs (batch norm on batch statistics, dropout); the slow test
# below covers every entry in both modes.
REPRESENTATIVES = [
    pytest.param(name, i % 2 == 1, id=f"{name}-{'training' if i % 2 else 'inference'}")
    for i, name in enumerate(FAMILY_REPRESENTATIVES)
]


@pytest.mark.parametrize(("name", "training"), REPRESENTATIVES)
def test_one_model_per_family_exports_with_a_dynamic_batch(
    name: str, training: bool, tmp_path: Path
) -> None:
    path = export_onnx(
        name, 2, tmp_path / "m.onnx", training=training, dynamic_batch=True, **_small_inputs(name)
    )
    _assert_dynamic_batch(path)


def test_representatives_cover_every_family() -> None:
    assert {ZOO[p.values[0]].family for p in REPRESENTATIVES} == {e.family for e in ZOO.values()}


# About 270 s of CPU: run with `pytest --with-slow`.
@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_zoo_entry_exports_with_a_dynamic_batch(
    name: str, training: bool, tmp_path: Path
) -> None:
    """Full-size graphs, as the profiler exports them (about 270 s of CPU for all 78)."""
    _assert_dynamic_batch(
        export_onnx(name, 1, tmp_path / "m.onnx", training=training, dynamic_batch=True)
    )


@pytest.mark.parametrize("name", ["vgg11", "lstm", "mlp", "transformer_encoder", "resnet18"])
def test_build_model_accepts_the_entrys_example_input(name: str) -> None:
    import torch

    from predictor.zoo import build_model

    params = _small_inputs(name)
    model = build_model(name, **params).eval()
    with torch.inference_mode():
        out = model(ZOO[name].example_input(2, **params))
    assert out.shape[0] == 2


def test_build_model_rejects_unknown_names() -> None:
    from predictor.zoo import build_model

    with pytest.raises(KeyError, match="alexnet"):
        build_model("alexnet")
