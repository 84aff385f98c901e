"""A ``--cluster sim:FILE`` extender binds pods an external scheduler sends, once declared.

Bind reads the pod from the cluster source, never from a /filter body; in sim mode the
source is the file's registry, so a pod is declared under ``pending:`` in the file or
registered with ``POST /v1/sim/pods`` from this machine. Checked end to end on a real
process over HTTP (filter, prioritize, bind as kube-scheduler sends them), and in
process for the route's refusals.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from tandem_process import TandemProcess, free_port

from contracts.clusterfile import ClusterFileError, parse_cluster_file
from extender.cluster.sim import SIM_PODS_PATH, SimSource
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.wiring import create_app

DEMAND = {"tandem.io/gpu-util": "30", "tandem.io/gpu-mem-mib": "8000"}
CLUSTER = {
    "nodes": [{"name": "n1", "gpus": [{"product": "NVIDIA-A100-SXM4-40GB",
                                       "memory_mib": 40960, "count": 2}]},
              {"name": "n2", "gpus": [{"product": "NVIDIA-A100-SXM4-40GB",
                                       "memory_mib": 40960, "count": 1}]}],
    "pending": [{"name": "declared", "namespace": "ml", "uid": "u-declared",
                 "annotations": DEMAND}],
}


def k8s_pod(name: str, uid: str, gpus: int = 1) -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": DEMAND},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"tandem.io/gpu": str(gpus)}}}]}}


def schedule(http: httpx.Client, pod: dict, nodes: list[str]) -> dict:
    """filter -> prioritize -> bind, as kube-scheduler calls an extender."""
    filtered = http.post("/filter", json={"Pod": pod, "NodeNames": nodes}).json()
    assert filtered["Error"] == "" and filtered["NodeNames"], filtered
    scores = http.post("/prioritize", json={"Pod": pod, "NodeNames": filtered["NodeNames"]})
    best = max(scores.json(), key=lambda s: s["Score"])["Host"]
    meta = pod["metadata"]
    return {"node": best, **http.post("/bind", json={
        "PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
        "Node": best}).json()}


@pytest.fixture()
def extender(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
    port = free_port()
    proc = TandemProcess(["extender", "serve", "--cluster", f"sim:{tmp_path / 'cluster.yaml'}",
                          "--port", str(port)])
    try:
        proc.wait_for("serving")
        yield f"http://127.0.0.1:{port}"
        assert proc.terminate(15)[0] == 0
    finally:
        proc.close()


def test_an_external_client_schedules_declared_and_registered_pods(extender: str) -> None:
    with httpx.Client(base_url=extender, timeout=10) as http:
        declared = k8s_pod("declared", "u-declared")
        assert schedule(http, declared, ["n1", "n2"])["Error"] == ""

        unknown = k8s_pod("stranger", "u-stranger")
        refused = schedule(http, unknown, ["n1", "n2"])["Error"]
        assert "not in the simulated cluster" in refused and SIM_PODS_PATH in refused

        added = http.post(SIM_PODS_PATH, json=unknown)
        assert added.status_code == 201
        assert added.json() == {"pod": "ml/stranger", "uid": "u-stranger"}
        assert schedule(http, unknown, ["n1", "n2"])["Error"] == ""
        again = http.post(SIM_PODS_PATH, json=unknown)  # bound now: not replaced
        assert again.status_code == 409 and "already bound" in again.json()["Error"]

        state = http.get("/v1/state").json()  # pod names are redacted without a token
        assert (state["placed"], state["assumed"]) == (2, 0)


def _app(tmp_path: Path):
    return create_app(ConfigHolder(build_config({})),
                      SimSource.from_cluster(parse_cluster_file(CLUSTER)))


def test_the_registration_route_refuses_remote_clients_and_bad_pods(tmp_path: Path) -> None:
    client = _app(tmp_path).test_client()
    pod = k8s_pod("p", "u-p")
    remote = client.post(SIM_PODS_PATH, json=pod, environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert remote.status_code == 403
    bound = {**pod, "spec": {**pod["spec"], "nodeName": "n1"}}
    assert client.post(SIM_PODS_PATH, json=bound).status_code == 400
    assert client.post(SIM_PODS_PATH, data=b"{not json").status_code == 400
    assert client.post(SIM_PODS_PATH, json=[1]).status_code == 400
    assert client.post(SIM_PODS_PATH, json={"metadata": {"name": ""}}).status_code == 400
    nameless_uid = client.post(SIM_PODS_PATH, json={"metadata": {"name": "q"}})
    assert nameless_uid.get_json() == {"pod": "default/q", "uid": "uid-default-q"}


def test_a_kube_extender_has_no_registration_route() -> None:
    from fault_cluster import cluster

    with cluster(nodes=1) as c:
        answer = c.replica().post(SIM_PODS_PATH, k8s_pod("p", "u-p"))
        assert answer.status_code == 404  # the API server is the only registry there


@pytest.mark.parametrize(("pending", "problem"), [
    ([{"name": "a", "gpus": 0}], "pending[0].gpus: must be an integer in 1..64"),
    ([{"name": "a", "node": "n1"}], "pending[0].node: unknown key"),
    ([{"name": "a"}, {"name": "a", "uid": "other"}], "pending[1]: default/a repeats pending[0]"),
    ("a", "pending: must be a list"),
])
def test_bad_pending_entries_are_refused_with_their_path(pending, problem) -> None:
    with pytest.raises(ClusterFileError) as err:
        parse_cluster_file({**CLUSTER, "pending": pending})
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems
