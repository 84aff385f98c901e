"""Node CPU and memory as the packing score sees them: quantities, the kube source's node
objects and bound pods (over the official client against a fake API server), the sim file."""

from __future__ import annotations

import pytest
from kubernetes import client

from contracts.clusterfile import ClusterFileError, parse_cluster_file
from contracts.resources import QuantityError, cpu_milli, memory_mib, parse_quantity, pod_requests
from extender.cluster.kube import KubeSource, node_spec
from extender.cluster.sim import SimSource
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.wiring import create_app
from lab.fakes import kube_api as fake_kube_api

GFD = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
       "nvidia.com/gpu.memory": "40960"}


@pytest.mark.parametrize(("text", "value"), [
    ("500m", 0.5), ("2", 2), ("1.5", 1.5), ("1Ki", 1024), ("1Gi", 2**30), ("1e3", 1000),
    ("1E3", 1000), ("2E", 2e18), ("100M", 1e8), (".5", 0.5), (3, 3), ("250u", 250e-6)])
def test_quantities(text, value):
    assert float(parse_quantity(text)) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "1.2.3", "-1", "1Gb", "lots", "1" * 70, None, True, [1]])
def test_bad_quantities_are_refused(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_pod_requests_count_as_kube_scheduler_does():
    spec = {"initContainers": [{"resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}],
            "containers": [{"resources": {"requests": {"cpu": "500m", "memory": "2Gi"}}},
                           {"resources": {"limits": {"cpu": "1", "memory": "512Mi"}}},
                           {"resources": {"requests": {"cpu": "bad"}}}],
            "overhead": {"cpu": "100m", "memory": "64Mi"}}
    # CPU: the init container's 4 beats the containers' 1.5; memory: 2.5 GiB beats 1 GiB
    assert pod_requests(spec) == (4100.0, 2560.0 + 64.0)
    assert (cpu_milli("250m"), memory_mib("1Gi")) == (250.0, 1024.0)


def node(name, labels=None, cpu="64", memory="256Gi"):
    status = {"allocatable": {"cpu": cpu, "memory": memory}} if cpu is not None else {}
    return {"metadata": {"name": name, "labels": labels or {}}, "status": status}


def pod(name, node_name, cpu, memory, phase="Running", gpus=None):
    res = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        res["limits"] = {"tandem.io/gpu": gpus}
    spec = {"containers": [{"name": "c", "resources": res}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": spec, "status": {"phase": phase}}


def test_node_allocatable_is_read_from_the_node_object():
    assert node_spec(node("g", GFD)).host == (64000.0, 256 * 1024.0)
    assert node_spec(node("c", cpu=None)).host is None
    assert node_spec(node("x", GFD, cpu="many")).host is None


class StopWatch:
    """A watch whose stream yields nothing (the source then only idles)."""

    def stream(self, *a, **k):
        return iter(())


@pytest.fixture
def kube():
    fake = fake_kube_api.FakeKubeApi(
        nodes=[node("gpu-1", GFD), node("cpu-1", cpu=None)],
        pods=[pod("web", "gpu-1", "6", "10Gi"), pod("done", "gpu-1", "8", "8Gi", "Succeeded")])
    fake.start()
    with client.ApiClient(client.Configuration(host=fake.url)) as api_client:
        source = KubeSource(client.CoreV1Api(api_client), watch_factory=StopWatch,
                            background_events=False)
        app = create_app(ConfigHolder(build_config({"packing": {"live": True}})), source,
                         environ={"TANDEM_AGENT_TOKEN": "t", "TANDEM_SIGNING_KEY": "k" * 32})
        source.stop()
        yield app, source, fake
    fake.stop()


def test_the_kube_source_counts_bound_pods_on_their_nodes(kube):
    app, source, fake = kube
    state = app.extensions["tandem"].state
    hosts = state.snapshot().hosts
    assert hosts.free("gpu-1") == (58000.0, 246 * 1024.0)  # the finished pod counts nothing
    assert hosts.free("cpu-1") is None  # no allocatable given: not known, never short
    source.apply_pod_event(state, "ADDED", pod("batch", "gpu-1", "2", "1Gi"))
    assert state.snapshot().hosts.free("gpu-1") == (56000.0, 245 * 1024.0)
    source.apply_pod_event(state, "MODIFIED", pod("batch", "gpu-1", "2", "1Gi", "Succeeded"))
    source.apply_pod_event(state, "DELETED", pod("web", "gpu-1", "6", "10Gi"))
    assert state.snapshot().hosts.free("gpu-1") == (64000.0, 256 * 1024.0)
    source.apply_node_event(state, "MODIFIED", node("gpu-1", GFD, cpu="32"))
    assert state.snapshot().hosts.free("gpu-1") == (32000.0, 256 * 1024.0)


def test_a_pod_of_no_gpu_is_bound_with_a_plain_binding(kube):
    app, source, fake = kube
    fake.put_pod(pod("api", None, "1", "1Gi"))
    web = fake.pod("ml", "api")
    http = app.test_client()
    assert http.post("/filter", json={"Pod": web, "NodeNames": ["gpu-1"]}).get_json()[
        "NodeNames"] == ["gpu-1"]
    fake.requests.clear()
    assert http.post("/bind", json={"PodName": "api", "PodNamespace": "ml", "PodUID": "uid-api",
                                    "Node": "gpu-1"}).get_json() == {"Error": ""}
    assert source.record_writer.flush(5)
    posts = [r for r in fake.requests if r.method != "GET"]
    assert [r.path for r in posts] == ["/api/v1/namespaces/ml/pods/api/binding"]
    assert posts[0].body["metadata"].get("annotations") == {}
    assert fake.pod("ml", "api")["spec"]["nodeName"] == "gpu-1"


def test_the_sim_file_gives_node_cpu_and_memory():
    cluster = parse_cluster_file({"nodes": [
        {"name": "a", "cpu": "96", "memory": "768Gi",
         "gpus": [{"product": "NVIDIA-A100-SXM4-40GB", "memory_mib": 40960}]},
        {"name": "b", "gpus": [{"product": "NVIDIA-A100-SXM4-40GB", "memory_mib": 40960}]}]})
    specs = {n.name: n.host for n in SimSource.from_cluster(cluster).nodes}
    assert specs == {"a": (96000.0, 768 * 1024.0), "b": None}
    with pytest.raises(ClusterFileError) as err:
        parse_cluster_file({"nodes": [{"name": "a", "cpu": "x", "memory": "-1", "gpus": [
            {"product": "NVIDIA-A100-SXM4-40GB", "memory_mib": 40960}]}]})
    assert any("nodes[0].cpu" in p for p in err.value.problems)
    assert any("nodes[0].memory" in p for p in err.value.problems)
