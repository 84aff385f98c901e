"""Learning keyed by model file digest, the version-1 document migration, and /metrics."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from extender_builders import AGENT_AUTH, TOKEN, args, binding, make_app, node, pod
from predictor_fixtures import tiny_model

from extender.config.sections import LearningConfig
from extender.learning.estimate import Trust
from extender.learning.learner import DOCUMENT_VERSION, Learner, ObservationStore

A100 = "NVIDIA-A100-SXM4-40GB"
LOOSE = Trust(min_samples=1, min_seconds=0, warmup_seconds=0, spread_margin=0)
"""Trust from the first sample, no margin: the keying rules alone."""


def test_references_to_one_file_share_an_estimate_and_a_changed_file_starts_anew() -> None:
    digests = {"models/m.onnx": "aa11", "https://h.example/m.onnx": "aa11", "copy.onnx": "aa11"}
    store = ObservationStore(LOOSE, digest_of=digests.get)
    key = (store.model_key("models/m.onnx"), 32, "training", A100)
    assert key[0] == "sha256:aa11"
    for value in (40.0, 44.0):
        store.add(key, value, alone=True, reference="models/m.onnx")
    # a URL and a second path to identical bytes: the same estimate
    assert store.lookup("https://h.example/m.onnx", 32, A100, "training") == (42.0, 2)
    assert store.lookup("copy.onnx", 32, A100, "training") == (42.0, 2)
    # the file behind the path changed: its new digest has learned nothing yet
    digests["models/m.onnx"] = "bb22"
    assert store.lookup("models/m.onnx", 32, A100, "training") is None
    (entry,) = store.view()["alone"]
    assert (entry["model"], entry["reference"]) == ("sha256:aa11", "models/m.onnx")


def test_reference_keyed_estimates_migrate_once_the_digest_is_known() -> None:
    digests: dict[str, str] = {}
    store = ObservationStore(LOOSE, digest_of=digests.get)
    ref_key = (store.model_key("m.onnx"), 32, "training", A100)
    assert ref_key[0] == "m.onnx"  # digest unknown yet: keyed by the reference
    for value in (30.0, 34.0):
        store.add(ref_key, value, alone=True)
    digests["m.onnx"] = digests["elsewhere/m.onnx"] = "cc33"
    digest_key = ("sha256:cc33", 32, "training", A100)
    store.add(digest_key, 38.0, alone=True, reference="elsewhere/m.onnx")
    # looking the reference up merges what it learned into the digest's estimate
    assert store.lookup("m.onnx", 32, A100, "training") == (34.0, 3)
    assert [e["model"] for e in store.view()["alone"]] == ["sha256:cc33"]
    assert store.lookup("elsewhere/m.onnx", 32, A100, "training") == (34.0, 3)


def test_a_version_1_document_loads_and_is_written_back_as_version_2() -> None:
    v1 = {"version": 1, "colocated": [],
          "alone": [{"model": "m.onnx", "batch_size": 32, "workload": "training",
                     "gpu_type": A100, "util_percent": 50.0, "stddev_percent": 2.0,
                     "samples": 7, "updated_at": 10.0}]}
    store = ObservationStore(LOOSE, digest_of={"m.onnx": "dd44"}.get)
    assert store.load_document(v1) == 1
    assert store.lookup("m.onnx", 32, A100, "training") == (50.0, 7)
    doc = store.to_document()
    assert doc["version"] == DOCUMENT_VERSION == 2
    (entry,) = doc["alone"]
    assert (entry["model"], entry["reference"], entry["samples"]) == \
        ("sha256:dd44", "m.onnx", 7)
    again = ObservationStore(LOOSE)
    assert again.load_document(doc) == 1 and again.view() == store.view()


class DigestPredictor:
    """Memory only, and the digest of each reference as the real facade records it."""

    def __init__(self, digests: dict[str, str]):
        self.digests = digests

    def predict(self, model_ref: str, batch_size: int, gpu_type: str | None, workload: str):
        return SimpleNamespace(gpu_util_percent=None, gpu_mem_mib=1000.0,
                               source="unknown+mem:no-overhead")

    def known_digest(self, model_ref: str) -> str | None:
        return self.digests.get(model_ref)


def _place(c, source, p) -> dict[str, str]:
    source.create_pod(p)
    assert c.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert c.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    return source.read_pod("default", p["metadata"]["name"])["metadata"]["annotations"]


def _report(procs: list[dict], gpu: int) -> dict:
    return {"node": "n1", "timestamp": 1.0, "interval_seconds": 1.0,
            "gpus": [{"index": i, "uuid": f"GPU-{i}", "product": "NVIDIA A100-SXM4-40GB",
                      "memory_total_mib": 40960, "memory_used_mib": 1000,
                      "utilization_percent": 45.0, "processes": procs if i == gpu else []}
                     for i in range(2)]}


def test_the_extender_keys_by_digest_and_shows_the_learner_on_metrics() -> None:
    predictor = DigestPredictor({"a/m.onnx": "ee55", "https://h.example/m.onnx": "ee55"})
    app, ext, source, _ = make_app([node("n1", 2)], {"learning": {
        "min_observed_seconds": 0, "warmup_seconds": 0, "spread_margin": 0}},
        predictor=predictor)
    ticks = iter(range(1000, 2000))
    ext.learner.store.clock = lambda: float(next(ticks))
    c = app.test_client()
    first = _place(c, source, pod("a", uid="uid-a", model="a/m.onnx"))
    gpu = int(first["tandem.io/gpu-index"])
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(6):  # the first is the pod's warm-up
        r = c.post("/v1/agents/report", headers=headers,
                   json=_report([{"pid": 1, "pod_uid": "uid-a"}], gpu))
        assert r.status_code == 200
    c.post("/v1/agents/report", headers=headers,  # a pod this extender did not place there
           json=_report([{"pid": 2, "pod_uid": "uid-nobody"}], gpu))
    # the same file by URL: observed, not cold start
    second = _place(c, source, pod("b", uid="uid-b", model="https://h.example/m.onnx"))
    assert second["tandem.io/prediction-source"] == "observed:5+mem:no-overhead"
    learned = c.get("/v1/state", headers=AGENT_AUTH).get_json()["learning"]
    assert [e["model"] for e in learned["alone"]] == ["sha256:ee55"]
    text = c.get("/metrics").get_data(as_text=True)
    assert "tandem_learning_observations_accepted_total 5.0" in text
    assert 'tandem_learning_observations_rejected_total{reason="not-placed-here"} 1.0' in text
    assert 'tandem_learning_estimates{state="trusted"} 1.0' in text
    assert 'tandem_learning_estimates{state="learning"} 0.0' in text
    assert "tandem_learning_last_update_mean_abs_change_percent" in text
    assert "tandem_learning_persist_writes_total 0.0" in text
    assert "tandem_learning_persist_failures_total 0.0" in text
    assert "tandem_learning_persist_age_seconds" not in text  # nothing persisted (sim source)
    assert ext.learner.stats()["accepted"] == 5


class FailingPersistence:
    def __init__(self) -> None:
        self.fail = True
        self.saved: list[dict] = []

    def load(self):
        return None

    def save(self, doc) -> None:
        if self.fail:
            raise OSError("API server unreachable")
        self.saved.append(doc)


def test_persistence_writes_failures_and_age_are_counted() -> None:
    wall = [1000.0]
    persistence = FailingPersistence()
    learner = Learner(LearningConfig(persist_interval_seconds=0.001), persistence,
                      wall_clock=lambda: wall[0], clock=lambda: wall[0])
    learner.store.add(("m.onnx", 32, "training", A100), 40.0, alone=True)
    assert not learner.maybe_persist()
    assert learner.stats()["persist_failures"] == 1 and learner.stats()["persist_age_seconds"] \
        is None
    persistence.fail = False
    wall[0] = 1001.0
    assert learner.maybe_persist()
    wall[0] = 1031.0
    stats = learner.stats()
    assert (stats["persist_writes"], stats["persist_age_seconds"]) == (1, 30.0)


def test_the_real_predictor_records_each_references_file_digest(tmp_path: Path) -> None:
    from predictor.api import Predictor
    from predictor.features import file_digest

    first = tiny_model(tmp_path / "m.onnx")
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(first.read_bytes())
    p = Predictor.from_dirs(None)
    assert p.known_digest(str(first)) is None  # nothing read yet: no I/O to answer
    p.predict(str(first), 4, None, "training")
    p.predict(str(copy), 4, None, "training")
    assert p.known_digest(str(first)) == p.known_digest(str(copy)) == file_digest(first)


def test_export_writes_the_reference_and_the_file_digest() -> None:
    from predictor.observed import observed_rows

    store = ObservationStore(LOOSE, digest_of={"m.onnx": "ff66"}.get)
    store.add((store.model_key("m.onnx"), 32, "training", A100), 40.0, alone=True,
              reference="m.onnx")
    store.add(("plain.onnx", 32, "training", A100), 20.0, alone=True)
    rows = {r["model"]: r["model_digest"] for r in observed_rows(store.to_document())}
    assert rows == {"m.onnx": "ff66", "plain.onnx": ""}


def test_a_shared_floor_raises_a_low_prediction_and_never_lowers_one() -> None:
    """Use observed while sharing is a floor of the alone use (observed-shared:<n>)."""
    from contracts.annotations import PodInputs
    from extender.core.demand import JobDemand, UtilKnowledge, resolve_demand

    def predict(util: float):
        return lambda model, batch, gpu_type, workload: (util, 1000.0, "xgboost:abc+mem:eq2")

    shared = {("m.onnx", "T4"): (60.0, 6), ("thin.onnx", "T4"): (60.0, 2)}

    def floor(model, batch, gpu_type, workload):
        return shared.get((model, gpu_type))

    knowledge = UtilKnowledge(None, min_observations=5, shared_floor=floor)

    def resolve(model: str, util: float):
        job = JobDemand(1, PodInputs(model=model, batch_size=32))
        found = resolve_demand(job, ["T4"], predict(util), knowledge=knowledge).for_type("T4")
        assert found is not None
        return found.util_percent, found.source

    assert resolve("m.onnx", 30.0) == (60.0, "observed-shared:6+mem:eq2")
    assert resolve("m.onnx", 80.0) == (80.0, "xgboost:abc+mem:eq2")  # a floor, not a value
    assert resolve("thin.onnx", 30.0) == (30.0, "xgboost:abc+mem:eq2")  # too few samples


def test_colocated_samples_feed_the_shared_floor_of_the_learner() -> None:
    """The learner's knowledge answers the co-located estimate as the floor."""
    store = ObservationStore(LOOSE)
    key = ("m.onnx", 32, "training", "T4")
    for value in (40.0, 42.0, 44.0):
        store.add(key, value, alone=False, reference="m.onnx")
    assert store.lookup("m.onnx", 32, "T4", "training") is None
    assert store.lookup("m.onnx", 32, "T4", "training", shared=True) == (42.0, 3)
    learner = Learner(LearningConfig(), clock=lambda: 0.0, wall_clock=lambda: 0.0)
    learner.store = store
    knowledge = learner.knowledge(LearningConfig()).util()
    assert knowledge.shared_floor is not None
    assert knowledge.shared_floor("m.onnx", 32, "T4", "training") == (42.0, 3)
    assert learner.knowledge(LearningConfig(enabled=False)).util().shared_floor is None
