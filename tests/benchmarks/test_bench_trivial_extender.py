"""The benchmark's baseline extender (benchmarks/trivial_extender.py) on the fake API server."""

from __future__ import annotations

import importlib

import pytest
from bench_modules import load

fake_kube_api = importlib.import_module("lab.fakes.kube_api")
trivial_extender = load("trivial_extender")

LABELS = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "A100",
          "nvidia.com/gpu.memory": "10000"}


def pod(name, mem, node=None, index=None):
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}",
            "annotations": {"tandem.io/gpu-mem-mib": str(mem)}}
    spec = {"containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
        meta["annotations"].update({"tandem.io/gpu-index": str(index),
                                    "tandem.io/predicted-gpu-mem-mib": str(mem)})
    return {"metadata": meta, "spec": spec}


@pytest.fixture
def fake():
    server = fake_kube_api.FakeKubeApi(
        nodes=[{"metadata": {"name": n, "labels": LABELS}} for n in ("a", "b")],
        pods=[pod("busy0", 9000, "a", 0), pod("busy1", 9000, "a", 1), pod("new", 4000)])
    server.start()
    yield server
    server.stop()


def test_trivial_extender_filters_by_free_memory_and_binds_through_the_api(fake):
    api = trivial_extender.kube_client(int(fake.url.rsplit(":", 1)[1]))
    # its pool holds kube-scheduler's 16 binds in flight (the default kept 10 on 2 cores)
    assert api.api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] >= 16
    web = trivial_extender.create_trivial_app(api).test_client()
    new = fake.pod("ml", "new")
    r = web.post("/filter", json={"Pod": new, "NodeNames": ["a", "b"]}).get_json()
    assert r["NodeNames"] == ["b"] and r["FailedNodes"] == {"a": trivial_extender.REASON}
    r = web.post("/prioritize", json={"Pod": new, "NodeNames": ["b"]}).get_json()
    assert r == [{"Host": "b", "Score": 0}]
    bind = {"PodName": "new", "PodNamespace": "ml", "PodUID": "uid-new", "Node": "b"}
    assert web.post("/bind", json=bind).get_json() == {"Error": ""}
    assert fake.pod("ml", "new")["spec"]["nodeName"] == "b"
    (request,) = [r for r in fake.requests if r.method == "POST"]
    assert request.body["metadata"]["uid"] == "uid-new"
    again = web.post("/bind", json=bind).get_json()["Error"]  # the API server says 409
    assert "409" in again
