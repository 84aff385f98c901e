"""Agents speak only for their own node: projected ServiceAccount tokens reviewed with the
API server (fake API server, official kubernetes client), GPU types against the inventory,
and samples taught by one namespace kept from another's predictions."""

from __future__ import annotations

from typing import Any

import pytest
from bench_modules import running_api
from extender_builders import TOKEN, args, binding, make_app, node, pod

from extender.config.sections import LearningConfig
from extender.core import Placement
from extender.learning.learner import Learner
from extender.state.node_identity import NODE_NAME, POD_NAME, POD_UID
from extender.state.reports import decode_report

AGENT = "system:serviceaccount:tandem-system:tandem-agent"
A100 = "NVIDIA A100-SXM4-40GB"


def report(node_name: str, product: str = A100,
           processes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"node": node_name, "timestamp": 1.0, "interval_seconds": 1.0,
            "gpus": [{"index": 0, "uuid": f"GPU-{node_name}", "product": product,
                      "memory_total_mib": 40960, "memory_used_mib": 1000,
                      "utilization_percent": 50.0, "processes": processes or []}]}


@pytest.fixture
def kube_app():
    with running_api() as (server, api):
        server.tokens.update({
            "tok-n1": {"username": AGENT, "extra": {NODE_NAME: ["n1"]},
                       "audiences": ["tandem"]},
            "tok-pod": {"username": AGENT, "audiences": ["tandem"],
                        "extra": {POD_NAME: ["agent-x"], POD_UID: ["uid-x"]}},
            "tok-gone": {"username": AGENT, "audiences": ["tandem"],
                         "extra": {POD_NAME: ["agent-y"], POD_UID: ["uid-y"]}},
            "tok-other-sa": {"username": "system:serviceaccount:team:runner",
                             "extra": {NODE_NAME: ["n1"]}, "audiences": ["tandem"]},
            "tok-other-audience": {"username": AGENT, "extra": {NODE_NAME: ["n1"]},
                                   "audiences": ["vault"]},
        })
        server.put_pod({"metadata": {"name": "agent-x", "namespace": "tandem-system",
                                     "uid": "uid-x"}, "spec": {"nodeName": "n2"}})
        app, ext, source, _ = make_app([node("n1", 1), node("n2", 1)],
                                       {"reports": {"identity": "service-account"}})
        source.api = api  # the cluster's API server reviews the tokens
        yield server, app


def post(app: Any, doc: dict[str, Any], token: str) -> tuple[int, str]:
    r = app.test_client().post("/v1/agents/report", json=doc,
                               headers={"Authorization": f"Bearer {token}"})
    return r.status_code, r.get_data(as_text=True)


def test_a_reviewed_token_speaks_for_its_own_node_only(kube_app) -> None:
    server, app = kube_app
    assert post(app, report("n1"), "tok-n1")[0] == 200
    code, body = post(app, report("n2"), "tok-n1")  # a leaked n1 token, forging n2
    assert code == 403 and "'n1', not 'n2'" in body
    # bound to a pod: the node is the pod's, read from the API server (UID checked)
    assert post(app, report("n2"), "tok-pod")[0] == 200
    assert post(app, report("n1"), "tok-pod")[0] == 403
    assert post(app, report("n1"), "tok-gone")[0] == 403  # its pod no longer exists
    assert post(app, report("n1"), "tok-other-sa")[0] == 403  # not the agents' account
    assert post(app, report("n1"), "tok-other-audience")[0] == 401
    assert post(app, report("n1"), "nobody-knows-this")[0] == 401
    assert post(app, report("n1"), TOKEN)[0] == 401  # the shared token means nothing here
    reviews = sum(1 for r in server.requests if r.path.endswith("/tokenreviews"))
    assert post(app, report("n1"), "tok-n1")[0] == 200
    assert sum(1 for r in server.requests if r.path.endswith("/tokenreviews")) == reviews


def test_the_shared_token_is_refused_for_identity_without_an_api_server() -> None:
    app, _, _, _ = make_app([node("n1", 1)], {"reports": {"identity": "service-account"}})
    code, body = post(app, report("n1"), TOKEN)
    assert code == 401 and "needs a Kubernetes cluster" in body


def test_a_gpu_type_the_node_does_not_have_teaches_nothing() -> None:
    app, ext, source, _ = make_app([node("n1", 1)], {"learning": {
        "warmup_seconds": 0, "min_observed_seconds": 0}})
    p = pod("a", uid="uid-a", model="m.onnx", gpu_util="40", gpu_mem_mib="1000")
    source.create_pod(p)
    c = app.test_client()
    assert c.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert c.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    forged = report("n1", "NVIDIA H100 80GB HBM3", [{"pid": 1, "pod_uid": "uid-a"}])
    assert post(app, forged, TOKEN)[0] == 200
    assert ext.learner.store.rejected["gpu-type-not-in-inventory"] == 1
    assert ext.learner.store.view()["alone"] == []


def test_an_estimate_from_one_namespace_sets_another_namespaces_prediction_only_confirmed(
) -> None:
    now = [1000.0]
    learner = Learner(LearningConfig(min_observed_seconds=0, spread_margin=0, warmup_seconds=0),
                      wall_clock=lambda: now[0], clock=lambda: now[0])
    placements = {
        uid: Placement(uid, f"{ns}/{uid}", "n1", (gpu,), 10.0, 100.0,
                       annotations=(("tandem.io/batch-size", "32"), ("tandem.io/model", "m")))
        for uid, ns, gpu in (("idle", "mallory", 0), ("real", "team-b", 1))}

    def feed(uid: str, gpu: int, util: float, n: int) -> None:
        doc = report("n1")
        doc["gpus"][0].update(index=gpu, uuid=f"GPU-{gpu}", utilization_percent=util,
                              processes=[{"pid": 1, "pod_uid": uid}])
        for _ in range(n):
            now[0] += 1.0
            learner.observe(decode_report(doc), placements.get)

    feed("idle", 0, 1.0, 10)  # mallory's pod names model m and idles at 1%
    gpu_type = "NVIDIA-A100-SXM4-40GB"
    mallory = learner.knowledge(learner.cfg).util(namespace="mallory").observed
    team_b = learner.knowledge(learner.cfg).util(namespace="team-b").observed
    assert mallory("m", 32, gpu_type, "training")[1] > 0  # its own namespace: used
    assert team_b("m", 32, gpu_type, "training")[1] == 0  # another tenant's: not trusted
    feed("real", 1, 80.0, 10)  # a second namespace confirms the model
    util, samples = team_b("m", 32, gpu_type, "training")
    assert samples > 0 and util > 40.0


def test_a_reviewed_agent_token_reads_its_own_nodes_state_in_full_only(kube_app) -> None:
    _, app = kube_app
    c = app.test_client()

    def state(token: str, query: str = "") -> dict[str, Any]:
        return c.get(f"/v1/state{query}", headers={"Authorization": f"Bearer {token}"}
                     ).get_json()
    assert not state("tok-n1", "?node=n1").get("redacted")
    assert state("tok-n1", "?node=n2").get("redacted") is True  # not its node
    assert state("tok-n1").get("redacted") is True  # the whole cluster: not an agent's
    assert not state(TOKEN).get("redacted")  # the shared token still reads it (plugins)
