"""Integration seams: `/v1/state` as the agent reads it, predictor from config, Nexus profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from extender_builders import AGENT_AUTH, args, binding, make_app, node, pod, tiny_model

from agent.node.extender_view import parse_node_view
from agent.node.sessions import desired_sessions
from extender.cluster.sim import SimSource
from extender.config.schema import ConfigError, build_config
from extender.config.sections import NexusProfileSource, PredictorConfig
from extender.inference_profiles import ProfileFileError, load_nexus_profiles, load_profiles
from extender.wiring import PredictorSetupError, build_predictor
from predictor.profiles import parse_nexus

TITANX = "NVIDIA-TITAN-X-Pascal"


def bind_through(client: Any, p: dict[str, Any], node_name: str) -> None:
    assert client.post("/filter", json=args(p, [node_name])).get_json()["NodeNames"] == [node_name]
    assert client.post("/bind", json=binding(p, node_name)).get_json() == {"Error": ""}


SESSION_PODS = [
    pytest.param(pod("slo", workload="inference", model="resnet50", slo_ms="100",
                     rate_rps="200"),
                 {"name": "default.slo", "model": "resnet50", "slo_ms": 100.0,
                  "rate_rps": 200.0}, id="slo-session"),
    pytest.param(pod("batched", workload="inference", model="resnet50", slo_ms="250",
                     rate_rps="50", batch_size="8", weight="3", priority="2"),
                 {"name": "default.batched", "model": "resnet50", "slo_ms": 250.0,
                  "rate_rps": 50.0, "priority": 2}, id="slo-session-with-weight"),
    pytest.param(pod("batch", workload="inference", model="resnet50", weight="3"),
                 {"name": "default.batch", "model": "resnet50", "weight": 3},
                 id="best-effort-weighted"),
    pytest.param(pod("nightly", workload="inference", model="resnet50", priority="2"),
                 {"name": "default.nightly", "model": "resnet50", "priority": 2},
                 id="best-effort-priority"),
    pytest.param(pod("plain", workload="inference", model="resnet50"),
                 {"name": "default.plain", "model": "resnet50", "weight": 1},
                 id="best-effort-default-weight"),
]


@pytest.mark.parametrize(("session_pod", "wanted"), SESSION_PODS)
@pytest.mark.parametrize("restart", [False, True], ids=["live", "after-restart"])
def test_agent_reads_session_fields_from_the_extenders_state(
        session_pod: dict[str, Any], wanted: dict[str, Any], restart: bool) -> None:
    app, _, source, _ = make_app([node("n1", 2)])
    source.create_pod(session_pod)
    bind_through(app.test_client(), session_pod, "n1")
    if restart:  # a new process rebuilds the ledger from the pods' annotations
        app, *_ = make_app(source=source)
    document = app.test_client().get("/v1/state", headers=AGENT_AUTH).get_json()
    (entry,) = [p for g in document["nodes"]["n1"]["gpus"] for p in g["pods"]]
    assert entry["annotations"]["tandem.io/model"] == "resnet50"
    inputs = session_pod["metadata"]["annotations"]
    assert {k: entry["annotations"][k] for k in inputs} == inputs  # weight, priority included
    assert "tandem.io/gpu-uuid" in entry["annotations"]  # outputs are shown beside inputs
    assert all(k.startswith("tandem.io/") for k in entry["annotations"])
    view = parse_node_view(document, "n1")
    wanted_by_gpu, skipped = desired_sessions(view)
    sessions = [s.json() for per_gpu in wanted_by_gpu.values() for s in per_gpu.values()]
    assert skipped == () and sessions == [wanted]


def test_state_shows_only_tandem_annotations() -> None:
    app, _, source, _ = make_app([node("n1")])
    p = pod("t", gpu_util="10", gpu_mem_mib="1000")
    p["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    source.create_pod(p)
    bind_through(app.test_client(), p, "n1")
    document = app.test_client().get("/v1/state", headers=AGENT_AUTH).get_json()
    (entry,) = document["nodes"]["n1"]["gpus"][0]["pods"]
    assert not any(k.startswith("kubectl") for k in entry["annotations"])


# ---- predictor from config ------------------------------------------------------------------


@pytest.mark.parametrize("artifacts", ["unset", "empty-dir"])
def test_model_without_a_trained_predictor_is_placed_under_the_cold_start_rule(
        tmp_path: Path, artifacts: str) -> None:
    store = tmp_path / "store"
    store.mkdir()
    tiny_model(store / "tiny.onnx")
    cfg = PredictorConfig(artifacts_dir=None if artifacts == "unset" else str(tmp_path),
                          model_store=str(store))
    predictor = build_predictor(cfg)
    assert predictor is not None and predictor.artifacts is None
    app, _, source, _ = make_app([node("n1")], predictor=predictor)
    p = pod("m", model="tiny.onnx")
    source.create_pod(p)
    bind_through(app.test_client(), p, "n1")
    ann = source.read_pod("default", "m")["metadata"]["annotations"]
    assert ann["tandem.io/predicted-gpu-util"] == "100.00"  # the whole GPU until observed
    assert ann["tandem.io/prediction-source"] == "cold-start+mem:no-overhead"
    expected = predictor.estimate_memory("tiny.onnx", 32, "training").total_mib  # Horus Eq. 2
    assert ann["tandem.io/predicted-gpu-mem-mib"] == f"{expected:.0f}"


def test_model_outside_the_configured_store_is_refused(tmp_path: Path) -> None:
    tiny_model(tmp_path / "outside.onnx")
    (tmp_path / "store").mkdir()
    predictor = build_predictor(PredictorConfig(model_store=str(tmp_path / "store")))
    app, *_ = make_app([node("n1")], predictor=predictor)
    body = app.test_client().post("/filter", json=args(pod("m", model="../outside.onnx"), ["n1"]))
    assert "outside the model store" in body.get_json()["FailedAndUnresolvableNodes"]["n1"]


def test_disabled_predictor_is_not_built_and_broken_artifacts_fail_at_start(
        tmp_path: Path) -> None:
    from predictor.training import CARD_FILE, MODEL_FILE

    assert build_predictor(PredictorConfig(enabled=False)) is None
    (tmp_path / MODEL_FILE).write_text("{}")
    (tmp_path / CARD_FILE).write_text('{"model_digest": "not-this-one"}')
    with pytest.raises(PredictorSetupError, match="predictor.artifacts_dir"):
        build_predictor(PredictorConfig(artifacts_dir=str(tmp_path)))


def test_predictor_keys_parse_into_their_section() -> None:
    cfg = build_config({"predictor": {"enabled": True, "artifacts_dir": "/a",
                                      "model_store": "/models"}})
    assert cfg.predictor == PredictorConfig(True, "/a", "/models")
    assert build_config({}).predictor == PredictorConfig()


# ---- Nexus profiles -------------------------------------------------------------------------


@pytest.mark.parametrize(("entries", "problem"), [
    ("not-a-list", "profiles.nexus: must be list"),
    (["file.txt"], "profiles.nexus[0]: must be a mapping"),
    ([{"path": "p"}], "profiles.nexus[0].gpu_type: required"),
    ([{"path": "", "gpu_type": TITANX}], "profiles.nexus[0].path: required"),
    ([{"path": "p", "gpu_type": TITANX, "margin": 1}], "profiles.nexus[0].margin: unknown key"),
], ids=["not-list", "not-mapping", "no-gpu-type", "empty-path", "unknown-key"])
def test_bad_nexus_entries_are_reported_with_their_path(entries: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"profiles": {"nexus": entries}})
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


def test_nexus_entry_canonicalises_the_gpu_type() -> None:
    entry = {"path": "d", "gpu_type": "NVIDIA TITAN X Pascal"}
    cfg = build_config({"profiles": {"nexus": [entry]}})
    assert cfg.nexus_profiles == (NexusProfileSource("d", TITANX),)


@pytest.mark.parametrize("form", ["directory", "one-file"])
def test_nexus_profiles_load_under_the_configured_gpu_type(nexus_profiles_dir: Path,
                                                           form: str) -> None:
    path = nexus_profiles_dir if form == "directory" \
        else nexus_profiles_dir / "titanx-pascal_caffe_vgg16_1.txt"
    profiles = load_nexus_profiles(NexusProfileSource(str(path), TITANX))
    wanted = {"vgg16", "vgg_face", "vgg_s", "yolo9000"} if form == "directory" else {"vgg16"}
    assert set(profiles) == {(m, TITANX) for m in wanted}
    measured = parse_nexus((nexus_profiles_dir / "titanx-pascal_caffe_vgg16_1.txt").read_text())
    vgg16 = profiles[("vgg16", TITANX)]
    # Nexus plans (mean + std) * 1.15; the table is kept a monotone upper bound of that.
    planned = [(m + sd) * 1.15 for m, sd in zip(measured.mean_ms, measured.std_ms, strict=True)]
    assert vgg16.latency_ms(1) == pytest.approx(planned[0])
    assert all(vgg16.latency_ms(b) >= ms - 1e-9
               for b, ms in zip(measured.batches, planned, strict=True))
    assert vgg16.memory_mib == max(measured.memory_mib)


def test_yaml_profile_files_win_over_nexus_for_the_same_model(nexus_profiles_dir: Path,
                                                               tmp_path: Path) -> None:
    override = tmp_path / "p.yaml"
    override.write_text(f"profiles:\n  - {{model: vgg16, gpu_type: {TITANX}, "
                        "linear: {alpha_ms: 1.0, beta_ms: 5.0}, memory_mib: 1000}\n")
    profiles = load_profiles([str(override)],
                             [NexusProfileSource(str(nexus_profiles_dir), TITANX)])
    assert profiles[("vgg16", TITANX)].latency_ms(2) == pytest.approx(7.0)
    assert ("yolo9000", TITANX) in profiles


@pytest.mark.parametrize(("content", "problem"), [
    (None, "No such file"),
    ("too short", "too short"),
], ids=["missing", "malformed"])
def test_unreadable_nexus_files_name_the_file(tmp_path: Path, content: str | None,
                                              problem: str) -> None:
    path = tmp_path / "broken.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ProfileFileError, match=problem) as err:
        load_nexus_profiles(NexusProfileSource(str(path), TITANX))
    assert str(path) in str(err.value)


def test_empty_nexus_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileFileError, match="no Nexus profiles"):
        load_nexus_profiles(NexusProfileSource(str(tmp_path), TITANX))


def test_inference_pod_is_placed_with_a_real_nexus_profile(nexus_profiles_dir: Path) -> None:
    profiles = load_profiles([], [NexusProfileSource(str(nexus_profiles_dir), TITANX)])
    titan = node("titan-1", 2, product="NVIDIA TITAN X Pascal", memory_mib=12288)
    app, _, source, _ = make_app([titan], source=SimSource([titan]), profiles=profiles)
    session = pod("vgg", workload="inference", model="vgg_s", slo_ms="100", rate_rps="100")
    source.create_pod(session)
    bind_through(app.test_client(), session, "titan-1")
    out = source.read_pod("default", "vgg")["metadata"]["annotations"]
    assert int(out["tandem.io/batch"]) >= 1 and float(out["tandem.io/duty-cycle-ms"]) > 0
    unknown = pod("u", workload="inference", model="resnet50", slo_ms="100", rate_rps="100")
    reason = app.test_client().post("/filter", json=args(unknown, ["titan-1"])).get_json()
    assert reason["NodeNames"] == []
