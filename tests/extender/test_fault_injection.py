"""Faults at the Kubernetes API boundary: the ledger always equals what the API server bound.

The ``kube`` source runs against the loopback API server (lab/fakes/kube_api.py)
with faults injected per request: watch history compacted (410) while pods end, bind
answers lost or timed out and retried, API errors on bind, events and patches, a
leader that crashes mid-bind, and agent reports that renumber GPUs. After each, the
audit (tests/fault_cluster.py) counts reservations lost, leaked or moved: all zero.
"""

from __future__ import annotations

import time

import pytest
from extender_builders import state_view
from fault_cluster import PlainWatch, audit, cluster, k8s_pod, relist, truth

from extender.ha.leader import PodLabeler


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


# ---- (b) bind answers lost or timed out, then retried ----------------------------------
@pytest.mark.parametrize("fault", ["lost", "stall"])
def test_bind_whose_answer_is_lost_keeps_its_reservation_and_the_retry_succeeds(fault):
    """The API server applied the Binding but the extender never heard back."""
    with cluster() as c:
        r = c.replica()
        c.fake.record = True
        c.fake.put_pod(k8s_pod("p"))
        r.filter(c.fake, "p", ["gpu-0"])
        c.fake.inject("POST", "/binding$", fault)
        error = r.bind("p", "gpu-0")["Error"]
        assert "outcome unknown" in error
        assert bound_to(c.fake, "p") == "gpu-0"
        assert audit(c.fake, r.state).clean  # held: the pod is on the GPU
        assert r.bind("p", "gpu-0") == {"Error": ""}  # kube-scheduler retries
        assert len(bindings(c.fake, "p")) == 1  # the retry read the pod, wrote nothing
        relist(r)
        assert audit(c.fake, r.state).clean
        assert state_view(r.state)["placed"] == 1


def test_retry_that_cannot_read_the_pod_keeps_the_reservation_and_says_so():
    with cluster() as c:
        r = c.replica()
        c.fake.put_pod(k8s_pod("p"))
        r.filter(c.fake, "p", ["gpu-0"])
        c.fake.inject("POST", "/binding$", "lost")
        r.bind("p", "gpu-0")
        c.fake.inject("GET", "/pods/p$", 500)
        assert "cannot be read" in r.bind("p", "gpu-0")["Error"]
        assert audit(c.fake, r.state).clean  # still held: the pod is bound
        assert r.bind("p", "gpu-0") == {"Error": ""}


def test_watch_confirmation_during_a_timed_out_bind_is_kept():
    """The pod watch shows the binding while the bind call is still waiting for its answer:
    the failed call must not forget the confirmed placement."""
    with cluster() as c:
        r = c.replica(PlainWatch)
        c.fake.put_pod(k8s_pod("p"))
        r.filter(c.fake, "p", ["gpu-0"])
        c.fake.inject("POST", "/binding$", "stall", stall_seconds=1.0)
        assert "outcome unknown" in r.bind("p", "gpu-0")["Error"]
        wait_for(lambda: state_view(r.state)["placed"] == 1)
        assert audit(c.fake, r.state).clean
        assert r.bind("p", "gpu-0") == {"Error": ""}


@pytest.mark.parametrize("code", [500, 503, 504])
def test_bind_server_error_not_applied_holds_until_retry_then_binds_once(code):
    with cluster() as c:
        r = c.replica()
        c.fake.put_pod(k8s_pod("p"))
        r.filter(c.fake, "p", ["gpu-0"])
        c.fake.inject("POST", "/binding$", code)
        assert "outcome unknown" in r.bind("p", "gpu-0")["Error"]
        assert bound_to(c.fake, "p") is None
        assert audit(c.fake, r.state).leaked == {"uid-p"}  # held until the retry or TTL
        assert r.bind("p", "gpu-0") == {"Error": ""}
        assert bound_to(c.fake, "p") == "gpu-0"
        assert audit(c.fake, r.state).clean


def test_unanswered_bind_that_is_never_retried_expires():
    with cluster() as c:
        clock = [1000.0]
        r = c.replica(clock=lambda: clock[0])
        c.fake.put_pod(k8s_pod("p"))
        r.filter(c.fake, "p", ["gpu-0"])
        c.fake.inject("POST", "/binding$", 500)
        r.bind("p", "gpu-0")
        clock[0] += 31  # assume_ttl_seconds passed without a retry or a watch event
        r.state.expire()
        assert audit(c.fake, r.state).clean


def test_retry_on_another_node_after_a_lost_answer_is_refused():
    with cluster() as c:
        r = c.replica()
        c.fake.put_pod(k8s_pod("p"))
        r.filter(c.fake, "p", ["gpu-0", "gpu-1"])
        c.fake.inject("POST", "/binding$", "lost")
        r.bind("p", "gpu-0")
        assert "gpu-0" in r.bind("p", "gpu-1")["Error"]
        assert audit(c.fake, r.state).clean


# ---- (c) API server errors -------------------------------------------------------------
@pytest.mark.parametrize("code", [409, 429, 400, 403, 404])
def test_bind_refused_by_the_api_server_frees_capacity_with_a_clear_error(code):
    with cluster() as c:
        r = c.replica()
        c.fake.put_pod(k8s_pod("p"))
        r.filter(c.fake, "p", ["gpu-0"])
        c.fake.inject("POST", "/binding$", code)
        error = r.bind("p", "gpu-0")["Error"]
        assert "bind to gpu-0 failed" in error and str(code) in error
        assert audit(c.fake, r.state).clean and state_view(r.state)["assumed"] == 0
        assert r.bind("p", "gpu-0") == {"Error": ""}  # the retry binds
        assert audit(c.fake, r.state).clean


@pytest.mark.parametrize("code", [500, 429, 409, "lost"])
def test_event_post_failures_lose_only_the_event(code):
    with cluster() as c:
        r = c.replica()
        c.fake.inject("POST", "/events$", code, times=100)
        place(c, r, ["p", "q"])
        assert r.source.drain_events() == 2  # tried, failed, logged: no exception
        assert len(c.fake.events) == (2 if code == "lost" else 0)  # "lost": stored, unheard
        assert c.fake.faults_injected[str(code)] == 2
        relist(r)
        assert audit(c.fake, r.state).clean and state_view(r.state)["placed"] == 2


def test_leader_label_patch_error_is_retried():
    with cluster() as c:
        c.fake.put_pod(k8s_pod("extender-0", phase="Running"))
        c.fake.inject("PATCH", "/pods/extender-0$", 500)
        labeler = PodLabeler(c.api, "ml", "extender-0")
        labeler.sync(True)
        assert "labels" not in c.fake.pod("ml", "extender-0")["metadata"]
        labeler.sync(True)
        assert c.fake.pod("ml", "extender-0")["metadata"]["labels"] == {"tandem.io/leader": "true"}


@pytest.mark.parametrize("code", [500, 410])
def test_watch_and_relist_errors_are_retried_and_the_ledger_catches_up(code):
    """The pod watch fails, then so does the relist: the watch thread must live on."""
    with cluster() as c:
        r = c.replica(PlainWatch)
        c.fake.inject("GET", r"^/api/v1/pods\?", code, times=2)
        place(c, r, ["p", "q"])
        c.fake.delete_pod("ml", "p")
        wait_for(lambda: audit(c.fake, r.state).clean and state_view(r.state)["assumed"] == 0, 10)


# ---- (d) leader failover mid-bind -------------------------------------------------------
def test_new_leader_after_a_crash_mid_bind_holds_exactly_what_was_bound():
    with cluster() as c:
        leading = {"a": True, "b": False}
        a = c.replica(leading=lambda: leading["a"])
        b = c.replica(PlainWatch, leading=lambda: leading["b"])
        place(c, a, ["p"])
        c.fake.put_pod(k8s_pod("q"))
        a.filter(c.fake, "q", ["gpu-0"])
        assert "not the leader" in b.bind("q", "gpu-0")["Error"]  # the standby never binds
        c.fake.inject("POST", "/binding$", "lost")  # written, then the leader dies
        a.bind("q", "gpu-0")
        a.source.stop()
        leading.update(a=False, b=True)
        wait_for(lambda: audit(c.fake, b.state).clean and state_view(b.state)["assumed"] == 0)
        assert b.bind("q", "gpu-0") == {"Error": ""}  # kube-scheduler's retry, new leader
        assert audit(c.fake, b.state).clean
        fresh = c.replica()  # a replica started after the crash rebuilds from the API
        assert audit(c.fake, fresh.state).clean and state_view(fresh.state)["placed"] == 2
        place(c, b, ["r"])
        assert audit(c.fake, b.state).clean and len(truth(c.fake)) == 3


def test_new_leader_that_has_not_seen_the_binding_yet_refuses_clearly():
    with cluster() as c:
        a, b = c.replica(), c.replica()
        c.fake.put_pod(k8s_pod("q"))
        a.filter(c.fake, "q", ["gpu-0"])
        c.fake.inject("POST", "/binding$", "lost")
        a.bind("q", "gpu-0")
        b.filter(c.fake, "q", ["gpu-0"])
        error = b.bind("q", "gpu-0")["Error"]  # b's watch lags: the API server says 409
        assert "already assigned" in error or error == ""
        relist(b)
        assert audit(c.fake, b.state).clean


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
    return {g["uuid"]: len(g["pods"]) for g in state_view(state)["nodes"]["gpu-0"]["gpus"]}


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
        # It never saw GPU-A reported, so it cannot tell a vanished GPU from a declared UUID
        # the agent measured differently: GPU-A's pods are held at their index (GPU-B), which
        # over-reserves B and never lets a pod more onto it.
        assert pods_per_uuid(restarted.state) == {"GPU-B": 16, "GPU-C": 8}
        c.fake.put_pod(k8s_pod("late", small))
        assert "no longer fits" in restarted.bind("late", "gpu-0")["Error"]
        report(restarted, "gpu-0", ["GPU-C", "GPU-A", "GPU-B"])  # A back, order shuffled
        assert pods_per_uuid(restarted.state) == {"GPU-C": 8, "GPU-A": 8, "GPU-B": 8}
        assert audit(c.fake, restarted.state).clean
