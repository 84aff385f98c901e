"""Learning from the cluster: agent reports -> observations -> resolution, persisted."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from extender_builders import (
    AGENT_AUTH,
    TOKEN,
    MemoryOnlyPredictor,
    args,
    binding,
    make_app,
    node,
    pod,
)

from contracts.annotations import BindOutputs, decode_outputs, encode_outputs
from extender.config.sections import LearningConfig
from extender.errors import BadRequest
from extender.learning.estimate import Trust
from extender.learning.learner import ConfigMapPersistence, Estimate, Learner, ObservationStore
from extender.state.reports import decode_report

A100 = "NVIDIA-A100-SXM4-40GB"
KEY = ("m.onnx", 32, "training", A100)
LOOSE = Trust(min_samples=1, min_seconds=0, warmup_seconds=0, spread_margin=0)
"""Trust from the first sample, no margin: the attribution and persistence rules alone."""
QUICK = {"learning": {"min_observed_seconds": 0, "warmup_seconds": 0, "spread_margin": 0}}


class Ticks:
    """A wall clock one second further on each call (reports one second apart)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now



def report(gpu_procs: dict[int, list[dict[str, Any]]], util: float = 37.0) -> dict[str, Any]:
    return {"node": "n1", "timestamp": 1.0, "interval_seconds": 1.0,
            "gpus": [{"index": i, "uuid": f"GPU-{i}", "product": "NVIDIA A100-SXM4-40GB",
                      "memory_total_mib": 40960, "memory_used_mib": 1000,
                      "utilization_percent": util, "processes": gpu_procs.get(i, [])}
                     for i in range(2)]}


def place(client_: Any, source: Any, p: dict[str, Any]) -> dict[str, str]:
    source.create_pod(p)
    assert client_.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert client_.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    return source.read_pod("default", p["metadata"]["name"])["metadata"]["annotations"]


def post(client_: Any, doc: dict[str, Any]) -> dict[str, Any]:
    r = client_.post("/v1/agents/report", json=doc, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()


def test_reports_move_a_model_from_cold_start_to_observed() -> None:
    app, ext, source, _ = make_app([node("n1", 2)], QUICK, predictor=MemoryOnlyPredictor())
    ext.learner.store.clock = Ticks()
    c = app.test_client()
    first = place(c, source, pod("a", uid="uid-a", model="m.onnx"))
    assert first["tandem.io/prediction-source"] == "cold-start+mem:no-overhead"
    assert first["tandem.io/predicted-gpu-util"] == "100.00"
    gpu = int(first["tandem.io/gpu-index"])
    alone = {gpu: [{"pid": 1, "pod_uid": "uid-a", "used_memory_mib": 900}]}
    assert post(c, report(alone))["samples"] == 0  # a pod's first report: its warm-up
    for _ in range(4):
        assert post(c, report(alone))["samples"] == 1
    # Four samples are below learning.min_observations (5): still cold start.
    assert place(c, source, pod("b", uid="uid-b", model="m.onnx"))[
        "tandem.io/prediction-source"] == "cold-start+mem:no-overhead"
    post(c, report(alone))
    third = place(c, source, pod("c", uid="uid-c", model="m.onnx"))
    assert third["tandem.io/prediction-source"] == "observed:5+mem:no-overhead"
    assert third["tandem.io/predicted-gpu-util"] == "37.00"  # alone: the GPU's utilisation
    learned = c.get("/v1/state", headers=AGENT_AUTH).get_json()["learning"]
    assert [(e["model"], e["gpu_type"], e["samples"]) for e in learned["alone"]] == [
        ("m.onnx", A100, 5)]
    # a node's own read (each agent's poll) is O(its GPUs): what was learned is not in it
    assert "learning" not in c.get("/v1/state?node=n1", headers=AGENT_AUTH).get_json()


def test_attribution_alone_colocated_and_foreign_processes() -> None:
    app, ext, source, _ = make_app([node("n1", 1)], predictor=MemoryOnlyPredictor(),
                                   raw_config={"limits": {"min_colocation_gain_percent": None},
                                               **QUICK})
    ext.learner.store.clock = Ticks()
    c = app.test_client()
    place(c, source, pod("a", uid="uid-a", model="m.onnx"))
    place(c, source, pod("b", uid="uid-b", model="other.onnx", gpu_util="20",
                         gpu_mem_mib="1000"))
    store = ext.learner.store
    # Two pods on one GPU without per-process figures: the total cannot be split.
    both = [{"pid": 1, "pod_uid": "uid-a"}, {"pid": 2, "pod_uid": "uid-b"}]
    assert post(c, report({0: both}))["samples"] == 0  # (and each pod's first report)
    assert post(c, report({0: both}))["samples"] == 0
    # With per-process utilisation each pod gets its own (co-located) sample.
    per_proc = [{"pid": 1, "pod_uid": "uid-a", "utilization_percent": 30},
                {"pid": 3, "pod_uid": "uid-a", "utilization_percent": 5},
                {"pid": 2, "pod_uid": "uid-b", "utilization_percent": 20}]
    assert post(c, report({0: per_proc}))["samples"] == 2
    colocated = {(e["model"], e["util_percent"]) for e in store.view()["colocated"]}
    assert colocated == {("m.onnx", 35.0), ("other.onnx", 20.0)}
    assert store.lookup(*KEY[:1], 32, A100, "training") is None  # nothing alone yet
    # An unattributed process on the GPU: the pod is not alone, its total is not its own.
    foreign = [{"pid": 1, "pod_uid": "uid-a"}, {"pid": 9, "pod_uid": None}]
    assert post(c, report({0: foreign}))["samples"] == 0
    # A pod this extender did not place there teaches nothing.
    assert post(c, report({0: [{"pid": 7, "pod_uid": "uid-unknown"}]}))["samples"] == 0
    assert post(c, report({0: [{"pid": 1, "pod_uid": "uid-a"}]}, util=61.0))["samples"] == 1
    # one sample: below learning.min_observations, so not trusted (samples answered as 0)
    assert store.lookup("m.onnx", 32, A100, "training") == (61.0, 0)
    assert store.rejected["warm-up"] == 2


def test_estimate_converges_on_noisy_samples_and_follows_drift() -> None:
    rng = random.Random(3)
    est = Estimate()
    for _ in range(1200):  # 1 Hz for 20 minutes
        est.add(42.0 + rng.gauss(0, 6), seconds=1.0, horizon=600.0, now=0.0)
    assert abs(est.mean - 42.0) < 3.0 and 3.0 < est.stddev < 9.0 and est.count == 1200
    for _ in range(3000):  # the model changed (new version, other data): the estimate follows
        est.add(70.0, seconds=1.0, horizon=600.0, now=0.0)
    assert abs(est.mean - 70.0) < 1.0


def test_store_is_bounded_least_recently_observed_first() -> None:
    clock = iter(range(100))
    store = ObservationStore(LOOSE, max_entries=2, wall_clock=lambda: float(next(clock)))
    for model in ("a", "b", "c"):
        store.add((model, 1, "training", A100), 50.0, alone=True)
    assert [e["model"] for e in store.view()["alone"]] == ["b", "c"]


@pytest.mark.parametrize(("processes", "field"), [
    ("nope", "gpus[0].processes"),
    ([{"pod_uid": 5}], "gpus[0].processes[0].pod_uid"),
    ([{"pod_uid": "u", "utilization_percent": 101}], "gpus[0].processes[0].utilization_percent"),
    ([{"pod_uid": "x" * 200}], "gpus[0].processes[0].pod_uid"),
])
def test_bad_process_entries_are_refused_with_the_field(processes: Any, field: str) -> None:
    doc = report({})
    doc["gpus"][0]["processes"] = processes
    with pytest.raises(BadRequest) as err:
        decode_report(doc)
    assert err.value.path == field


def test_prediction_source_annotation_round_trips() -> None:
    out = BindOutputs((0,), ("GPU-0",), 37.0, 1000.0, 0.5, source="observed:12+mem:fitted")
    ann = encode_outputs(out)
    assert ann["tandem.io/prediction-source"] == "observed:12+mem:fitted"
    assert decode_outputs(ann) == out
    assert decode_outputs({**ann, "tandem.io/prediction-source": "bad\nvalue"}).source is None


def test_learned_estimates_survive_a_restart_through_the_api_server(kube_api) -> None:
    server, api = kube_api
    cfg = LearningConfig(persist_interval_seconds=60.0, min_observations=1,
                         min_observed_seconds=0, spread_margin=0)
    leader = [False]
    now = [0.0]
    first = Learner(cfg, ConfigMapPersistence(api, "tandem", "tandem-learning"),
                    may_persist=lambda: leader[0], clock=lambda: now[0])
    first.start()  # no ConfigMap yet: starts empty
    for value in (30.0, 34.0, 32.0):
        first.store.add(KEY, value, alone=True)
    first.store.add(("n.onnx", 8, "training", A100), 80.0, alone=False)
    assert not first.maybe_persist()  # not the leader: nothing written
    assert server.configmaps == {}
    leader[0] = True
    assert first.maybe_persist()  # created
    first.store.add(KEY, 32.0, alone=True)
    assert not first.maybe_persist()  # within persist_interval_seconds
    now[0] = 61.0
    assert first.maybe_persist()  # replaced
    stored = server.configmaps[("tandem", "tandem-learning")]
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "tandem"}

    restarted = Learner(cfg, ConfigMapPersistence(api, "tandem", "tandem-learning"))
    restarted.start()
    assert restarted.store.lookup(*KEY[:2], KEY[3], KEY[2]) == first.store.lookup(
        *KEY[:2], KEY[3], KEY[2]) == (32.0, 4)
    assert restarted.store.to_document() == first.store.to_document()  # alone and co-located


def test_a_corrupt_persisted_document_is_skipped_not_fatal(kube_api) -> None:
    server, api = kube_api
    server.configmaps[("tandem", "tandem-learning")] = {
        "metadata": {"name": "tandem-learning"}, "data": {"observations.json": '{"version": 9}'}}
    learner = Learner(LearningConfig(), ConfigMapPersistence(api, "tandem", "tandem-learning"))
    learner.start()
    assert learner.store.view()["alone"] == []


def test_export_observations_writes_training_data_rows(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from predictor.commands import app as predictor_app
    from predictor.observed import OBSERVED_COLUMNS

    store = ObservationStore(LOOSE)
    for value in (40.0, 44.0):
        store.add(KEY, value, alone=True)
    store.add(("rare.onnx", 1, "inference", A100), 10.0, alone=True)
    store.add(("n.onnx", 8, "training", A100), 80.0, alone=False)  # co-located: not a row
    doc = tmp_path / "observations.json"
    doc.write_text(json.dumps(store.to_document()))
    result = CliRunner().invoke(predictor_app, [
        "export-observations", str(doc), "--out", str(tmp_path / "td"), "--min-samples", "2",
        "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rows"] == 1
    lines = (tmp_path / "td" / A100 / "observed.csv").read_text().splitlines()
    assert lines[0] == ",".join(OBSERVED_COLUMNS)
    assert lines[1].startswith("m.onnx,training,32,NVIDIA-A100-SXM4-40GB,42.0,2.0,2,")
    bad = tmp_path / "bad.json"
    bad.write_text('{"alone": [{"model": "m"}]}')
    failed = CliRunner().invoke(predictor_app, ["export-observations", str(bad), "--json"])
    assert failed.exit_code == 2 and "invalid_document" in failed.output
