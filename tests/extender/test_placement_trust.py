"""#25: nothing a pod owner writes (or sends to /filter) changes what bind decided.

Against the loopback API server (lab/fakes/kube_api.py) through the ``kube``
source, as tests/extender/test_fault_injection.py does.
"""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from extender_builders import placement, state_view
from fault_cluster import PlainWatch, audit, cluster, k8s_pod, ledger

from agent.device_plugin.assign import Gpu, candidates, choose
from agent.device_plugin.main import placements_of
from agent.node.extender_view import parse_node_view
from extender.cluster import records
from extender.cluster.records import PlacementRecords, decode_entry, encode_entry
from extender.cluster.source import PENDING_TEXT_LIMIT, PendingPods
from extender.core import container_gpu_counts, split_gpus


def reserved(replica, node="gpu-0"):
    return [g["reserved_mib"] for g in state_view(replica.state)["nodes"][node]["gpus"]]


def place(c, replica, names, annotations, node="gpu-0"):
    """Create, filter and bind ``names`` on ``node`` through ``replica``; their records
    written (in the background, after each Binding)."""
    for name in names:
        c.fake.put_pod(k8s_pod(name, annotations))
        assert replica.filter(c.fake, name, [node])["NodeNames"] == [node]
        assert replica.bind(name, node) == {"Error": ""}
    assert replica.source.record_writer.flush(5)


def audit_held(c, replica):
    """UIDs the replica holds, checked against what the API server bound: none lost."""
    assert not audit(c.fake, replica.state).lost
    return set(ledger(replica.state))


def test_a_forged_filter_body_never_sets_what_bind_reserves():
    """A /filter for a pod the scheduler has not asked about yet, claiming 100 MiB against
    the pod's real 30,000, then /bind: bind reads the pod from the API server."""
    with cluster(nodes=1) as c:
        r = c.replica()
        real = c.fake.put_pod(k8s_pod("big", {"tandem.io/gpu-util": "20",
                                              "tandem.io/gpu-mem-mib": "30000"}))
        forged = {**real, "metadata": {**real["metadata"], "annotations": {
            "tandem.io/gpu-util": "1", "tandem.io/gpu-mem-mib": "100"}}}
        assert r.post("/filter", {"Pod": forged, "NodeNames": ["gpu-0"]}).get_json()[
            "NodeNames"] == ["gpu-0"]
        assert r.bind("big", "gpu-0") == {"Error": ""}
        assert sorted(reserved(r)) == [0, 30000]
        ann = c.fake.pod("ml", "big")["metadata"]["annotations"]
        assert ann["tandem.io/predicted-gpu-mem-mib"] == "30000"


def test_a_forged_filter_with_the_real_uid_and_version_does_not_answer_for_the_real_pod():
    """The demand cache is keyed by the pod's contents: a body with the real pod's UID and
    resourceVersion asserting 1 MiB, before and after the scheduler's filter of the real
    pod (30,000 MiB), then its bind."""
    with cluster(nodes=1) as c:
        r = c.replica()
        real = c.fake.put_pod(k8s_pod("p", {"tandem.io/gpu-util": "20",
                                            "tandem.io/gpu-mem-mib": "30000"}))
        forged = {**real, "metadata": {**real["metadata"], "annotations": {
            "tandem.io/gpu-util": "1", "tandem.io/gpu-mem-mib": "1"}}}
        r.post("/filter", {"Pod": forged, "NodeNames": ["gpu-0"]})
        assert r.filter(c.fake, "p", ["gpu-0"])["NodeNames"] == ["gpu-0"]
        r.post("/filter", {"Pod": forged, "NodeNames": ["gpu-0"]})  # last word is forged
        assert r.bind("p", "gpu-0") == {"Error": ""}
        assert sorted(reserved(r)) == [0, 30000]
        assert audit(c.fake, r.state).clean


# ---- Kube mode: rebuilds (restart, 410 relist) take placements from the record -------------
def watch_through_a_410(c, r):
    """A pod watch resuming from a compacted version: the API server answers 410 Gone and the
    source relists (the real path, not a direct sync)."""
    _, pod_rv = r.source.sync(r.state)
    c.fake.compact()
    r.source._watch_factory = PlainWatch
    real_sync = r.source.sync
    relists = []

    def sync_then_stop(state):
        relists.append(1)
        r.source._stop.set()
        return real_sync(state)
    r.source.sync = sync_then_stop
    r.source._stop.wait = lambda timeout: False
    r.source._watch(r.state, c.api.list_pod_for_all_namespaces, r.source.apply_pod_event,
                    pod_rv)
    assert relists == [1]


def edit(c, name, **changes):
    pod = c.fake.pod("ml", name)
    ann = pod["metadata"]["annotations"]
    for key, value in changes.items():
        key = f"tandem.io/{key.replace('_', '-')}"
        if value is None:
            ann.pop(key, None)
        else:
            ann[key] = value
    c.fake.put_pod(pod)


TWENTY = {"tandem.io/gpu-util": "20", "tandem.io/gpu-mem-mib": "20000"}


@pytest.mark.parametrize("rebuild", ["relist-410", "restart"])
def test_pods_whose_annotations_no_longer_parse_keep_their_gpus(rebuild):
    with cluster(nodes=1) as c:
        r = c.replica()
        place(c, r, ["a", "b"], TWENTY)  # one per GPU (20,000 MiB each, 40,960 per GPU)
        before = reserved(r)
        assert sorted(before) == [20000, 20000]
        edit(c, "a", gpu_index=None)
        edit(c, "b", predicted_gpu_util="NaN")
        if rebuild == "relist-410":
            watch_through_a_410(c, r)
        else:
            r = c.replica()
        assert reserved(r) == before
        assert audit_held(c, r) == {"uid-a", "uid-b"}
        c.fake.put_pod(k8s_pod("c", {"tandem.io/gpu-util": "20",
                                     "tandem.io/gpu-mem-mib": "30000"}))
        assert r.filter(c.fake, "c", ["gpu-0"])["NodeNames"] == []
        assert "no longer fits" in r.bind("c", "gpu-0")["Error"]
        if rebuild == "restart":  # what a person sees: the edits are reported
            r.source.drain_events()
            untrusted = [e for e in c.fake.events if e["reason"] == "TandemPlacementUntrusted"]
            assert {e["involvedObject"]["name"] for e in untrusted} == {"a", "b"}


def test_moved_names_and_a_forged_signature_do_not_move_the_reservation():
    with cluster(nodes=1) as c:
        r = c.replica()
        place(c, r, ["a"], TWENTY)
        ann = c.fake.pod("ml", "a")["metadata"]["annotations"]
        where = int(ann["tandem.io/gpu-index"])
        other = 1 - where
        edit(c, "a", gpu_index=str(other), gpu_uuid=str(other),
             placement_signature="v1:" + "0" * 64)
        restarted = c.replica()
        held = reserved(restarted)
        assert held[where] == 20000 and held[other] == 0  # where bind put it


def test_a_pod_that_skipped_the_scheduler_holds_its_whole_node_and_is_not_placed():
    with cluster(nodes=1) as c:
        r = c.replica()
        place(c, r, ["a"], TWENTY)
        r.source.sync(r.state)  # the watch confirms it
        copied = k8s_pod("bypass", c.fake.pod("ml", "a")["metadata"]["annotations"],
                         phase="Running")
        copied["spec"]["nodeName"] = "gpu-0"
        c.fake.put_pod(copied)
        for replica in (r, c.replica()):  # a watch event, and a restart
            if replica is r:
                r.source.apply_pod_event(r.state, "ADDED", c.fake.pod("ml", "bypass"))
            view = state_view(replica.state)
            assert (view["placed"], view["untrusted"]) == (1, 1)
            states = {p["pod"]: p["state"] for g in view["nodes"]["gpu-0"]["gpus"]
                      for p in g["pods"]}
            assert states == {"ml/a": "placed", "ml/bypass": "untrusted"}
            assert [g["reserved_mib"] >= 40960 for g in view["nodes"]["gpu-0"]["gpus"]] == \
                [True, True]
            replica.source.drain_events()
        events = [e for e in c.fake.events if e["reason"] == "TandemPlacementUntrusted"]
        assert {e["involvedObject"]["name"] for e in events} == {"bypass"}
        # The device plugin, reading this state, has nothing to hand the bypass pod: "a"
        # holds its GPU, and "bypass" is no candidate.
        node = parse_node_view(state_view(r.state), "gpu-0")
        inventory = {g.uuid: Gpu(g.index, g.uuid) for g in node.gpus}
        waiting = candidates(placements_of(node), inventory, {"ml/a": {"c"}})
        assert waiting == []
        assert choose(waiting, 1, "gpu-0").reason == "NoAssignment"


def test_output_annotations_on_a_pod_that_asks_for_no_gpu_block_nothing():
    """A CPU pod carrying copied tandem.io/* outputs gets no tandem GPU (the device plugin
    hands out only tandem.io/gpu), so it must not lock a node either."""
    with cluster(nodes=1) as c:
        r = c.replica()
        place(c, r, ["a"], TWENTY)
        cpu = k8s_pod("cpu", c.fake.pod("ml", "a")["metadata"]["annotations"], "Running")
        cpu["spec"] = {"nodeName": "gpu-0", "containers": [{"name": "c"}]}
        c.fake.put_pod(cpu)
        restarted = c.replica()
        assert sorted(reserved(restarted)) == [0, 20000]
        assert state_view(restarted.state)["untrusted"] == 0


def test_the_record_lives_in_the_extenders_namespace_and_drops_pods_that_are_gone(
        monkeypatch):
    with cluster(nodes=1) as c:
        r = c.replica()
        place(c, r, ["a", "b"], TWENTY)
        record = c.fake.configmaps[("tandem-system", "tandem-placements-gpu-0")]
        assert set(record["data"]) == {"uid-a", "uid-b"}
        assert record["metadata"]["labels"]["tandem.io/placement-record"] == "true"
        gone = c.fake.pod("ml", "a")
        c.fake.delete_pod("ml", "a")
        r.source.apply_pod_event(r.state, "DELETED", gone)
        place(c, r, ["c"], TWENTY)  # a's entry is young: a new leader may not know it yet
        record = c.fake.configmaps[("tandem-system", "tandem-placements-gpu-0")]
        assert set(record["data"]) == {"uid-a", "uid-b", "uid-c"}
        later = time.time() + records.KEEP_SECONDS + 1
        monkeypatch.setattr(records.time, "time", lambda: later)
        place(c, r, ["d"], TWENTY)
        record = c.fake.configmaps[("tandem-system", "tandem-placements-gpu-0")]
        assert set(record["data"]) == {"uid-b", "uid-c", "uid-d"}


def test_bind_takes_a_pending_pod_from_the_watch_without_a_read():
    """With the pod watch running, bind reads the pod the watch delivered (the API server's
    copy, never a /filter body) and saves the round trip."""
    with cluster(nodes=1) as c:
        r = c.replica(PlainWatch)
        c.fake.record = True
        real = c.fake.put_pod(k8s_pod("big", {"tandem.io/gpu-util": "20",
                                              "tandem.io/gpu-mem-mib": "30000"}))
        deadline = time.monotonic() + 5
        while r.source._pending.get("ml", "big") is None:
            assert time.monotonic() < deadline, "the watch never delivered the pod"
            time.sleep(0.01)
        forged = {**real, "metadata": {**real["metadata"], "annotations": {
            "tandem.io/gpu-util": "1", "tandem.io/gpu-mem-mib": "100"}}}
        r.post("/filter", {"Pod": forged, "NodeNames": ["gpu-0"]})
        c.fake.requests.clear()
        assert r.bind("big", "gpu-0") == {"Error": ""}
        assert sorted(reserved(r)) == [0, 30000]
        assert not [q for q in c.fake.requests if q.method == "GET"]


def test_records_through_the_official_client_when_the_lean_one_cannot_speak():
    """The records' second path (a configuration ``kube_http.supports`` refuses)."""
    with cluster(nodes=1) as c:
        store = PlacementRecords(c.api, "tandem-system", poster=None)
        store.load_all()
        p = placement("uid-x", pod="ml/x", node="gpu-0", gpus=(1,), util=10, mem=100)
        store.write("gpu-0", "uid-x", encode_entry(p, at=0.0), keep=lambda uid: True)
        store.write("gpu-0", "uid-y", encode_entry(p), keep=lambda uid: uid != "uid-x")
        again = PlacementRecords(c.api, "tandem-system", poster=None)
        again.load_all()
        assert again.entry("gpu-0", "uid-x", refresh=True) is None  # dropped by keep
        assert decode_entry("uid-y", "ml/x", "gpu-0", again.entry(
            "gpu-0", "uid-y", refresh=False)) == dataclasses.replace(p, pod_uid="uid-y")
        assert decode_entry("uid-y", "ml/other", "gpu-0",
                            again.entry("gpu-0", "uid-y", refresh=False)) is None


# ---- the record's entries and the container split ------------------------------------------
GOOD = {"v": 1, "at": 1.0, "pod": "ml/x", "node": "gpu-0", "gpus": [1], "uuids": ["GPU-b"],
        "util": 10.0, "mem": 100.0, "workload": "training", "session": None, "weight": 1,
        "containers": [["c", [1]]]}


@pytest.mark.parametrize("change", [
    {"v": 2}, {"pod": "ml/other"}, {"node": "gpu-1"}, {"gpus": []}, {"gpus": [True]},
    {"gpus": [-1]}, {"uuids": ["a", "b"]}, {"util": float("nan")}, {"mem": -1},
    {"workload": "mining"}, {"session": ["m", "fast", 1]}, {"weight": "1"},
    {"containers": [["c"]]}, {"gpus": None}],
    ids=lambda c: next(iter(c)))
def test_an_entry_that_does_not_read_back_exactly_is_no_record(change):
    assert decode_entry("uid-x", "ml/x", "gpu-0", json.dumps(GOOD)) is not None
    assert decode_entry("uid-x", "ml/x", "gpu-0", json.dumps({**GOOD, **change})) is None


def test_an_oversized_or_non_json_entry_is_no_record():
    assert decode_entry("u", "ml/x", "gpu-0", "{" * 10) is None
    assert decode_entry("u", "ml/x", "gpu-0", " " * (records.MAX_ENTRY_BYTES + 1)) is None
    assert decode_entry("u", "ml/x", "gpu-0", None) is None


@pytest.mark.parametrize(("counts", "indices", "want"), [
    ((("c1", 1, False), ("c2", 1, False)), (2, 3), (("c1", (2,)), ("c2", (3,)))),
    ((("a", 2, False), ("b", 1, False)), (0, 1, 5), (("a", (0, 1)), ("b", (5,)))),
    ((("init", 2, True), ("a", 1, False), ("b", 1, False)), (4, 6),
     (("init", (4, 6)), ("a", (4,)), ("b", (6,)))),
    ((("a", 0, False), ("b", 1, False)), (7,), (("b", (7,)),)),
])
def test_containers_take_the_bound_gpus_in_admission_order(counts, indices, want):
    assert split_gpus(counts, indices) == want


def test_container_counts_follow_the_kubelets_admission_order():
    pod = {"spec": {
        "initContainers": [{"name": "prep", "resources": {"limits": {"tandem.io/gpu": "1"}}}],
        "containers": [{"name": "cpu"},
                       {"name": "c1", "resources": {"limits": {"tandem.io/gpu": "2"}}},
                       {"name": "c2", "resources": {"requests": {"tandem.io/gpu": "1"}}}]}}
    assert container_gpu_counts(pod) == (("prep", 1, True), ("c1", 2, False), ("c2", 1, False))


def test_an_untrusted_pod_also_holds_gpus_its_node_reports_later():
    """Bound before the node's GPUs were known (no GFD labels yet): once an agent reports
    them, the pod holds every one."""
    with cluster(nodes=1) as c:
        c.fake.put_node({"metadata": {"name": "bare", "labels": {}}})
        bypass = k8s_pod("bypass", {}, phase="Running")
        bypass["spec"]["nodeName"] = "bare"
        c.fake.put_pod(bypass)
        r = c.replica()
        assert state_view(r.state)["untrusted"] == 1
        report = {"node": "bare", "timestamp": 1.0, "interval_seconds": 1.0,
                  "gpus": [{"index": i, "uuid": f"GPU-{i}", "product": "NVIDIA A100-SXM4-40GB",
                            "memory_total_mib": 40960, "memory_used_mib": 0,
                            "utilization_percent": 0, "processes": []} for i in range(2)]}
        assert r.post("/v1/agents/report", report,
                      {"Authorization": "Bearer agent-token"}).status_code == 200
        held = reserved(r, "bare")  # its memory was unknown at bind: the largest a pod may ask
        assert len(held) == 2 and all(m >= 40960 for m in held)


def test_two_writers_of_one_record_lose_nothing():
    """A new leader writes with the version it listed; the old leader wrote since: the
    resourceVersion precondition refuses the stale write, which reads and retries."""
    with cluster(nodes=1) as c:
        old, new = (PlacementRecords(c.api, "tandem-system") for _ in range(2))
        old.load_all()
        new.load_all()
        p = placement("uid-1", pod="ml/x", node="gpu-0", gpus=(0,), util=10, mem=100)
        old.write("gpu-0", "uid-1", encode_entry(p), keep=lambda uid: True)
        old.write("gpu-0", "uid-2", encode_entry(p), keep=lambda uid: True)
        new.write("gpu-0", "uid-3", encode_entry(p), keep=lambda uid: False)  # all young
        stored = c.fake.configmaps[("tandem-system", "tandem-placements-gpu-0")]
        assert set(stored["data"]) == {"uid-1", "uid-2", "uid-3"}


def test_the_pending_cache_keeps_only_what_bind_reads_and_stays_bounded():
    cache = PendingPods(limit=2)
    pod = k8s_pod("p", {"tandem.io/gpu-mem-mib": "100", "note": "x" * 100_000})
    cache.observe(pod, False)
    kept = cache.get("ml", "p")
    assert kept["metadata"]["annotations"] == {"tandem.io/gpu-mem-mib": "100"}
    assert kept["spec"]["containers"] == [{"name": "c", "resources": {
        "limits": {"tandem.io/gpu": "1"}}}]
    padded = k8s_pod("q", {"tandem.io/pad": "x" * (PENDING_TEXT_LIMIT + 1)})
    cache.observe(padded, False)
    assert cache.get("ml", "q") is None  # bind reads it from the API server instead
    for name in ("a", "b"):
        cache.observe(k8s_pod(name), False)
    assert cache.get("ml", "p") is None and cache.get("ml", "b") is not None
    bound = k8s_pod("b")
    bound["spec"]["nodeName"] = "gpu-0"
    cache.observe(bound, False)
    assert cache.get("ml", "b") is None


def test_unparseable_edits_of_a_running_pod_are_flagged_at_the_watch_event():
    """docs/security.md: one TandemPlacementUntrusted event per edited pod, from the watch
    event that shows the edit (not the next relist), and the reservation kept."""
    with cluster(nodes=1) as c:
        r = c.replica(watch=PlainWatch)
        r.source.start(r.state)
        place(c, r, ["a", "b", "c"], {"tandem.io/gpu-util": "20",
                                      "tandem.io/gpu-mem-mib": "10000"})
        before = reserved(r)

        def untrusted():
            r.source.drain_events()
            return sorted(e["involvedObject"]["name"] for e in c.fake.events
                          if e["reason"] == "TandemPlacementUntrusted")

        time.sleep(0.3)  # the bound events of a, b, c came through the watch: nothing flagged
        assert untrusted() == []
        edit(c, "a", gpu_index=None)
        edit(c, "b", predicted_gpu_util="NaN")
        deadline = time.monotonic() + 10
        while untrusted() != ["a", "b"]:
            assert time.monotonic() < deadline, untrusted()
            time.sleep(0.05)
        edit(c, "a", gpu_index=None, predicted_gpu_mem_mib="x")  # edited again: no second one
        c.fake.put_pod(c.fake.pod("ml", "b"))
        time.sleep(0.3)
        assert untrusted() == ["a", "b"]
        assert reserved(r) == before
        assert audit_held(c, r) == {"uid-a", "uid-b", "uid-c"}
