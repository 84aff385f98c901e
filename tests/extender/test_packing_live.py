"""The packing score on a live extender: shapes learned from binds through the HTTP verbs,
node CPU and memory from the source, pods of no GPU scored, the deciding term explained."""

from __future__ import annotations

import pytest
from extender_builders import AGENT_AUTH, args, binding, make_app, node, training

from contracts.annotations import DECIDED_BY
from contracts.state import decode_state
from extender.core import NodeSpec
from extender.learning.learner import Learner
from extender.learning.shapes import ShapeLearner
from extender.ops.status import summarize
from extender.ops.status_render import render

GIB = 1024.0
LIVE = {"packing": {"live": True}}


def host_node(name: str, cpu_milli: float, mem_mib: float, gpus: int = 1) -> NodeSpec:
    base = node(name, count=gpus)
    return NodeSpec(base.name, base.gpus, (cpu_milli, mem_mib))


def cpu_pod(name: str, cpu: str, memory: str) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"cpu": cpu, "memory": memory}}}]}}


def trained(name: str, mem: float, cpu: str, memory: str) -> dict:
    """A 1-GPU training pod asserting ``mem`` MiB that requests ``cpu`` and ``memory``."""
    pod = training(name, util=10, mem=mem)
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
    return pod


def best(client, pod, names):
    body = client.post("/prioritize", json=args(pod, names)).get_json()
    scores = {e["Host"]: e["Score"] for e in body}
    return max(names, key=lambda n: (scores[n], -names.index(n)))


def bind(client, source, pod, node_name):
    source.create_pod(pod)
    assert client.post("/filter", json=args(pod, [node_name])).get_json()["NodeNames"] == \
        [node_name]
    assert client.post("/bind", json=binding(pod, node_name)).get_json() == {"Error": ""}


@pytest.fixture
def live():
    nodes = [node(f"n{i}", count=1) for i in range(1, 6)]
    app, ext, source, clock = make_app(nodes, LIVE)
    return app.test_client(), ext, source


def test_learned_shapes_change_the_placement_and_say_why(live):
    client, ext, source = live
    bind(client, source, training("a", util=10, mem=20000), "n1")
    probe = training("x", util=10, mem=10000)
    # one shape seen (half a GPU): the empty n2 keeps room for it, as Horus would choose
    assert best(client, probe, ["n1", "n2"]) == "n2"
    for i in (3, 4, 5):  # whole-GPU pods arrive: a half-used GPU is where a small pod goes
        bind(client, source, training(f"w{i}", util=10, mem=40960), f"n{i}")
    assert best(client, probe, ["n1", "n2"]) == "n1"
    source.create_pod(probe)
    assert client.post("/bind", json=binding(probe, "n1")).get_json() == {"Error": ""}
    bound = source.read_pod("default", "x")
    assert bound["metadata"]["annotations"][DECIDED_BY] == "fragmentation"
    state = client.get("/v1/state", headers=AGENT_AUTH).get_json()
    pods = {p["pod"]: p for n in state["nodes"].values() for g in n["gpus"] for p in g["pods"]}
    assert pods["default/x"]["annotations"][DECIDED_BY] == "fragmentation"
    shapes = state["learning"]["shapes"]
    assert shapes["count"] == 3 and shapes["top"][0]["gpu_mem_mib"] == 40960
    status = summarize(decode_state(state), "http://extender", None)
    (entry,) = [p for n in status["nodes"] for g in n["gpus"] for p in g["pods"]
                if p["pod"] == "default/x"]
    assert entry["decided_by"] == "fragmentation"
    assert "default/x 10% 10000 MiB [asserted; decided by fragmentation]" in \
        " ".join(render(status).split())


def test_scheduler_choice_and_a_single_node_are_named(live):
    client, ext, source = live
    bind(client, source, training("a", util=10, mem=20000), "n1")
    other = training("y", util=10, mem=10000)
    assert best(client, other, ["n1", "n2"]) == "n2"
    source.create_pod(other)
    assert client.post("/bind", json=binding(other, "n1")).get_json() == {"Error": ""}
    assert source.read_pod("default", "y")["metadata"]["annotations"][DECIDED_BY] == "scheduler"
    assert source.read_pod("default", "a")["metadata"]["annotations"][DECIDED_BY] == "only"


@pytest.mark.parametrize("packing", [{"enabled": False, "live": True}, {}])
def test_packing_off_or_not_live_leaves_horus_alone(packing):
    nodes = [node(f"n{i}", count=1) for i in range(1, 6)]
    app, ext, source, _ = make_app(nodes, {"packing": packing})
    client = app.test_client()
    bind(client, source, training("a", util=10, mem=20000), "n1")
    for i in (3, 4, 5):
        bind(client, source, training(f"w{i}", util=10, mem=40960), f"n{i}")
    probe = training("x", util=10, mem=10000)
    assert best(client, probe, ["n1", "n2"]) == "n2"
    source.create_pod(probe)
    assert client.post("/bind", json=binding(probe, "n2")).get_json() == {"Error": ""}
    assert source.read_pod("default", "x")["metadata"]["annotations"][DECIDED_BY] == \
        "interference"
    assert ext.learner.shapes.count == 3  # learned all the same, for when it is turned on


def test_a_gpu_whose_host_is_full_is_stranded():
    # n1's GPU is as empty as n2's, but the pod would take n1's last CPUs: the half-GPU pods
    # seen so far (2 CPUs each) could no longer use what is left of n1's GPU.
    nodes = [host_node("n1", 4000, 64 * GIB), host_node("n2", 64000, 64 * GIB),
             host_node("n3", 64000, 64 * GIB)]
    app, ext, source, _ = make_app(nodes, LIVE)
    client = app.test_client()
    bind(client, source, trained("w", 20000, "2", "8Gi"), "n3")
    assert best(client, trained("x", 10000, "3", "1Gi"), ["n1", "n2"]) == "n2"
    free = ext.state.snapshot().hosts.free("n3")
    assert free == (62000.0, 56 * GIB)


def test_pods_of_no_gpu_are_filtered_scored_and_bound_on_the_host():
    nodes = [host_node("n1", 8000, 32 * GIB), host_node("n2", 64000, 256 * GIB),
             host_node("n3", 1000, 4 * GIB)]
    app, ext, source, _ = make_app(nodes, LIVE)
    client = app.test_client()
    # a whole-GPU shape that needs 8 CPUs is learned
    bind(client, source, trained("w", 40960, "8", "16Gi"), "n2")
    web = cpu_pod("web", "2", "4Gi")
    body = client.post("/filter", json=args(web, ["n1", "n2", "n3"])).get_json()
    assert body["NodeNames"] == ["n1", "n2"]
    assert "1000m CPU" in body["FailedNodes"]["n3"]
    # on n1 the pod leaves 6 CPUs: the whole-GPU shape no longer fits there, its GPU strands
    assert best(client, web, ["n1", "n2"]) == "n2"
    source.create_pod(web)
    assert client.post("/bind", json=binding(web, "n2")).get_json() == {"Error": ""}
    assert source.read_pod("default", "web")["spec"]["nodeName"] == "n2"
    binds = source.binds
    assert client.post("/bind", json=binding(web, "n2")).get_json() == {"Error": ""}
    assert "already bound to n2" in client.post("/bind", json=binding(web, "n1")).get_json()[
        "Error"]
    assert source.binds == binds  # a retried bind writes nothing again
    assert ext.state.snapshot().hosts.free("n2") == (54000.0, 236 * GIB)
    assert ext.learner.shapes.count == 2  # the pod of no GPU is a shape too
    assert ext.state.snapshot().placement_of("uid-web") is None  # it holds no GPU
    big = cpu_pod("big", "60", "1Gi")
    source.create_pod(big)
    r = client.post("/bind", json=binding(big, "n1")).get_json()
    assert "no longer has the CPU and memory" in r["Error"]


def test_shapes_persist_and_reload(tmp_path):
    learner = Learner(build_learning())
    learner.shapes.observe(1, 40960, 8000, 16384)
    learner.shapes.observe(1, 40960, 8000, 16384)
    learner.shapes.observe(0, 0, 2000, 4096)
    doc = learner.document()
    again = Learner(build_learning())
    assert again.load_document(doc) >= 2
    assert again.shapes.to_document() == learner.shapes.to_document()
    assert again.shapes.shapes("count").weight.tolist() == pytest.approx([1 / 3, 2 / 3])
    # a merge keeps the larger count per shape (a replica's counts began as the document's)
    again.shapes.observe(1, 40960, 8000, 16384)
    again.load_document(doc, merge=True)
    assert dict((tuple(r[:4]), r[4]) for r in again.shapes.to_document()["rows"])[
        (1, 40960.0, 8000.0, 16384.0)] == 3


@pytest.mark.parametrize("rows", [None, [[1, 2, 3]], [[1, "x", 0, 0, 1]], [[1.5, 1, 0, 0, 1]],
                                  [[1, -1, 0, 0, 1]], [[1, None, 0, 0, 1]]])
def test_malformed_shape_documents_are_refused(rows):
    with pytest.raises(ValueError):
        ShapeLearner().load_document({"rows": rows})


def test_shapes_stay_bounded():
    shapes = ShapeLearner()
    from extender.core.packing import PackingPolicy
    shapes.bounds(PackingPolicy(max_shapes=3, window=4))
    for mem in range(10):
        shapes.observe(1, 1000 + mem, 0, 0)
    assert shapes.count == 3


def build_learning():
    from extender.config.sections import LearningConfig
    return LearningConfig()
