"""The kube source with the client mocked at the CoreV1Api boundary (no cluster)."""

from __future__ import annotations

from unittest import mock

import pytest
from extender_builders import PodBuilder, demand, placement
from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.config import ConfigHolder, build_config
from extender.core import PodRef
from extender.kube import KubeSource, node_spec
from extender.routes import create_app


def k8s_node(name, labels=None):
    return client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels or {}))


GFD = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
       "nvidia.com/gpu.memory": "40960"}


def k8s_pod(name, uid, node=None, annotations=None, phase="Running", gpus="1"):
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="ml", uid=uid,
                                     annotations=annotations or {}, resource_version="7"),
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(
            name="c", resources=client.V1ResourceRequirements(limits={"tandem.io/gpu": gpus}))]),
        status=client.V1PodStatus(phase=phase))


BOUND = {"tandem.io/gpu-index": "1", "tandem.io/predicted-gpu-util": "40.00",
         "tandem.io/predicted-gpu-mem-mib": "30000"}


class StopWatch:
    """A watch whose stream yields nothing (start() then only idles)."""

    def stream(self, *a, **k):
        return iter(())


@pytest.fixture(scope="module")
def _spec_api():
    # autospeccing CoreV1Api (hundreds of methods) is slow: build it once per module
    return mock.create_autospec(client.CoreV1Api, instance=True)


@pytest.fixture
def api(_spec_api):
    api = _spec_api
    api.reset_mock(return_value=True, side_effect=True)
    api.api_client = client.ApiClient()
    api.list_node.return_value = client.V1NodeList(
        items=[k8s_node("gpu-1", GFD), k8s_node("cpu-1")],
        metadata=client.V1ListMeta(resource_version="10"))
    api.list_pod_for_all_namespaces.return_value = client.V1PodList(
        items=[k8s_pod("old", "uid-old", "gpu-1", BOUND),
               k8s_pod("done", "uid-done", "gpu-1", BOUND, phase="Succeeded")],
        metadata=client.V1ListMeta(resource_version="20"))
    return api


@pytest.mark.parametrize(("labels", "gpus"), [
    (GFD, 2), ({}, 0), ({**GFD, "nvidia.com/gpu.count": "x"}, 0),
    ({**GFD, "nvidia.com/gpu.memory": "0"}, 0)], ids=["gfd", "none", "bad-count", "no-memory"])
def test_node_inventory_from_gfd_labels(labels, gpus):
    plain = client.ApiClient().sanitize_for_serialization(k8s_node("n", labels))
    spec = node_spec(plain)
    assert len(spec.gpus) == gpus
    if gpus:
        assert spec.gpus[1].memory_mib == 40960 and spec.gpus[1].uuid == "1"


def make(api):
    source = KubeSource(api, watch_factory=StopWatch, background_events=False)
    app = create_app(ConfigHolder(build_config({})), source)
    source.stop()
    return app, source


def test_sync_rebuilds_placements_from_annotations(api):
    app, _ = make(api)
    state = app.test_client().get("/v1/state").get_json()
    gpus = state["nodes"]["gpu-1"]["gpus"]
    assert gpus[1]["reserved_mib"] == 30000 and gpus[0]["reserved_mib"] == 0
    assert state["nodes"]["cpu-1"]["gpus"] == [] and state["placed"] == 1
    api.list_pod_for_all_namespaces.assert_called_with(field_selector="spec.nodeName!=")


def test_bind_patches_with_uid_then_creates_binding(api):
    app, source = make(api)
    pod = k8s_pod("new", "uid-new", annotations={"tandem.io/gpu-util": "20",
                                                 "tandem.io/gpu-mem-mib": "5000"})
    api.read_namespaced_pod.return_value = pod
    r = app.test_client().post("/bind", json={"PodName": "new", "PodNamespace": "ml",
                                              "PodUID": "uid-new", "Node": "gpu-1"})
    assert r.get_json() == {"Error": ""}
    name, ns, patch = api.patch_namespaced_pod.call_args.args
    assert (name, ns, patch["metadata"]["uid"]) == ("new", "ml", "uid-new")
    assert patch["metadata"]["annotations"]["tandem.io/gpu-index"] == "0"  # GPU 1 is busier
    _, _, body = api.create_namespaced_pod_binding.call_args.args
    assert body.metadata.uid == "uid-new" and body.target.name == "gpu-1"
    assert body.target.kind == "Node"
    # the placement is assumed until the watch confirms it
    assert app.extensions["tandem"].state.view()["assumed"] == 1
    source.apply_pod_event(app.extensions["tandem"].state, "MODIFIED",
                           {"metadata": {"name": "new", "namespace": "ml", "uid": "uid-new",
                                         "annotations": patch["metadata"]["annotations"]},
                            "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Pending"}})
    view = app.extensions["tandem"].state.view()
    assert (view["assumed"], view["placed"]) == (0, 2)
    assert source.drain_events() == 1
    event = api.create_namespaced_event.call_args.args[1]
    assert event.reason == "TandemBound" and event.involved_object.uid == "uid-new"


def test_bind_api_failure_is_error_and_frees_capacity(api):
    app, source = make(api)
    api.read_namespaced_pod.return_value = k8s_pod(
        "new", "uid-new", annotations={"tandem.io/gpu-util": "20", "tandem.io/gpu-mem-mib": "1"})
    api.create_namespaced_pod_binding.side_effect = ApiException(status=409, reason="Conflict")
    r = app.test_client().post("/bind", json={"PodName": "new", "PodNamespace": "ml",
                                              "PodUID": "uid-new", "Node": "gpu-1"})
    assert "Conflict" in r.get_json()["Error"]
    assert app.extensions["tandem"].state.view()["assumed"] == 0
    source.drain_events()
    assert api.create_namespaced_event.call_args.args[1].reason == "TandemBindFailed"


def test_read_pod_404_is_none(api):
    source = KubeSource(api, watch_factory=StopWatch, background_events=False)
    api.read_namespaced_pod.side_effect = ApiException(status=404)
    assert source.read_pod("ml", "gone") is None


@pytest.mark.parametrize(("kind", "phase", "placed"), [
    ("DELETED", "Running", 0), ("MODIFIED", "Succeeded", 0), ("MODIFIED", "Running", 1)],
    ids=["deleted", "finished", "still-running"])
def test_pod_events_forget_finished_pods(api, kind, phase, placed):
    app, source = make(api)
    state = app.extensions["tandem"].state
    plain = client.ApiClient().sanitize_for_serialization(
        k8s_pod("old", "uid-old", "gpu-1", BOUND, phase=phase))
    source.apply_pod_event(state, kind, plain)
    assert state.view()["placed"] == placed


def test_pending_pod_without_node_keeps_its_assumption(api):
    app, source = make(api)
    state = app.extensions["tandem"].state
    x = PodBuilder("x", namespace="ml").uid("uid-x").util(10).mem(100).obj()
    assumed, *_ = state.assume_best("gpu-1", demand(x, state.gpu_types()), None, "uid-x", "ml/x")
    assert assumed == placement("uid-x", pod="ml/x", node="gpu-1", gpus=(0,), util=10, mem=100)
    source.apply_pod_event(state, "MODIFIED", {"metadata": {"uid": "uid-x", "annotations": BOUND},
                                               "spec": {}, "status": {"phase": "Pending"}})
    assert state.is_known("uid-x")


def test_node_events_update_inventory(api):
    app, source = make(api)
    state = app.extensions["tandem"].state
    plain = client.ApiClient().sanitize_for_serialization(k8s_node("cpu-1", GFD))
    source.apply_node_event(state, "MODIFIED", plain)
    assert len(state.view()["nodes"]["cpu-1"]["gpus"]) == 2
    source.apply_node_event(state, "DELETED", plain)
    assert "cpu-1" not in state.view()["nodes"]


def test_watch_stream_applies_events_then_relists_on_410(api):
    events = [{"type": "ADDED", "object": k8s_node("gpu-2", GFD)}]

    class OneShot:
        calls = 0

        def stream(self, lister, **kw):
            OneShot.calls += 1
            if OneShot.calls == 1:
                yield from events
                raise ApiException(status=410, reason="Gone")
            source.stop()
            return

    source = KubeSource(api, watch_factory=OneShot, background_events=False)
    app = create_app(ConfigHolder(build_config({})), source, start_source=False)
    state = app.extensions["tandem"].state
    source.sync(state)
    source._stop.wait = lambda timeout: False  # no real backoff in tests
    source._watch(state, api.list_node, source.apply_node_event, "10")
    assert api.list_node.call_count == 2  # initial sync + relist after 410
    assert "gpu-2" not in state.view()["nodes"]  # the relist is the truth (mock has no gpu-2)


def test_events_are_queued_not_blocking(api):
    source = KubeSource(api, watch_factory=StopWatch, background_events=False)
    source.record_event(PodRef("ml", "p", "u"), "TandemBound", "x" * 5000, False)
    api.create_namespaced_event.assert_not_called()
    assert source.drain_events() == 1
    assert len(api.create_namespaced_event.call_args.args[1].message) == 1024
