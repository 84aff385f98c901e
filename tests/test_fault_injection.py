"""Faults at the Kubernetes API boundary: the ledger always equals what the API server bound.

The ``kube`` source runs against the loopback API server (benchmarks/fake_kube_api.py)
with faults injected per request: watch history compacted (410) while pods end, bind
answers lost or timed out and retried, API errors on bind, events and patches, a
leader that crashes mid-bind, and agent reports that renumber GPUs. After each, the
audit (tests/fault_cluster.py) counts reservations lost, leaked or moved: all zero.
"""

from __future__ import annotations

import time

import pytest
from fault_cluster import PlainWatch, audit, cluster, k8s_pod, relist, truth


def wait_for(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def bound_to(fake, name):
    return fake.pod("ml", name)["spec"].get("nodeName")


def bindings(fake, name):
    return [r for r in fake.requests if r.path == f"/api/v1/namespaces/ml/pods/{name}/binding"]


def place(c, replica, names, node="gpu-0"):
    """Create, filter and bind ``names`` on ``node`` through ``replica``."""
    for name in names:
        c.fake.put_pod(k8s_pod(name))
        assert replica.filter(c.fake, name, [node])["NodeNames"] == [node]
        assert replica.bind(name, node) == {"Error": ""}


# ---- (a) watch 410 and relist ----------------------------------------------------------
def test_relist_after_410_releases_pods_that_ended_in_the_gap():
    with cluster() as c:
        r = c.replica()
        place(c, r, ["a", "b", "c", "d"])
        relist(r)  # the watch confirms them
        _, pod_rv = r.source.sync(r.state)
        c.fake.delete_pod("ml", "a")
        ended = c.fake.pod("ml", "b")
        ended["status"]["phase"] = "Failed"
        c.fake.put_pod(ended)
        c.fake.compact()  # the pod watch resumes from a version the server no longer has
        r.source._watch_factory = PlainWatch
        real_sync = r.source.sync

        def sync_then_stop(state):
            r.source._stop.set()
            return real_sync(state)
        r.source.sync = sync_then_stop
        r.source._stop.wait = lambda timeout: False  # no real backoff
        r.source._watch(r.state, c.api.list_pod_for_all_namespaces, r.source.apply_pod_event,
                        pod_rv)
        assert audit(c.fake, r.state).clean
        assert set(truth(c.fake)) == {"uid-c", "uid-d"}



# ---- (c) watch and relist errors ------------------------------------------------------
@pytest.mark.parametrize("code", [500, 410])
def test_watch_and_relist_errors_are_retried_and_the_ledger_catches_up(code):
    """The pod watch fails, then so does the relist: the watch thread must live on."""
    with cluster() as c:
        r = c.replica(PlainWatch)
        c.fake.inject("GET", "^/api/v1/pods$", code, times=2)
        place(c, r, ["p", "q"])
        c.fake.delete_pod("ml", "p")
        wait_for(lambda: audit(c.fake, r.state).clean and r.state.view()["assumed"] == 0, 10)


# ---- (e) agent reports renumbering GPUs ---------------------------------------------------
def gpu_report(node, uuids):
    return {"node": node, "timestamp": 1.0, "interval_seconds": 1.0,
            "gpus": [{"index": i, "uuid": u, "product": "NVIDIA A100-SXM4-40GB",
                      "memory_total_mib": 40960, "memory_used_mib": 0,
                      "utilization_percent": 0, "processes": []} for i, u in enumerate(uuids)]}


def report(replica, node, uuids):
    r = replica.post("/v1/agents/report", gpu_report(node, uuids),
                     {"Authorization": "Bearer agent-token"})
    assert r.status_code == 200, r.get_json()


def pods_per_uuid(state):
    return {g["uuid"]: len(g["pods"]) for g in state.view()["nodes"]["gpu-0"]["gpus"]}


def test_renumbered_gpus_are_never_double_booked():
    with cluster(nodes=1) as c:
        r = c.replica()
        report(r, "gpu-0", ["GPU-A", "GPU-B", "GPU-C"])
        small = {"tandem.io/gpu-util": "1", "tandem.io/gpu-mem-mib": "100"}
        for i in range(24):
            c.fake.put_pod(k8s_pod(f"p{i}", small))
            assert r.bind(f"p{i}", "gpu-0") == {"Error": ""}
        assert pods_per_uuid(r.state) == {"GPU-A": 8, "GPU-B": 8, "GPU-C": 8}
        report(r, "gpu-0", ["GPU-B", "GPU-C"])  # GPU-A vanished, B and C renumbered
        for i in range(24, 28):
            c.fake.put_pod(k8s_pod(f"p{i}", small))
            assert "no longer fits" in r.bind(f"p{i}", "gpu-0")["Error"]
        relist(r)
        real = truth(c.fake)
        assert audit(c.fake, r.state).lost == {u for u, (_, g) in real.items() if g == {"GPU-A"}}
        assert pods_per_uuid(r.state) == {"GPU-B": 8, "GPU-C": 8}
        restarted = c.replica()  # rebuilt from annotations, then the agent reports again
        report(restarted, "gpu-0", ["GPU-B", "GPU-C"])
        assert pods_per_uuid(restarted.state) == {"GPU-B": 8, "GPU-C": 8}
        report(restarted, "gpu-0", ["GPU-C", "GPU-A", "GPU-B"])  # A back, order shuffled
        assert pods_per_uuid(restarted.state) == {"GPU-C": 8, "GPU-A": 8, "GPU-B": 8}
        assert audit(c.fake, restarted.state).clean
