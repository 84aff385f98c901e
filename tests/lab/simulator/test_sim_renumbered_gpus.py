"""#25: in the simulated cluster too, placements follow GPU UUIDs. A report that renumbers
a node's GPUs (GPU 0 gone, the old GPU 1 now index 0, same UUID) moves nothing and never
lets a GPU exceed its pod limit."""

from __future__ import annotations

from extender_builders import TOKEN, args, binding, make_app, training

from contracts.clusterfile import parse_cluster_file, sim_gpu_uuid
from extender.cluster.sim import SimSource

A100 = "NVIDIA-A100-SXM4-40GB"
CLUSTER = {"nodes": [{"name": "n1", "gpus": [{"product": A100, "memory_mib": 40960,
                                              "count": 2}]}],
           "pods": [{"name": f"old-{i}", "node": "n1", "gpu_index": [1], "util_percent": 1,
                     "mem_mib": 100} for i in range(8)]}


def renumbering_report():
    """GPU 0 gone; the old GPU 1 (same UUID) is now index 0."""
    return {"node": "n1", "timestamp": 1.0, "interval_seconds": 1.0,
            "gpus": [{"index": 0, "uuid": sim_gpu_uuid("n1", 1), "product": A100,
                      "memory_total_mib": 40960, "memory_used_mib": 800,
                      "utilization_percent": 8, "processes": []}]}


def pods_on(client):
    return {g["uuid"]: len(g["pods"]) for g in
            client.get("/v1/state").get_json()["nodes"]["n1"]["gpus"]}


def test_a_renumbering_report_keeps_the_file_pods_on_their_gpu_and_the_limit_holds():
    source = SimSource.from_cluster(parse_cluster_file(CLUSTER))
    app, _, _, _ = make_app(source=source)
    client = app.test_client()
    assert pods_on(client) == {sim_gpu_uuid("n1", 0): 0, sim_gpu_uuid("n1", 1): 8}
    r = client.post("/v1/agents/report", json=renumbering_report(),
                    headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    assert pods_on(client) == {sim_gpu_uuid("n1", 1): 8}  # followed the UUID to index 0
    for i in range(8):
        p = training(f"new-{i}", util=1, mem=100)
        source.create_pod(p)
        assert client.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == []
        assert "no longer fits" in client.post("/bind", json=binding(p, "n1")).get_json()[
            "Error"]
    assert pods_on(client) == {sim_gpu_uuid("n1", 1): 8}
