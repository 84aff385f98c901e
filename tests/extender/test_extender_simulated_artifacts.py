"""The extender refuses predictor artifacts trained on simulated data unless
``predictor.allow_simulated``: a clear error at start (exit 2), never a silent dry run.

Artifacts come from the predictor's own training API on rows the tests generate
(SYNTHETIC, see test_predictor_training.py), plus hand-written cards for the edge cases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from predictor_fixtures import FAST, GPU, write_dataset
from typer.testing import CliRunner

from extender import commands
from extender.config.sections import PredictorConfig
from extender.wiring import CARD_FILE, PredictorSetupError, build_predictor, check_not_simulated
from predictor.dataset import load_training_data
from predictor.training import CARD_FILE as PREDICTOR_CARD_FILE
from predictor.training import fit_all, save_artifacts

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """Real artifacts from ``fit_all``: {simulated: directory}."""
    out = {}
    for simulated in (True, False):
        root = write_dataset(tmp_path_factory.mktemp(f"data-{simulated}"))
        prov_path = root / GPU / "provenance.json"
        prov = json.loads(prov_path.read_text())
        prov["simulated"] = simulated
        prov_path.write_text(json.dumps(prov))
        est, card, overheads, _ = fit_all(load_training_data(root, True), ("xgboost",), FAST)
        out[simulated] = save_artifacts(tmp_path_factory.mktemp(f"art-{simulated}"), est, card,
                                        overheads)
    return out


def test_card_file_name_matches_the_predictor() -> None:
    assert CARD_FILE == PREDICTOR_CARD_FILE


@pytest.mark.parametrize(("simulated", "allow", "refused"), [
    (True, False, True), (True, True, False), (False, False, False), (False, True, False),
], ids=["simulated-refused", "simulated-allowed", "real", "real-allow-is-harmless"])
def test_build_predictor_on_trained_artifacts(trained: dict[bool, Path], simulated: bool,
                                              allow: bool, refused: bool) -> None:
    cfg = PredictorConfig(artifacts_dir=str(trained[simulated]), allow_simulated=allow)
    if refused:
        with pytest.raises(PredictorSetupError) as err:
            build_predictor(cfg)
        assert '"simulated": true' in str(err.value)
        assert "predictor.allow_simulated: true" in str(err.value)
        assert str(trained[simulated]) in str(err.value)
    else:
        predictor = build_predictor(cfg)
        assert predictor.artifacts is not None
        assert predictor.artifacts.simulated is simulated


@pytest.mark.parametrize(("card", "refused"), [
    ({"simulated": True}, True),
    ({"simulated": False}, False),
    ({}, False),
    ({"simulated": "true"}, False),  # only the JSON boolean marks a card (as predictor.training)
    ([1, 2], False),
], ids=["true", "false", "absent", "string-is-not-true", "not-a-mapping"])
def test_check_reads_the_card_before_loading(tmp_path: Path, card: object,
                                             refused: bool) -> None:
    (tmp_path / CARD_FILE).write_text(json.dumps(card))
    cfg = PredictorConfig(artifacts_dir=str(tmp_path))
    if refused:
        with pytest.raises(PredictorSetupError):
            check_not_simulated(cfg)
    else:
        check_not_simulated(cfg)


@pytest.mark.parametrize(("setup", "message"), [
    ("garbage", "cannot read model_card.json"),
    ("missing", None),
    ("unset", None),
], ids=["corrupt-card", "no-card", "no-artifacts-dir"])
def test_check_edge_cases(tmp_path: Path, setup: str, message: str | None) -> None:
    if setup == "garbage":
        (tmp_path / CARD_FILE).write_text("{not json")
    cfg = PredictorConfig(artifacts_dir=None if setup == "unset" else str(tmp_path))
    if message:
        with pytest.raises(PredictorSetupError, match=message):
            check_not_simulated(cfg)
    else:
        check_not_simulated(cfg)


def test_serve_exits_2_on_simulated_artifacts(trained: dict[bool, Path], tmp_path: Path) -> None:
    config = tmp_path / "tandem.yaml"
    config.write_text(f"predictor: {{artifacts_dir: {trained[True]}}}\n")
    result = CliRunner().invoke(commands.app, [
        "serve", "--config", str(config),
        "--cluster", f"sim:{REPO / 'extender/demo_cluster.yaml'}"])
    assert result.exit_code == 2
    assert "simulated" in result.output and "allow_simulated" in result.output


class _SpyPredictor:
    """Delegates to the real Predictor and records what each predict() returned."""

    def __init__(self, inner: object) -> None:
        self._inner, self.calls = inner, []

    def predict(self, *args: object, **kwargs: object) -> object:
        result = self._inner.predict(*args, **kwargs)
        self.calls.append((args, kwargs, result))
        return result

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_extender_places_a_model_only_pod_with_the_trained_predictors_answer(
        trained: dict[bool, Path], tmp_path: Path) -> None:
    from extender_builders import args, binding, make_app, node, pod, tiny_model

    store = tmp_path / "store"
    store.mkdir()
    tiny_model(store / "tiny.onnx")
    spy = _SpyPredictor(build_predictor(PredictorConfig(
        artifacts_dir=str(trained[False]), model_store=str(store))))
    app, _, source, _ = make_app([node("n1", 2)], predictor=spy)
    p = pod("model-only", model="tiny.onnx", batch_size="16")
    source.create_pod(p)
    client = app.test_client()
    assert client.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert client.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}

    assert spy.calls, "the extender never asked the predictor"
    call_args, _, prediction = spy.calls[-1]
    assert call_args[0] == "tiny.onnx" and call_args[1] == 16
    (bound,) = [q for q in source.pods() if q["metadata"]["name"] == "model-only"]
    notes = bound["metadata"]["annotations"]
    assert float(notes["tandem.io/predicted-gpu-util"]) == pytest.approx(
        prediction.gpu_util_percent, abs=0.05)
    assert float(notes["tandem.io/predicted-gpu-mem-mib"]) == pytest.approx(
        prediction.gpu_mem_mib, abs=0.5)
