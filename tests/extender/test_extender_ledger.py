"""Ledger behaviour: concurrent binds, assume/expire, restart recovery from annotations."""

from __future__ import annotations

import threading

import pytest
from extender_builders import (
    A100,
    A100_MIB,
    AGENT_AUTH,
    H100,
    TTL,
    NodeBuilder,
    PodBuilder,
    args,
    assume_best,
    binding,
    demand,
    gpu_types,
    inference,
    make_app,
    node,
    placement,
    state_view,
    training,
)

from extender.cluster.sim import SimSource, parse_cluster
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.core import CostPolicy, GpuSpec, Placement, SessionSpec, Workload
from extender.errors import BindConflict
from extender.learning.knowledge import FixedBeliefs
from extender.state.ledger import ClusterState
from extender.wiring import create_app


@pytest.mark.parametrize(("mem", "feasible"), [(8000, 5), (13000, 3), (41000, 0)],
                         ids=["5-fit", "3-fit", "none-fit"])
def test_concurrent_binds_never_overcommit(mem, feasible):
    app, ext, source, _ = make_app([node("n1", 1)])
    client_lock = threading.Lock()
    pods = [training(f"p{i}", util=5, mem=mem) for i in range(50)]
    for p in pods:
        source.create_pod(p)
    results: list[str] = []
    barrier = threading.Barrier(50)

    def bind(p):
        client = app.test_client()
        barrier.wait()
        body = client.post("/bind", json=binding(p, "n1")).get_json()
        with client_lock:
            results.append(body["Error"])

    threads = [threading.Thread(target=bind, args=(p,)) for p in pods]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    # 40960 MiB GPU: exactly floor(40960 / mem) binds fit (co-location limit 8 not reached)
    assert sum(e == "" for e in results) == feasible
    assert all("no longer fits" in e for e in results if e)
    state = app.test_client().get("/v1/state", headers=AGENT_AUTH).get_json()
    gpu = state["nodes"]["n1"]["gpus"][0]
    assert gpu["reserved_mib"] == feasible * mem <= 40960


def test_restart_rebuilds_from_annotations_without_loss_or_double_booking():
    app, ext, source, _ = make_app([node("n1", 2), node("n2", 2)])
    client = app.test_client()
    placed = [training("a", util=40, mem=20000, gpus=2), training("b", util=30, mem=30000),
              inference("s", rate=100)]
    for p in placed:
        source.create_pod(p)
        names = client.post("/filter", json=args(p, ["n1", "n2"])).get_json()["NodeNames"]
        assert client.post("/bind", json=binding(p, names[0])).get_json() == {"Error": ""}
    before = client.get("/v1/state", headers=AGENT_AUTH).get_json()

    # a new process: fresh app and state over the same "API server"
    app2, ext2, *_ = make_app(source=source)
    after = app2.test_client().get("/v1/state", headers=AGENT_AUTH).get_json()
    for doc in (before, after):
        for info in doc["nodes"].values():
            for g in info["gpus"]:
                for p in g["pods"]:
                    p["state"] = "placed"  # the sim confirms at once; state names may differ
    assert after["nodes"] == before["nodes"] and after["placed"] == 3
    # nothing double-booked: the restarted extender refuses what no longer fits
    big = training("c", mem=15000)
    source.create_pod(big)
    body = app2.test_client().post("/filter", json=args(big, ["n1", "n2"])).get_json()
    free = {n: [40960 - g["reserved_mib"] for g in i["gpus"]
                if all(p["workload"] == "training" for p in g["pods"])]
            for n, i in after["nodes"].items()}
    fitting = [n for n, f in free.items() if max(f, default=0) >= 15000]
    assert fitting == ["n1"]
    assert body["NodeNames"] == fitting


def _assume(state: ClusterState, util: float = 10, mem: float = 1000) -> Placement:
    """Assume pod ``d/p`` (uid ``u1``) on n1 through the ledger's bind path."""
    p = PodBuilder("p", namespace="d").uid("u1").util(util).mem(mem).obj()
    assumed, *_ = assume_best(state, "n1", demand(p, gpu_types(state)), None, "u1", "d/p")
    return assumed


def test_assumed_placement_is_kept_while_binding_before_its_ttl_and_once_confirmed():
    clock = [100.0]
    state = ClusterState(FixedBeliefs(CostPolicy()), lambda: clock[0], 30)
    state.set_nodes([node("n1", 1)])
    p = _assume(state)
    assert p == placement("u1", pod="d/p", node="n1", gpus=(0,), util=10, mem=1000)
    assert state.expire() == [] and state.is_known("u1")  # bind in flight: no deadline yet
    state.finish_binding("u1")
    clock[0] += 29
    assert state.expire() == [] and state.is_known("u1")
    state.confirm(p)  # the watch saw it bound
    clock[0] += 100
    assert state.expire() == [] and state.placement_of("u1") == p
    state.forget("u1")
    assert state_view(state)["nodes"]["n1"]["gpus"][0]["reserved_mib"] == 0


def test_assumed_placement_dropped_after_ttl():
    clock = [0.0]
    state = ClusterState(FixedBeliefs(CostPolicy()), lambda: clock[0], 5)
    state.set_nodes([node("n1", 1)])
    p = _assume(state)
    assert state_view(state)["nodes"]["n1"]["gpus"][0]["reserved_mib"] == 1000
    state.finish_binding("u1")
    clock[0] = 6
    assert state.expire() == [p]
    assert not state.is_known("u1")
    assert state_view(state)["nodes"]["n1"]["gpus"][0]["reserved_mib"] == 0


MIXED = NodeBuilder("n1").gpus(1).gpus(1, product=H100, memory_mib=81559).obj()


# (pod as bind left it, the placement a restarted ledger must hold; None = not in the ledger)
BOUND_PODS = [
    ("training-gang", PodBuilder("t").uid("t").gpus(2).util(40).mem(9000)
     .bound("n1", 0, 1, util=40, mem=9000),
     placement("t", gpus=(0, 1), util=40, mem=9000)),
    ("slo-session", PodBuilder("s").uid("s").inference().slo(100, 200)
     .bound("n1", 1, util=16.01, mem=2500),
     placement("s", gpus=(1,), util=16.01, mem=2500,
               session=SessionSpec("default/s", "resnet50", 100.0, 200.0))),
    ("weighted-best-effort", PodBuilder("b").uid("b").inference().weight(3)
     .bound("n1", 0, util=75, mem=2500),
     placement("b", gpus=(0,), util=75, mem=2500, weight=3)),
    ("priority-counts-one", PodBuilder("b").uid("b").inference().weight(3).priority(1)
     .bound("n1", 0, util=75, mem=2500),
     placement("b", gpus=(0,), util=75, mem=2500, workload=Workload.INFERENCE)),
    ("finished", PodBuilder("t").uid("t").util(40).mem(9000).bound("n1", 0, util=40, mem=9000)
     .phase("Succeeded"), None),
    ("never-bound", PodBuilder("t").uid("t").util(40).mem(9000), None),
]


@pytest.mark.parametrize(("pod", "expected"), [pytest.param(b.obj(), e, id=n)
                                               for n, b, e in BOUND_PODS])
def test_restart_rebuilds_each_placement_from_its_pod(pod, expected):
    state = ClusterState(FixedBeliefs(CostPolicy()), lambda: 0.0, TTL)
    SimSource([MIXED], [pod]).start(state)
    assert state.placement_of(pod["metadata"]["uid"]) == expected
    assert state_view(state)["placed"] == (expected is not None)


def test_bind_source_failure_forgets_the_assumption():
    class Failing(SimSource):
        def bind(self, pod, node_name, annotations, placement=None):
            raise RuntimeError("apiserver down")

    source = Failing([node("n1", 1)])
    app = create_app(ConfigHolder(build_config({})), source)
    p = training("x")
    source.create_pod(p)
    body = app.test_client().post("/bind", json=binding(p, "n1")).get_json()
    assert "apiserver down" in body["Error"]
    assert state_view(app.extensions["tandem"].state)["assumed"] == 0
    assert source.events[-1].reason == "TandemBindFailed"


def test_sim_file_prebound_pods_and_bad_files():
    nodes, pods = parse_cluster({"nodes": [{"name": "n", "gpus": [
        {"product": "X", "memory_mib": 100, "count": 2}]}],
        "pods": [{"name": "p", "node": "n", "gpu_index": [1], "util_percent": 20,
                  "mem_mib": 50}]})
    state = ClusterState(FixedBeliefs(CostPolicy()), lambda: 0.0, TTL)
    SimSource(nodes, pods).start(state)
    assert state_view(state)["nodes"]["n"]["gpus"][1]["reserved_mib"] == 50
    from contracts.clusterfile import ClusterFileError

    with pytest.raises(ClusterFileError) as info:
        parse_cluster({"nodes": [{"name": "n", "gpus": [{"product": "", "memory_mib": -1}]}],
                       "extra": 1})
    assert any("extra" in p for p in info.value.problems)
    assert any("product" in p for p in info.value.problems)


def test_renumbered_gpus_keep_their_pods_by_uuid():
    """M4: GPU 0 vanishes, the agent's report renumbers the others (B: 1 -> 0, C: 2 -> 1);
    every pod stays on its physical GPU and no more bind there than the pod limit."""
    def gpu_spec(index, uuid):
        return GpuSpec(index, uuid, A100, A100_MIB)

    state = ClusterState(FixedBeliefs(CostPolicy(max_pods_per_gpu=8)), lambda: 1000.0, TTL)
    state.set_nodes([node("n1", 3)])
    state.report("n1", [gpu_spec(0, "GPU-A"), gpu_spec(1, "GPU-B"), gpu_spec(2, "GPU-C")],
                 [0.0] * 3, [0.0] * 3)
    for i in range(8):
        state.confirm(Placement(f"u{i}", f"default/p{i}", "n1", (1,), 1.0, 100.0,
                                gpu_uuids=("GPU-B",)))
    state.report("n1", [gpu_spec(0, "GPU-B"), gpu_spec(1, "GPU-C")], [0.0] * 2, [0.0] * 2)
    gpus = {g["uuid"]: g for g in state_view(state)["nodes"]["n1"]["gpus"]}
    assert len(gpus["GPU-B"]["pods"]) == 8 and gpus["GPU-B"]["reserved_mib"] == 800
    assert gpus["GPU-C"]["pods"] == [] and gpus["GPU-C"]["reserved_mib"] == 0
    for i in range(8, 16):  # new pods go to GPU C only: B is at its limit
        p = training(f"p{i}", util=1, mem=100)
        placed, *_ = assume_best(state, "n1", demand(p, gpu_types(state)), None, f"u{i}",
                                       f"default/p{i}")
        assert placed.gpu_uuids == ("GPU-C",)
    gpus = {g["uuid"]: g for g in state_view(state)["nodes"]["n1"]["gpus"]}
    assert (len(gpus["GPU-B"]["pods"]), len(gpus["GPU-C"]["pods"])) == (8, 8)


def test_sim_file_pods_follow_their_gpu_uuid_when_a_report_renumbers():
    """#25: a cluster file's pods on GPU 1; a report says GPU 0 is gone and the old GPU 1 is
    now index 0 (same UUID): the pods stay on that GPU and it takes no more than its limit."""
    from contracts.clusterfile import sim_gpu_uuid

    raw = {"nodes": [{"name": "n", "gpus": [{"product": "X", "memory_mib": 1000, "count": 2}]}],
           "pods": [{"name": f"p{i}", "node": "n", "gpu_index": [1], "util_percent": 1,
                     "mem_mib": 100} for i in range(8)]}
    nodes, pods = parse_cluster(raw)
    state = ClusterState(FixedBeliefs(CostPolicy()), lambda: 0.0, TTL)
    SimSource(nodes, pods).start(state)
    survivor = sim_gpu_uuid("n", 1)
    state.report("n", [GpuSpec(0, survivor, "X", 1000.0)], [0.0], [0.0])
    (gpu,) = state_view(state)["nodes"]["n"]["gpus"]
    assert gpu["uuid"] == survivor and len(gpu["pods"]) == 8 and gpu["reserved_mib"] == 800
    p = training("p9", util=1, mem=100)
    with pytest.raises(BindConflict):  # 8 pods is the default limit per GPU
        assume_best(state, "n", demand(p, gpu_types(state)), None, "u9", "default/p9")


def test_sources_mark_the_state_synced_through_its_method_only():
    state = ClusterState(FixedBeliefs(CostPolicy()), lambda: 0.0, TTL)
    before = state.snapshot()
    with pytest.raises(AttributeError):
        before.synced = True  # frozen: the sources call mark_synced()
    SimSource([]).start(state)
    assert state.snapshot().synced and not before.synced
