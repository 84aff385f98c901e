"""The learning ConfigMap across failovers and at its size limit (fake API server)."""

from __future__ import annotations

import json

from extender.config.sections import LearningConfig
from extender.learning.learner import ConfigMapPersistence, Learner
from extender.learning.persistence import DOCUMENT_KEY, MAX_BYTES

A100 = "NVIDIA-A100-SXM4-40GB"
KEY = ("m.onnx", 32, "training", A100)
OTHER = ("n.onnx", 8, "training", A100)
CM = ("tandem", "tandem-learning")


def replica(api, leading: list[bool], now: list[float]) -> Learner:
    learner = Learner(LearningConfig(persist_interval_seconds=1.0, min_observations=1,
                                     min_observed_seconds=0, spread_margin=0),
                      ConfigMapPersistence(api, *CM), may_persist=lambda: leading[0],
                      clock=lambda: now[0], wall_clock=lambda: now[0])
    learner.start()
    return learner


def stored(server) -> dict:
    return json.loads(server.configmaps[CM]["data"][DOCUMENT_KEY])


def samples(doc: dict, key: tuple) -> int | None:
    rows = [e["samples"] for e in doc["alone"]
            if (e["model"], e["batch_size"], e["workload"], e["gpu_type"]) == key]
    return rows[0] if rows else None


def test_a_stale_standby_that_becomes_leader_keeps_the_old_leaders_samples(kube_api) -> None:
    server, api = kube_api
    now = [0.0]
    a_leads, b_leads = [True], [False]
    a = replica(api, a_leads, now)
    b = replica(api, b_leads, now)  # started days ago: it read an empty ConfigMap
    for i in range(50):
        a.store.add(KEY, 40.0 + i % 3, alone=True)
        now[0] += 2.0
        a.maybe_persist()
    assert samples(stored(server), KEY) == 50
    for _ in range(3):  # reports the Service routed to the standby
        b.store.add(OTHER, 70.0, alone=True)
    # Failover: a stops leading, b wins the Lease; b's first write merges, not replaces.
    a_leads[0], b_leads[0] = False, True
    now[0] += 10.0
    assert b.maybe_persist()
    doc = stored(server)
    assert (samples(doc, KEY), samples(doc, OTHER)) == (50, 3)
    assert b.store.lookup(*KEY[:2], KEY[3], KEY[2])[1] == 50  # b predicts from a's samples
    # Two leaders for a moment (a has not seen it lost the Lease): a's write conflicts
    # with b's, is merged and retried; neither side's samples are lost or counted twice.
    a_leads[0] = True
    a.store.add(KEY, 41.0, alone=True)
    b.store.add(OTHER, 70.0, alone=True)
    now[0] += 10.0
    assert b.maybe_persist()
    assert a.maybe_persist()
    doc = stored(server)
    assert (samples(doc, KEY), samples(doc, OTHER)) == (51, 4)
    assert a.stats()["persist_conflicts"] >= 1


def test_the_document_stays_under_the_configmap_limit_evicting_least_recently_used(
        kube_api) -> None:
    server, api = kube_api
    now = [0.0]
    learner = replica(api, [True], now)
    url = "https://models.example.com/" + "team/" * 30 + "model-{}.onnx"
    for i in range(learner.cfg.max_entries):  # both tables at their entry cap
        now[0] += 1.0
        learner.store.add((url.format(i), 32, "training", A100), 50.0, alone=True)
        learner.store.add((url.format(i), 32, "training", A100), 60.0, alone=False)
    now[0] += 1.0
    assert learner.store.lookup(url.format(0), 32, A100, "training") is not None  # used now
    long_ref = "s3://bucket/" + "x" * 10_000
    learner.store.add((learner.store.model_key(long_ref), 8, "training", A100), 30.0,
                      alone=True, reference=long_ref)
    now[0] += 5.0
    assert learner.maybe_persist()  # the unbounded document was refused on every write
    text = server.configmaps[CM]["data"][DOCUMENT_KEY]
    assert len(text) <= MAX_BYTES
    assert learner.stats()["evicted"] > 0
    doc = json.loads(text)
    models = {e["model"] for e in doc["alone"]}
    assert url.format(0) in models  # looked up last: kept
    assert url.format(1) not in models  # least recently used: evicted first
    assert all(len(e["model"]) <= 256 and len(e["reference"]) <= 256
               for e in doc["alone"] + doc["colocated"])
    assert learner.store.lookup(long_ref, 8, A100, "training") == (30.0, 1)
    # The next write still works: persistence did not stop.
    learner.store.add(KEY, 33.0, alone=True)
    now[0] += 5.0
    assert learner.maybe_persist() and learner.stats()["persist_failures"] == 0


def test_an_unreachable_api_server_is_read_again_once_per_interval_not_per_report(
        kube_api) -> None:
    server, api = kube_api
    now = [0.0]
    learner = replica(api, [True], now)
    server.inject("GET", "/api/v1/namespaces/tandem/configmaps/tandem-learning", 503, times=1)
    learner.store.add(KEY, 40.0, alone=True)
    gets = len([r for r in server.requests if r.method == "GET"])
    assert not learner.maybe_persist()  # the new leader cannot read what was persisted
    assert not learner.maybe_persist()  # ... and does not ask again on every report
    assert len([r for r in server.requests if r.method == "GET"]) == gets + 1
    now[0] += 1.0  # learning.persist_interval_seconds later: read, merged, written
    assert learner.maybe_persist()
    assert samples(stored(server), KEY) == 1


def test_learned_shapes_survive_a_failover_through_the_configmap(kube_api) -> None:
    server, api = kube_api
    now = [0.0]
    a_leads, b_leads = [True], [False]
    a = replica(api, a_leads, now)
    for _ in range(3):
        a.shapes.observe(1, 40960, 8000, 16384)
    a.shapes.observe(0, 0, 2000, 4096)
    now[0] += 2.0
    assert a.maybe_persist()  # shapes alone make the document due
    assert sorted(map(tuple, stored(server)["shapes"]["rows"])) == [
        (0, 0.0, 2000.0, 4096.0, 1.0), (1, 40960.0, 8000.0, 16384.0, 3.0)]
    b = replica(api, b_leads, now)  # a new replica reloads them at start
    assert b.shapes.to_document() == a.shapes.to_document()
    b.shapes.observe(1, 40960, 8000, 16384)
    a_leads[0], b_leads[0] = False, True
    now[0] += 10.0
    assert b.maybe_persist()
    rows = {tuple(r[:4]): r[4] for r in stored(server)["shapes"]["rows"]}
    assert rows[(1, 40960.0, 8000.0, 16384.0)] == 4.0  # counted once, not twice
