"""Preemption for GPU shortages: the pure victim choice, then the extender carrying it out
against the fake API server (Eviction API, PodDisruptionBudgets, pods/status)."""

from __future__ import annotations

import time

import pytest
from extender_builders import state_view
from kubernetes import client

from extender.cluster.kube import KubeSource, PlainWatch
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.core.preemption import Candidate, choose_preemption, victims_on_node
from extender.preemption.kube_api import selector_matches
from extender.state.signing import PlacementSigner
from extender.wiring import create_app
from lab.fakes import kube_api as fake_kube_api

# ---- the pure choice: a node of capacity 10, the preemptor needs `need` free --------------


def capacity_fits(used: dict[str, dict[str, int]], need: int, capacity: int = 10):
    def fits(node, gone):
        return capacity - sum(v for u, v in used[node].items() if u not in gone) >= need
    return fits


def cand(uid, priority, budgets=()):
    return Candidate(uid, f"ns/{uid}", priority, tuple(budgets))


def test_only_lower_priority_pods_and_the_fewest_needed():
    used = {"n": {"a": 2, "b": 3, "c": 5}}
    pods = [cand("a", 1), cand("b", 2), cand("c", 3)]
    # need 5 free: evicting c alone (5) suffices, but c has the highest priority; the
    # reprieve keeps the highest priorities first, so a and b (2+3) go and c stays
    assert [v.uid for v in victims_on_node("n", pods, 10, {}, capacity_fits(used, 5))] \
        == ["a", "b"]
    # need 8 free: c must go; then b suffices (3+5) and a (lowest priority) is reprieved
    # last, so it is kept only if not needed: a is not needed once b and c are gone
    assert [v.uid for v in victims_on_node("n", pods, 10, {}, capacity_fits(used, 8))] \
        == ["b", "c"]
    # equal or higher priority is never a victim
    assert victims_on_node("n", pods, 3, {}, capacity_fits(used, 8)) is None
    # fits already: not a preemption
    assert victims_on_node("n", pods, 10, {}, capacity_fits({"n": {"a": 2}}, 5)) is None


def test_budgets_protect_pods_and_limit_how_many_go():
    used = {"n": {"a": 5, "b": 5}}
    fits = capacity_fits(used, 10)
    pods = [cand("a", 0, ["ns/pdb"]), cand("b", 0, ["ns/pdb"])]
    assert victims_on_node("n", pods, 10, {"ns/pdb": 0}, fits) is None
    assert victims_on_node("n", pods, 10, {"ns/pdb": 1}, fits) is None  # both needed
    assert len(victims_on_node("n", pods, 10, {"ns/pdb": 2}, fits)) == 2
    assert victims_on_node("n", pods, 10, {}, fits) is None  # an unknown budget allows none


def test_node_choice_prefers_lower_victim_priority_then_fewer_pods():
    used = {"x": {"x1": 10}, "y": {"y1": 5, "y2": 5}, "z": {"z1": 10}}
    nodes = {"x": [cand("x1", 5)], "y": [cand("y1", 1), cand("y2", 1)], "z": [cand("z1", 1)]}
    plan = choose_preemption(nodes, 10, {}, capacity_fits(used, 10))
    assert plan.node == "z" and [v.uid for v in plan.victims] == ["z1"]
    assert choose_preemption({"x": [cand("x1", 5)]}, 5, {}, capacity_fits(used, 10)) is None


def test_label_selectors():
    labels = {"app": "a", "tier": "web"}
    assert selector_matches({"matchLabels": {"app": "a"}}, labels)
    assert not selector_matches({"matchLabels": {"app": "b"}}, labels)
    assert selector_matches({"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["web"]},
        {"key": "gone", "operator": "DoesNotExist"}]}, labels)
    assert not selector_matches({"matchExpressions": [
        {"key": "tier", "operator": "NotIn", "values": ["web"]}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "app", "operator": "Bogus"}]},
                                labels)
    assert selector_matches({}, labels)


# ---- carried out against the fake API server -----------------------------------------------

KEY = "test-signing-key-0123456789"
GFD = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
       "nvidia.com/gpu.memory": "40960"}


def placed(name, node, mib, priority, labels=None):
    ann = PlacementSigner(KEY.encode()).sign(f"uid-{name}", node, {
        "tandem.io/gpu-index": "0", "tandem.io/predicted-gpu-util": "10.00",
        "tandem.io/predicted-gpu-mem-mib": str(mib)})
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "annotations": ann, "labels": labels or {}},
            "spec": {"nodeName": node, "priority": priority, "containers": [
                {"name": "c", "resources": {"limits": {"tandem.io/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


def pending(name, mib, priority, policy=None):
    spec = {"priority": priority, "containers": [
        {"name": "c", "resources": {"limits": {"tandem.io/gpu": "1"}}}]}
    if policy:
        spec["preemptionPolicy"] = policy
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "annotations": {"tandem.io/gpu-util": "10",
                                         "tandem.io/gpu-mem-mib": str(mib)}},
            "spec": spec, "status": {"phase": "Pending"}}


@pytest.fixture
def cluster():
    """gpu-a: one pod under a budget with no disruption left; gpu-b: a priority-0 pod of
    10000 MiB and a priority-10 pod of 25000 MiB. Each node has one 40960 MiB GPU."""
    fake = fake_kube_api.FakeKubeApi(
        nodes=[{"metadata": {"name": n, "labels": GFD}} for n in ("gpu-a", "gpu-b")],
        pods=[placed("guarded", "gpu-a", 30000, 0, {"app": "guarded"}),
              placed("low", "gpu-b", 10000, 0), placed("mid", "gpu-b", 25000, 10)])
    fake.put_pdb({"metadata": {"name": "guarded", "namespace": "ml"},
                  "spec": {"selector": {"matchLabels": {"app": "guarded"}}},
                  "status": {"disruptionsAllowed": 0}})
    fake.start()
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=fake.url)))
    source = KubeSource(api, watch_factory=PlainWatch, background_events=False)
    app = create_app(ConfigHolder(build_config({})), source,
                     environ={"TANDEM_SIGNING_KEY": KEY})
    yield fake, app, source
    ext = app.extensions["tandem"]
    if ext.preemptor is not None:
        ext.preemptor.stop()
    source.stop()
    fake.stop()


def wait_for(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def do_filter(app, fake, name, nodes=("gpu-a", "gpu-b")):
    return app.test_client().post("/filter", json={
        "Pod": fake.pod("ml", name), "NodeNames": list(nodes)}).get_json()


def posted_events(source, fake):
    """(pod, reason) of every event posted so far (the queue drained first)."""
    source.drain_events()
    return {(e["involvedObject"]["name"], e["reason"]) for e in fake.events}


def evictions(fake):
    return [r.path.split("/")[-2] for r in fake.requests
            if r.method == "POST" and r.path.endswith("/eviction")]


def test_high_priority_pod_preempts_the_fewest_unprotected_pods(cluster):
    fake, app, source = cluster
    ext = app.extensions["tandem"]
    fake.put_pod(pending("urgent", 30000, 100))
    result = do_filter(app, fake, "urgent")
    # kube-scheduler must not try its own preemption: every node is unresolvable to it
    assert result["NodeNames"] == [] and result["FailedNodes"] == {}
    assert set(result["FailedAndUnresolvableNodes"]) == {"gpu-a", "gpu-b"}
    wait_for(lambda: "uid-mid" not in {p["metadata"]["uid"] for p in fake.pods.values()})
    # guarded (budget) and low (not needed once mid is gone) stay
    assert evictions(fake) == ["mid"]
    wait_for(lambda: fake.pod("ml", "urgent")["status"].get("nominatedNodeName") == "gpu-b")
    wait_for(lambda: {("mid", "TandemPreempted"), ("urgent", "TandemPreempting")}
             <= posted_events(source, fake))
    # the freed GPU is kept: another pod that fits there does not get it
    wait_for(lambda: ext.state.placement_of("nominated/uid-urgent") is not None)
    fake.put_pod(pending("other", 20000, 100))
    other = do_filter(app, fake, "other")
    assert other["NodeNames"] == [] and "gpu-b" in other["FailedAndUnresolvableNodes"]
    # ... while the preemptor passes there and binds
    assert do_filter(app, fake, "urgent")["NodeNames"] == ["gpu-b"]
    bound = app.test_client().post("/bind", json={"PodName": "urgent", "PodNamespace": "ml",
                                                  "PodUID": "uid-urgent", "Node": "gpu-b"})
    assert bound.get_json() == {"Error": ""}
    assert ext.state.placement_of("nominated/uid-urgent") is None
    assert ext.state.placement_of("uid-urgent").node == "gpu-b"


def test_pod_that_must_not_preempt_evicts_nothing(cluster):
    fake, app, _ = cluster
    fake.put_pod(pending("polite", 30000, 100, policy="Never"))
    assert do_filter(app, fake, "polite")["NodeNames"] == []
    time.sleep(0.5)
    assert evictions(fake) == []
    assert "nominatedNodeName" not in fake.pod("ml", "polite")["status"]


def test_only_protected_victims_means_no_preemption(cluster):
    fake, app, _ = cluster
    fake.put_pod(pending("urgent", 30000, 100))
    # on gpu-a only the guarded pod could make room, and its budget allows no disruption
    assert do_filter(app, fake, "urgent", ["gpu-a"])["NodeNames"] == []
    time.sleep(0.5)
    assert evictions(fake) == []
    assert "nominatedNodeName" not in fake.pod("ml", "urgent")["status"]


def test_eviction_refused_by_the_api_server_stops_and_says_so(cluster):
    fake, app, source = cluster
    fake.inject("POST", "/eviction", 429)
    fake.put_pod(pending("urgent", 30000, 100))
    do_filter(app, fake, "urgent")
    wait_for(lambda: fake.faults_injected["429"] == 1)
    wait_for(lambda: not app.extensions["tandem"].preemptor._nominated)
    wait_for(lambda: ("urgent", "TandemPreemptionBlocked") in posted_events(source, fake))
    assert "nominatedNodeName" not in fake.pod("ml", "urgent")["status"]
    assert {"low", "mid"} <= {name for _, name in fake.pods}


def test_sim_source_has_no_preemptor():
    from extender.cluster.sim import SimSource
    app = create_app(ConfigHolder(build_config({})), SimSource([], []))
    assert app.extensions["tandem"].preemptor is None


# ---- with the agents reporting what the victims use -----------------------------------------

TOKEN = "agent-token-for-preemption"


def agent_report(node, used_mib):
    return {"node": node, "timestamp": time.time(), "interval_seconds": 0.1,
            "gpus": [{"index": 0, "uuid": f"GPU-{node}", "product": "NVIDIA A100-SXM4-40GB",
                      "memory_total_mib": 40960, "memory_used_mib": used_mib,
                      "utilization_percent": 10.0 if used_mib else 0.0, "processes": []}]}


@pytest.fixture
def reported_cluster():
    """16 nodes of one 40 GB GPU, each running a priority-0 pod of 30000 MiB, and an agent per
    node reporting what the pods the API server still has there use (every 0.1 s)."""
    import threading

    nodes = [f"gpu-{i:02d}" for i in range(16)]
    fake = fake_kube_api.FakeKubeApi(
        nodes=[{"metadata": {"name": n, "labels": GFD}} for n in nodes],
        pods=[placed(f"low-{n}", n, 30000, 0) for n in nodes])
    fake.start()
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=fake.url)))
    source = KubeSource(api, watch_factory=PlainWatch, background_events=False)
    app = create_app(ConfigHolder(build_config({})), source,
                     environ={"TANDEM_SIGNING_KEY": KEY, "TANDEM_AGENT_TOKEN": TOKEN})
    stop = threading.Event()

    def agents():
        http = app.test_client()
        while not stop.wait(0.1):
            used = {n: 0 for n in nodes}
            for pod in list(fake.pods.values()):
                spec = pod.get("spec") or {}
                if spec.get("nodeName") in used:
                    used[spec["nodeName"]] += 30000
            for n in nodes:
                http.post("/v1/agents/report", json=agent_report(n, used[n]),
                          headers={"Authorization": f"Bearer {TOKEN}"})

    thread = threading.Thread(target=agents, daemon=True)
    thread.start()
    yield fake, app, source, nodes
    stop.set()
    thread.join(5)
    ext = app.extensions["tandem"]
    if ext.preemptor is not None:
        ext.preemptor.stop()
    source.stop()
    fake.stop()


def test_preemption_frees_memory_the_agents_see_in_use(reported_cluster):
    fake, app, source, nodes = reported_cluster
    ext = app.extensions["tandem"]
    wait_for(lambda: all(g["observed_mib"] == 30000 for n in nodes
                         for g in state_view(ext.state)["nodes"][n]["gpus"]))
    fake.put_pod(pending("urgent", 30000, 100))
    started = time.monotonic()
    passed: list[str] = []

    def filter_passes() -> bool:
        passed[:] = do_filter(app, fake, "urgent", nodes)["NodeNames"]
        return bool(passed)

    wait_for(filter_passes, 10.0)
    (node,) = passed
    bound = app.test_client().post("/bind", json={"PodName": "urgent", "PodNamespace": "ml",
                                                  "PodUID": "uid-urgent", "Node": node})
    assert bound.get_json() == {"Error": ""}
    assert time.monotonic() - started < 10.0
    assert evictions(fake) == [f"low-{node}"]  # one victim, through the Eviction API
    assert ext.state.placement_of("uid-urgent").node == node
    assert {(f"low-{node}", "TandemPreempted"), ("urgent", "TandemPreempting")} <= \
        posted_events(source, fake)


def test_no_preemption_says_why_in_an_event(cluster):
    fake, app, source = cluster
    fake.put_pod(pending("urgent", 30000, 100))
    assert do_filter(app, fake, "urgent", ["gpu-a"])["NodeNames"] == []  # guarded only
    wait_for(lambda: ("urgent", "TandemNoPreemption") in posted_events(source, fake))
    message = next(e["message"] for e in fake.events if e["reason"] == "TandemNoPreemption")
    assert "PodDisruptionBudget" in message
