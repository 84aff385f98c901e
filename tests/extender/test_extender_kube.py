"""The kube source over real HTTP: the official client against a fake API server on loopback."""

from __future__ import annotations

import threading
import time

import pytest
from extender_builders import (
    AGENT_AUTH,
    TOKEN,
    PodBuilder,
    assume_best,
    demand,
    gpu_types,
    placement,
    state_view,
)
from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.cluster.kube import KubeSource, PlainWatch, node_spec
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.core import PodRef
from extender.state.signing import PlacementSigner
from extender.wiring import create_app
from lab.fakes import kube_api as fake_kube_api

GFD = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
       "nvidia.com/gpu.memory": "40960"}
BOUND = {"tandem.io/gpu-index": "1", "tandem.io/predicted-gpu-util": "40.00",
         "tandem.io/predicted-gpu-mem-mib": "30000"}
DEMAND = {"tandem.io/gpu-util": "20", "tandem.io/gpu-mem-mib": "5000"}
KEY = "test-signing-key-0123456789"
SIGNED_ENV = {"TANDEM_SIGNING_KEY": KEY, "TANDEM_AGENT_TOKEN": TOKEN}


def signed(uid, node, annotations):
    """Annotations as bind would have written them (signed with the test key)."""
    return PlacementSigner(KEY.encode()).sign(uid, node, annotations)


def k8s_node(name, labels=None):
    return {"metadata": {"name": name, "labels": labels or {}}}


def k8s_pod(name, uid, node=None, annotations=None, phase="Running", gpus="1"):
    spec = {"containers": [{"name": "c", "resources": {"limits": {"tandem.io/gpu": gpus}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid,
                         "annotations": annotations or {}},
            "spec": spec, "status": {"phase": phase}}


class StopWatch:
    """A watch whose stream yields nothing (start() then only idles)."""

    def stream(self, *a, **k):
        return iter(())


@pytest.fixture
def fake():
    server = fake_kube_api.FakeKubeApi(
        nodes=[k8s_node("gpu-1", GFD), k8s_node("cpu-1")],
        pods=[k8s_pod("old", "uid-old", "gpu-1", signed("uid-old", "gpu-1", BOUND)),
              k8s_pod("done", "uid-done", "gpu-1", signed("uid-done", "gpu-1", BOUND),
                      phase="Succeeded")])
    server.start()
    yield server
    server.stop()


@pytest.fixture
def api(fake):
    cfg = client.Configuration(host=fake.url)
    with client.ApiClient(cfg) as api_client:
        yield client.CoreV1Api(api_client)


def make(api, watch_factory=StopWatch, raw_config=None):
    source = KubeSource(api, watch_factory=watch_factory, background_events=False)
    app = create_app(ConfigHolder(build_config(raw_config or {})), source, environ=SIGNED_ENV)
    if watch_factory is StopWatch:
        source.stop()
    return app, source


def calls(fake, method=None):
    return [r for r in fake.requests if method is None or r.method == method]


def bind(app, name="new", uid="uid-new", node="gpu-1"):
    return app.test_client().post("/bind", json={"PodName": name, "PodNamespace": "ml",
                                                 "PodUID": uid, "Node": node}).get_json()


def filter_first(app, fake, name="new"):
    """What kube-scheduler does before bind: filter sees the full pod (the demand is cached)."""
    pod = fake.pod("ml", name)
    r = app.test_client().post("/filter", json={"Pod": pod, "NodeNames": ["gpu-1"]})
    assert r.get_json()["NodeNames"] == ["gpu-1"]


@pytest.mark.parametrize(("labels", "gpus"), [
    (GFD, 2), ({}, 0), ({**GFD, "nvidia.com/gpu.count": "x"}, 0),
    ({**GFD, "nvidia.com/gpu.memory": "0"}, 0)], ids=["gfd", "none", "bad-count", "no-memory"])
def test_node_inventory_from_gfd_labels(labels, gpus):
    spec = node_spec(k8s_node("n", labels))
    assert len(spec.gpus) == gpus
    if gpus:
        assert spec.gpus[1].memory_mib == 40960 and spec.gpus[1].uuid == "1"


def test_sync_rebuilds_placements_from_annotations(api, fake):
    app, _ = make(api)
    state = app.test_client().get("/v1/state", headers=AGENT_AUTH).get_json()
    gpus = state["nodes"]["gpu-1"]["gpus"]
    assert gpus[1]["reserved_mib"] == 30000 and gpus[0]["reserved_mib"] == 0
    assert state["nodes"]["cpu-1"]["gpus"] == [] and state["placed"] == 1
    pod_lists = [r for r in calls(fake, "GET") if r.path == "/api/v1/pods"]
    assert pod_lists[0].query["fieldSelector"] == "spec.nodeName!="


def test_bind_reads_the_pod_then_binds_with_uid_precondition_and_annotations(api, fake):
    app, source = make(api)
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND))
    filter_first(app, fake)
    fake.requests.clear()
    assert bind(app) == {"Error": ""}
    assert source.record_writer.flush(5)
    # the pod as the API server has it (never a /filter body), the binding (no PATCH), then,
    # off the bind path, the decision into the node's placement record
    read, request, record = fake.requests
    assert (read.method, read.path) == ("GET", "/api/v1/namespaces/ml/pods/new")
    # (the record exists: the start wrote back "old"'s, bound without one, from its signature)
    assert (record.method, record.path) == (
        "PUT", "/api/v1/namespaces/tandem-system/configmaps/tandem-placements-gpu-1")
    assert set(record.body["data"]) == {"uid-old", "uid-new"}
    assert (request.method, request.path) == ("POST", "/api/v1/namespaces/ml/pods/new/binding")
    assert request.body["metadata"]["uid"] == "uid-new"
    assert request.body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"}
    annotations = request.body["metadata"]["annotations"]
    assert annotations["tandem.io/gpu-index"] == "0"  # GPU 1 is busier
    stored = fake.pod("ml", "new")
    assert stored["spec"]["nodeName"] == "gpu-1"
    assert stored["metadata"]["annotations"]["tandem.io/gpu-index"] == "0"
    assert stored["metadata"]["annotations"]["tandem.io/gpu-util"] == "20"  # inputs kept
    # the placement is assumed until the watch confirms it
    state = app.extensions["tandem"].state
    assert state_view(state)["assumed"] == 1
    source.apply_pod_event(state, "MODIFIED", stored)
    assert (state_view(state)["assumed"], state_view(state)["placed"]) == (0, 2)
    assert source.drain_events() == 1
    (event,) = fake.events
    assert event["reason"] == "TandemBound" and event["involvedObject"]["uid"] == "uid-new"
    assert event["metadata"]["name"].startswith("new.")


def test_bind_without_cached_demand_reads_the_pod_once(api, fake):
    app, source = make(api)
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND))
    fake.requests.clear()
    assert bind(app) == {"Error": ""}
    assert source.record_writer.flush(5)
    assert [(r.method, r.path.rsplit("/", 1)[1]) for r in fake.requests] == [
        ("GET", "new"), ("POST", "binding"), ("PUT", "tandem-placements-gpu-1")]


def test_recreated_pod_is_not_bound_with_the_old_decision(api, fake):
    app, source = make(api)
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND))
    filter_first(app, fake)
    fake.delete_pod("ml", "new")
    fake.put_pod(k8s_pod("new", "uid-other", annotations=DEMAND))
    result = bind(app)  # the scheduler still holds the old pod's UID
    assert "has UID uid-other, not uid-new (recreated?)" in result["Error"]
    assert "nodeName" not in fake.pod("ml", "new")["spec"]
    assert "tandem.io/gpu-index" not in fake.pod("ml", "new")["metadata"]["annotations"]
    assert state_view(app.extensions["tandem"].state)["assumed"] == 0  # nothing reserved


def test_retried_bind_succeeds_without_a_second_booking(api, fake):
    app, _ = make(api)
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND))
    filter_first(app, fake)
    assert bind(app) == {"Error": ""}
    assert bind(app) == {"Error": ""}  # kube-scheduler retried after a timeout
    bindings = [r for r in calls(fake, "POST") if r.path.endswith("/binding")]
    assert len(bindings) == 1
    view = state_view(app.extensions["tandem"].state)
    assert view["assumed"] + view["placed"] == 2  # old + new, not new twice
    assert "already bound" in bind(app, node="cpu-1")["Error"]


def test_bind_api_failure_is_error_and_frees_capacity(api, fake):
    app, source = make(api)
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND))
    filter_first(app, fake)
    fake.bind_pod("ml", "new", {"target": {"name": "cpu-1"}})  # someone else bound it
    result = bind(app)
    assert "Conflict" in result["Error"] and "already assigned" in result["Error"]
    assert state_view(app.extensions["tandem"].state)["assumed"] == 0
    source.drain_events()
    assert fake.events[-1]["reason"] == "TandemBindFailed"


def test_read_pod_404_is_none(api):
    source = KubeSource(api, watch_factory=StopWatch, background_events=False)
    assert source.read_pod("ml", "gone") is None
    assert source.read_pod("ml", "old")["metadata"]["uid"] == "uid-old"


@pytest.mark.parametrize(("kind", "phase", "placed"), [
    ("DELETED", "Running", 0), ("MODIFIED", "Succeeded", 0), ("MODIFIED", "Running", 1)],
    ids=["deleted", "finished", "still-running"])
def test_pod_events_forget_finished_pods(api, kind, phase, placed):
    app, source = make(api)
    state = app.extensions["tandem"].state
    source.apply_pod_event(state, kind, k8s_pod("old", "uid-old", "gpu-1", BOUND, phase=phase))
    assert state_view(state)["placed"] == placed


def test_pending_pod_without_node_keeps_its_assumption(api):
    app, source = make(api)
    state = app.extensions["tandem"].state
    x = PodBuilder("x", namespace="ml").uid("uid-x").util(10).mem(100).obj()
    assumed, *_ = assume_best(state, "gpu-1", demand(x, gpu_types(state)), None, "uid-x", "ml/x")
    assert assumed == placement("uid-x", pod="ml/x", node="gpu-1", gpus=(0,), util=10, mem=100)
    source.apply_pod_event(state, "MODIFIED", {"metadata": {"uid": "uid-x", "annotations": BOUND},
                                               "spec": {}, "status": {"phase": "Pending"}})
    assert state.is_known("uid-x")


def test_node_events_update_inventory(api):
    app, source = make(api)
    state = app.extensions["tandem"].state
    source.apply_node_event(state, "MODIFIED", k8s_node("cpu-1", GFD))
    assert len(state_view(state)["nodes"]["cpu-1"]["gpus"]) == 2
    source.apply_node_event(state, "DELETED", k8s_node("cpu-1", GFD))
    assert "cpu-1" not in state_view(state)["nodes"]


def wait_for(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_real_watches_confirm_binds_and_follow_nodes(api, fake):
    app, source = make(api, PlainWatch)
    try:
        state = app.extensions["tandem"].state
        fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND))
        filter_first(app, fake)
        assert bind(app) == {"Error": ""}
        wait_for(lambda: state_view(state)["assumed"] == 0 and state_view(state)["placed"] == 2)
        fake.put_node(k8s_node("gpu-2", GFD))
        wait_for(lambda: "gpu-2" in state_view(state)["nodes"])
        fake.delete_pod("ml", "new")
        wait_for(lambda: state_view(state)["placed"] == 1)
    finally:
        source.stop()


def test_watch_expiry_relists(api, fake):
    class OneShot:
        calls = 0

        def stream(self, lister, **kw):
            OneShot.calls += 1
            if OneShot.calls == 1:
                yield {"type": "ADDED", "object": k8s_node("gpu-2", GFD)}
                raise ApiException(status=410, reason="Gone")
            source.stop()
            return

    source = KubeSource(api, watch_factory=OneShot, background_events=False)
    app = create_app(ConfigHolder(build_config({})), source, start_source=False)
    state = app.extensions["tandem"].state
    source.sync(state)
    source._stop.wait = lambda timeout: False  # no real backoff in tests
    source._watch(state, api.list_node, source.apply_node_event, "10")
    node_lists = [r for r in calls(fake, "GET") if r.path == "/api/v1/nodes"]
    assert len(node_lists) == 2  # initial sync + relist after 410
    assert "gpu-2" not in state_view(state)["nodes"]  # the relist is the truth (no gpu-2 there)


def test_expired_plain_watch_raises_gone(api, fake):
    fake.compact()  # the history the watch would resume from is gone
    with pytest.raises(ApiException) as exc:
        list(PlainWatch().stream(api.list_node, resource_version="1", timeout_seconds=5))
    assert exc.value.status == 410


def test_plain_watch_yields_json_objects(api, fake):
    rv = fake.list_objects("nodes", "")["metadata"]["resourceVersion"]
    fake.put_node(k8s_node("gpu-2", GFD))
    events = list(PlainWatch().stream(api.list_node, resource_version=rv, timeout_seconds=1))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "gpu-2")]
    assert isinstance(events[0]["object"], dict)


def test_bind_decides_again_on_fresh_state(api, fake):
    app, source = make(api)
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND))
    filter_first(app, fake)  # then, before bind, another pod fills GPU 0
    full = {**BOUND, "tandem.io/gpu-index": "0", "tandem.io/predicted-gpu-mem-mib": "40000"}
    source.apply_pod_event(app.extensions["tandem"].state, "ADDED",
                           k8s_pod("other", "uid-other", "gpu-1",
                                   signed("uid-other", "gpu-1", full)))
    assert bind(app) == {"Error": ""}
    assert fake.pod("ml", "new")["metadata"]["annotations"]["tandem.io/gpu-index"] == "1"


def test_bind_needs_the_pod_uid(api):
    source = KubeSource(api, watch_factory=StopWatch, background_events=False)
    with pytest.raises(ValueError, match="UID"):
        source.bind(PodRef("ml", "new", ""), "gpu-1", {})


def test_events_are_queued_not_blocking(api, fake):
    source = KubeSource(api, watch_factory=StopWatch, background_events=False)
    source.record_event(PodRef("ml", "p", "u"), "TandemBound", "x" * 5000, False)
    assert fake.events == []
    assert source.drain_events() == 1
    assert len(fake.events[0]["message"]) == 1024
    assert fake.events[0]["type"] == "Normal" and fake.events[0]["count"] == 1


def test_repeated_events_are_posted_once_with_their_count(api, fake):
    source = KubeSource(api, watch_factory=StopWatch, background_events=False)
    pod = PodRef("ml", "p", "u")
    for _ in range(3):
        source.record_event(pod, "TandemBindFailed", "bind to gpu-1: Conflict", True)
    source.record_event(pod, "TandemBindFailed", "bind to gpu-2: Conflict", True)
    source.record_event(PodRef("ml", "q", "v"), "TandemBindFailed", "bind to gpu-1: Conflict",
                        True)
    assert source.drain_events() == 3
    counts = {(e["involvedObject"]["name"], e["message"]): e["count"] for e in fake.events}
    assert counts == {("p", "bind to gpu-1: Conflict"): 3, ("p", "bind to gpu-2: Conflict"): 1,
                      ("q", "bind to gpu-1: Conflict"): 1}
    assert all(e["firstTimestamp"] <= e["lastTimestamp"] for e in fake.events)


def test_background_worker_posts_events_and_survives_network_errors(api, fake):
    source = KubeSource(api, watch_factory=StopWatch)  # with its background event worker
    create_app(ConfigHolder(build_config({})), source)  # starts the source
    refused = threading.Event()
    post = source._poster.post

    def flaky(path, body):
        if b'"lost"' in body:
            refused.set()
            raise ConnectionRefusedError("API server unreachable")
        return post(path, body)
    source._poster.post = flaky
    source.record_event(PodRef("ml", "p", "u"), "TandemBound", "lost", False)
    assert refused.wait(5)
    source.record_event(PodRef("ml", "p", "u"), "TandemBound", "placed on gpu-1", False)
    deadline = time.monotonic() + 5
    mine = []
    while not mine and time.monotonic() < deadline:
        time.sleep(0.01)
        mine = [e["message"] for e in fake.events if e["involvedObject"]["name"] == "p"]
    source.stop()
    assert mine == ["placed on gpu-1"]


def test_fake_server_rejects_what_the_api_server_rejects(fake):
    with pytest.raises(fake_kube_api.ApiError) as exc:
        fake.patch_pod("ml", "old", {"metadata": {"uid": "other", "annotations": {"a": "b"}}})
    assert exc.value.code == 409
    with pytest.raises(fake_kube_api.ApiError) as exc:
        fake.bind_pod("ml", "old", {"metadata": {"uid": "uid-old"}, "target": {"name": "x"}})
    assert exc.value.code == 409 and "already assigned" in exc.value.message
    with pytest.raises(fake_kube_api.ApiError) as exc:
        fake.bind_pod("ml", "missing", {"target": {"name": "x"}})
    assert exc.value.code == 404


def test_device_plugin_handoff_holds_the_node_until_the_kubelet_admits_the_pod(api, fake):
    """handoff.mode: device-plugin: one pod per node waits for its GPU at a time, so the
    device plugin can tell which pod the kubelet is admitting."""
    source = KubeSource(api, watch_factory=PlainWatch, background_events=False)
    config = build_config({"handoff": {"mode": "device-plugin", "timeout_seconds": 60}})
    app = create_app(ConfigHolder(config), source, environ=SIGNED_ENV)
    try:
        state = app.extensions["tandem"].state
        for name in ("first", "second"):
            fake.put_pod(k8s_pod(name, f"uid-{name}", annotations=DEMAND, phase="Pending"))
        filter_first(app, fake, "first")
        assert bind(app, "first", "uid-first") == {"Error": ""}
        waiting = state.handoffs.waiting()["gpu-1"]
        assert (waiting.uid, waiting.pod) == ("uid-first", "ml/first")
        # Another pod is kept off the node while the first waits for its GPU ...
        r = app.test_client().post("/filter", json={"Pod": fake.pod("ml", "second"),
                                                    "NodeNames": ["gpu-1"]}).get_json()
        assert r["NodeNames"] == []
        assert "handing a GPU to ml/first" in r["FailedAndUnresolvableNodes"]["gpu-1"]
        assert "handing a GPU to ml/first" in bind(app, "second", "uid-second")["Error"]
        # ... and the first pod's own retried bind is not blocked by itself.
        assert bind(app, "first", "uid-first") == {"Error": ""}
        # The kubelet admits the first pod (startTime): the node takes the next one.
        admitted = fake.pod("ml", "first")
        admitted["status"] = {"phase": "Pending", "startTime": "2026-11-23T00:00:00Z"}
        fake.put_pod(admitted)
        wait_for(lambda: "gpu-1" not in state.handoffs.waiting())
        filter_first(app, fake, "second")
        assert bind(app, "second", "uid-second") == {"Error": ""}
    finally:
        source.stop()


def test_concurrent_binds_to_one_node_leave_one_pod_waiting(api, fake):
    """kube-scheduler binds in parallel goroutines: two binds that both saw the node free
    must not both go through, or the device plugin would see two pods waiting."""
    source = KubeSource(api, watch_factory=StopWatch, background_events=False)
    config = build_config({"handoff": {"mode": "device-plugin", "timeout_seconds": 60}})
    app = create_app(ConfigHolder(config), source, environ=SIGNED_ENV)
    source.stop()
    real_bind = source.bind

    def slow_bind(*args, **kwargs):
        time.sleep(0.3)  # both binds are past the early holder() check by now
        return real_bind(*args, **kwargs)
    source.bind = slow_bind
    for name in ("first", "second"):
        fake.put_pod(k8s_pod(name, f"uid-{name}", annotations=DEMAND, phase="Pending"))
        filter_first(app, fake, name)
    answers: dict[str, str] = {}
    threads = [threading.Thread(target=lambda n=name: answers.__setitem__(
        n, bind(app, n, f"uid-{n}")["Error"])) for name in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    winners = [n for n, error in answers.items() if error == ""]
    assert len(winners) == 1, answers
    loser = "second" if winners == ["first"] else "first"
    assert f"handing a GPU to ml/{winners[0]}" in answers[loser]
    waiting = app.extensions["tandem"].state.handoffs.waiting()
    assert [w.pod for w in waiting.values()] == [f"ml/{winners[0]}"]


def test_failed_bind_gives_the_node_back(api, fake):
    source = KubeSource(api, watch_factory=StopWatch, background_events=False)
    config = build_config({"handoff": {"mode": "device-plugin", "timeout_seconds": 60}})
    app = create_app(ConfigHolder(config), source, environ=SIGNED_ENV)
    source.stop()
    real_bind = source.bind

    def unreachable(*args, **kwargs):
        raise ConnectionRefusedError("API server unreachable")
    source.bind = unreachable
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND, phase="Pending"))
    filter_first(app, fake)
    assert "failed" in bind(app)["Error"]
    assert app.extensions["tandem"].state.handoffs.waiting() == {}
    source.bind = real_bind
    assert bind(app) == {"Error": ""}
    assert app.extensions["tandem"].state.handoffs.waiting()["gpu-1"].uid == "uid-new"


def test_env_handoff_never_holds_a_node(api, fake):
    app, source = make(api, raw_config={"handoff": {"mode": "env"}})
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND, phase="Pending"))
    filter_first(app, fake)
    assert bind(app) == {"Error": ""}
    assert app.extensions["tandem"].state.handoffs.waiting() == {}


def rebuilt(api, fake):
    """A fresh extender (a restart) rebuilt from the API server's pods."""
    app, _ = make(api)
    return state_view(app.extensions["tandem"].state)["nodes"]["gpu-1"]["gpus"]


def test_edited_signed_pod_without_a_record_holds_its_whole_node(api, fake):
    """H3: `kubectl annotate --overwrite tandem.io/predicted-gpu-mem-mib=1` on a pod bound
    before placement records (its signature then fails): it holds every GPU of its node."""
    pod = fake.pod("ml", "old")
    pod["metadata"]["annotations"]["tandem.io/predicted-gpu-mem-mib"] = "1"
    fake.put_pod(pod)
    app, source = make(api)
    view = state_view(app.extensions["tandem"].state)
    gpus = view["nodes"]["gpu-1"]["gpus"]
    assert [(g["reserved_mib"], g["predicted_util"]) for g in gpus] == [(40960, 100)] * 2
    assert (view["placed"], view["untrusted"]) == (0, 1)
    assert gpus[0]["pods"][0]["state"] == "untrusted"
    fake.put_pod(k8s_pod("big", "uid-big", annotations={
        "tandem.io/gpu-util": "10", "tandem.io/gpu-mem-mib": "35000"}))
    r = app.test_client().post("/filter", json={"Pod": fake.pod("ml", "big"),
                                                "NodeNames": ["gpu-1"]}).get_json()
    assert r["NodeNames"] == []  # the edit only blocked capacity
    source.drain_events()
    # The refused pod may also get TandemNoPreemption from the preemption thread,
    # depending on when it runs; the edit itself is flagged exactly once.
    flagged = [e for e in fake.events if e["reason"] != "TandemNoPreemption"]
    assert [e["reason"] for e in flagged] == ["TandemPlacementUntrusted"]
    assert flagged[0]["type"] == "Warning"
    metrics = app.extensions["tandem_metrics"].registry
    assert metrics.get_sample_value("tandem_extender_untrusted_placements_total",
                                    {"problem": "unrecorded"}) == 1


def test_edited_gpu_index_never_moves_the_rebuilt_placement(api, fake):
    """H4 at rebuild: whatever gpu-index and gpu-uuid say, the record decides."""
    app, _ = make(api)
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND))
    filter_first(app, fake)
    assert bind(app) == {"Error": ""}
    fake.delete_pod("ml", "old")
    pod = fake.pod("ml", "new")
    assert pod["metadata"]["annotations"]["tandem.io/gpu-uuid"] == "0"
    assert [g["reserved_mib"] for g in rebuilt(api, fake)] == [5000, 0]
    pod["metadata"]["annotations"]["tandem.io/gpu-index"] = "1"
    fake.put_pod(pod)
    assert [g["reserved_mib"] for g in rebuilt(api, fake)] == [5000, 0]
    pod["metadata"]["annotations"]["tandem.io/gpu-index"] = "7"  # no such GPU
    pod["metadata"]["annotations"]["tandem.io/gpu-uuid"] = "GPU-none"
    fake.put_pod(pod)
    assert [g["reserved_mib"] for g in rebuilt(api, fake)] == [5000, 0]


@pytest.mark.parametrize("edit", [{"tandem.io/gpu-index": "0"},
                                  {"tandem.io/predicted-gpu-mem-mib": "1"}],
                         ids=["moved", "shrunk"])
def test_watch_event_never_changes_a_bound_placement(api, fake, edit):
    """H3/H4 while running: the ledger keeps the decision it holds."""
    app, source = make(api)
    state = app.extensions["tandem"].state
    pod = fake.pod("ml", "old")
    pod["metadata"]["annotations"].update(edit)
    source.apply_pod_event(state, "MODIFIED", pod)
    gpus = state_view(state)["nodes"]["gpu-1"]["gpus"]
    assert [g["reserved_mib"] for g in gpus] == [0, 30000]
    source.apply_pod_event(state, "MODIFIED", pod)  # reported once per pod
    source.drain_events()
    assert [e["reason"] for e in fake.events] == ["TandemPlacementUntrusted"]
    assert app.extensions["tandem_metrics"].registry.get_sample_value(
        "tandem_extender_untrusted_placements_total", {"problem": "changed"}) == 1


def test_signature_of_another_pod_does_not_verify(api, fake):
    pod = fake.pod("ml", "old")
    fake.put_pod(k8s_pod("copy", "uid-copy", "gpu-1", pod["metadata"]["annotations"]))
    assert [g["reserved_mib"] for g in rebuilt(api, fake)] == [40960, 30000 + 40960]


def test_relist_after_410_releases_pods_deleted_in_the_gap(api, fake):
    """H2: the watch history is compacted while pods are deleted or finish; the relist
    must release them, and keep a bind still in flight."""
    source = KubeSource(api, watch_factory=PlainWatch, watch_timeout_seconds=1,
                        background_events=False)
    app = create_app(ConfigHolder(build_config({})), source, start_source=False,
                     environ=SIGNED_ENV)
    state = app.extensions["tandem"].state
    fake.put_pod(k8s_pod("gone", "uid-gone", "gpu-1", signed("uid-gone", "gpu-1", BOUND)))
    fake.put_pod(k8s_pod("ends", "uid-ends", "gpu-1", signed("uid-ends", "gpu-1", BOUND)))
    _, pod_rv = source.sync(state)
    assert state_view(state)["placed"] == 3
    x = PodBuilder("x", namespace="ml").uid("uid-x").util(10).mem(100).obj()
    assume_best(state, "gpu-1", demand(x, gpu_types(state)), None, "uid-x", "ml/x")
    fake.delete_pod("ml", "gone")
    ended = fake.pod("ml", "ends")
    ended["status"]["phase"] = "Succeeded"
    fake.put_pod(ended)
    fake.compact()  # the watch resumes from a version the server no longer has: 410
    relists = []
    real_sync = source.sync

    def sync_once(s):
        relists.append(1)
        source._stop.set()  # stop after the relist
        return real_sync(s)

    source.sync = sync_once
    source._stop.wait = lambda timeout: False  # no real backoff in tests
    source._watch(state, api.list_pod_for_all_namespaces, source.apply_pod_event, pod_rv)
    assert relists == [1]
    view = state_view(state)
    assert (view["placed"], view["assumed"]) == (1, 1)  # "old" stays, x is in flight
    reserved = [g["reserved_mib"] for g in view["nodes"]["gpu-1"]["gpus"]]
    assert reserved == [100, 30000]


@pytest.mark.parametrize("forged_first", [True, False], ids=["forged-first", "real-first"])
def test_forged_filter_cannot_shrink_the_demand_bind_uses(api, fake, forged_first):
    """M2: a /filter body with the real pod's UID and resourceVersion but gpu-mem-mib 1."""
    app, source = make(api)
    fake.put_pod(k8s_pod("new", "uid-new", annotations=DEMAND))
    forged = fake.pod("ml", "new")
    forged["metadata"]["annotations"]["tandem.io/gpu-mem-mib"] = "1"
    if not forged_first:
        filter_first(app, fake)
    app.test_client().post("/filter", json={"Pod": forged, "NodeNames": ["gpu-1"]})
    if forged_first:
        filter_first(app, fake)
    fake.requests.clear()
    assert bind(app) == {"Error": ""}
    assert source.record_writer.flush(5)
    assert [(r.method, r.path.rsplit("/", 1)[1]) for r in fake.requests] == [
        ("GET", "new"), ("POST", "binding"), ("PUT", "tandem-placements-gpu-1")]  # the read decides
    annotations = fake.pod("ml", "new")["metadata"]["annotations"]
    assert annotations["tandem.io/predicted-gpu-mem-mib"] == "5000"
