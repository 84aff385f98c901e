"""#25: the device plugin hands a multi-container pod its GPUs container by container,
each container exactly the GPUs bind decided for it, never another pod's; device IDs it
never advertised and pods bound without the extender's decision are refused."""

from __future__ import annotations

import grpc
import pytest
from extender_builders import TOKEN, args, binding, make_app, node, training
from test_device_plugin import G0, G1, INVENTORY, allocate, placement, plugin  # noqa: F401

from agent.device_plugin.assign import Candidate, Gpu, Refusal, candidates, choose
from agent.device_plugin.main import placements_of
from agent.node.extender_view import parse_node_view

G2 = Gpu(2, "GPU-cccc")
THREE = {**INVENTORY, G2.uuid: G2}


def two_containers(name="duo"):
    pod = training(name, util=20, mem=1000, gpus=1)
    c = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [{**c, "name": "c1"}, {**c, "name": "c2"}]
    return pod


def test_bind_says_which_container_gets_which_gpu_and_the_plugin_follows_it():
    app, ext, source, _ = make_app([node("n1", 4)])
    client = app.test_client()
    busy = training("busy", util=90, mem=30000, gpus=1)  # GPU 0 taken: the pod gets 1 and 2
    for p in (busy, two_containers()):
        source.create_pod(p)
        assert client.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
        assert client.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    ann = source.read_pod("default", "duo")["metadata"]["annotations"]
    first, second = (int(i) for i in ann["tandem.io/gpu-index"].split(","))
    assert ann["tandem.io/container-gpus"] == f"c1={first};c2={second}"
    view = parse_node_view(client.get("/v1/state", headers={
        "Authorization": f"Bearer {TOKEN}"}).get_json(), "n1")
    inventory = {g.uuid: Gpu(g.index, g.uuid) for g in view.gpus}
    rows = [r for r in placements_of(view) if r[1] == "duo"]
    assert {(r[3], r[5]) for r in rows} == {(first, "c1"), (second, "c2")}
    # The kubelet admits c1 (1 device), then c2 (1 device).
    c1 = choose(candidates(rows, inventory, {}), 1, "n1")
    assert (c1.container, [g.index for g in c1.gpus]) == ("c1", [first])
    c2 = choose(candidates(rows, inventory, {"default/duo": {"c1"}}), 1, "n1")
    assert (c2.container, [g.index for g in c2.gpus]) == ("c2", [second])
    assert candidates(rows, inventory, {"default/duo": {"c1", "c2"}}) == []


def test_a_container_is_never_handed_another_pending_pods_gpu():
    rows = placement("ml", "duo", "u1", G1, container="c1") + \
        placement("ml", "duo", "u1", G2, container="c2") + placement("ml", "one", "u2", G0)
    pods = candidates(rows, THREE, {})
    assert pods == [Candidate("ml/duo", "u1", (G1,), "c1"), Candidate("ml/one", "u2", (G0,))]
    refused = choose(pods, 1, "n1")
    assert isinstance(refused, Refusal) and refused.reason == "Ambiguous"


def test_untrusted_pods_are_never_candidates():
    rows = placement("ml", "bypass", "u9", G0, G1, state="untrusted")
    assert candidates(rows, INVENTORY, {}) == []


def test_allocate_per_container_over_grpc(plugin):  # noqa: F811
    plugin["rows"].extend(placement("ml", "duo", "u1", G0, container="c1")
                          + placement("ml", "duo", "u1", G1, container="c2"))
    first = allocate(plugin, "GPU-bbbb::2").container_responses[0]
    assert dict(first.envs)["NVIDIA_VISIBLE_DEVICES"] == G0.uuid
    assert dict(first.annotations)["tandem.io/container"] == "c1"
    second = allocate(plugin, "GPU-aaaa::1").container_responses[0]
    assert dict(second.envs)["NVIDIA_VISIBLE_DEVICES"] == G1.uuid
    assert dict(second.annotations)["tandem.io/container"] == "c2"
    with pytest.raises(grpc.RpcError) as err:  # both containers have their GPU
        allocate(plugin, "GPU-aaaa::0")
    assert "NoAssignment" in err.value.details()


def test_allocate_refuses_device_ids_it_never_advertised(plugin):  # noqa: F811
    plugin["rows"].extend(placement("ml", "pending", "u1", G1))
    with pytest.raises(grpc.RpcError) as err:
        allocate(plugin, "no-such-device")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UnknownDevice" in err.value.details()
    with pytest.raises(grpc.RpcError):
        allocate(plugin, "GPU-aaaa::99")  # a share past the advertised count
    # the pending pod still gets its GPU with a real ID
    assert allocate(plugin, "GPU-aaaa::0").container_responses[0].envs[
        "NVIDIA_VISIBLE_DEVICES"] == G1.uuid


def test_allocate_refuses_a_pod_bound_without_the_extenders_decision(plugin):  # noqa: F811
    plugin["rows"].extend(placement("ml", "bypass", "u9", G0, state="untrusted"))
    with pytest.raises(grpc.RpcError) as err:
        allocate(plugin, "GPU-aaaa::0")
    assert "NoAssignment" in err.value.details()
