"""#25: nothing a pod owner writes (or sends to /filter) changes what bind decided.

Against the loopback API server (benchmarks/fake_kube_api.py) through the ``kube``
source, as tests/test_fault_injection.py does.
"""

from __future__ import annotations

from fault_cluster import audit, cluster, k8s_pod


def reserved(replica, node="gpu-0"):
    return [g["reserved_mib"] for g in replica.state.view()["nodes"][node]["gpus"]]


def test_a_forged_filter_body_never_sets_what_bind_reserves():
    """A /filter for a pod the scheduler has not asked about yet, claiming 100 MiB against
    the pod's real 30,000, then /bind: bind reads the pod from the API server."""
    with cluster(nodes=1) as c:
        r = c.replica()
        real = c.fake.put_pod(k8s_pod("big", {"tandem.io/gpu-util": "20",
                                              "tandem.io/gpu-mem-mib": "30000"}))
        forged = {**real, "metadata": {**real["metadata"], "annotations": {
            "tandem.io/gpu-util": "1", "tandem.io/gpu-mem-mib": "100"}}}
        assert r.post("/filter", {"Pod": forged, "NodeNames": ["gpu-0"]}).get_json()[
            "NodeNames"] == ["gpu-0"]
        assert r.bind("big", "gpu-0") == {"Error": ""}
        assert sorted(reserved(r)) == [0, 30000]
        ann = c.fake.pod("ml", "big")["metadata"]["annotations"]
        assert ann["tandem.io/predicted-gpu-mem-mib"] == "30000"


def test_a_forged_filter_with_the_real_uid_and_version_does_not_answer_for_the_real_pod():
    """The demand cache is keyed by the pod's contents: a body with the real pod's UID and
    resourceVersion asserting 1 MiB, before and after the scheduler's filter of the real
    pod (30,000 MiB), then its bind."""
    with cluster(nodes=1) as c:
        r = c.replica()
        real = c.fake.put_pod(k8s_pod("p", {"tandem.io/gpu-util": "20",
                                            "tandem.io/gpu-mem-mib": "30000"}))
        forged = {**real, "metadata": {**real["metadata"], "annotations": {
            "tandem.io/gpu-util": "1", "tandem.io/gpu-mem-mib": "1"}}}
        r.post("/filter", {"Pod": forged, "NodeNames": ["gpu-0"]})
        assert r.filter(c.fake, "p", ["gpu-0"])["NodeNames"] == ["gpu-0"]
        r.post("/filter", {"Pod": forged, "NodeNames": ["gpu-0"]})  # last word is forged
        assert r.bind("p", "gpu-0") == {"Error": ""}
        assert sorted(reserved(r)) == [0, 30000]
        assert audit(c.fake, r.state).clean
