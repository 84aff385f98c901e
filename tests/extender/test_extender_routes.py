"""HTTP protocol tests through Flask's test client: every verb, both node-cache modes,
the error paths of the behaviour matrix, and bad input."""

from __future__ import annotations

import json

import pytest
from extender_builders import (
    AGENT_AUTH,
    TOKEN,
    args,
    args_nodes,
    binding,
    inference,
    make_app,
    node,
    pod,
    training,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.cluster.sim import SimSource


@pytest.fixture
def env():
    app, ext, source, clock = make_app()
    return app.test_client(), ext, source, clock


def state_of(client):
    return client.get("/v1/state", headers=AGENT_AUTH).get_json()


def test_filter_node_names_mode(env):
    client, *_ = env
    r = client.post("/filter", json=args(training(mem=30000), ["n1", "n2", "ghost"]))
    body = r.get_json()
    assert r.status_code == 200 and body["NodeNames"] == ["n1", "n2"]
    assert "Nodes" not in body and body["Error"] == ""
    assert "unknown node" in body["FailedAndUnresolvableNodes"]["ghost"]


def test_filter_nodes_mode_returns_node_list(env):
    client, *_ = env
    body = client.post("/filter", json=args_nodes(training(), ["n2", "ghost"])).get_json()
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["n2"]
    assert "NodeNames" not in body


def test_filter_empty_answer_is_a_list(env):
    client, *_ = env
    body = client.post("/filter", json=args(training(mem=99999), ["n1"])).get_json()
    assert body["NodeNames"] == [] and "n1" in body["FailedAndUnresolvableNodes"]


def test_filter_resolvable_rejection_is_unresolvable_to_the_scheduler():
    """kube-scheduler's preemption cannot see tandem.io/gpu, so no rejection may invite it
    (tandem preempts itself, extender.preemption): FailedNodes stays empty."""
    app, ext, source, _ = make_app([node("n1", 1)])
    client = app.test_client()
    first = training("a", mem=30000)
    source.create_pod(first)
    assert client.post("/filter", json=args(first, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert client.post("/bind", json=binding(first, "n1")).get_json() == {"Error": ""}
    body = client.post("/filter", json=args(training("b", mem=30000), ["n1"])).get_json()
    assert body["NodeNames"] == [] and body["FailedNodes"] == {}
    assert "insufficient free GPU memory" in body["FailedAndUnresolvableNodes"]["n1"]


@pytest.mark.parametrize("mode", [args, args_nodes], ids=["node-names", "nodes"])
def test_prioritize_integer_scores_both_modes(env, mode):
    client, ext, source, _ = env
    busy = training("busy", util=90, mem=30000, gpus=4)
    source.create_pod(busy)
    client.post("/filter", json=args(busy, ["n1"]))
    client.post("/bind", json=binding(busy, "n1"))
    r = client.post("/prioritize", json=mode(training(util=50), ["n1", "n2"]))
    raw = r.get_data(as_text=True)
    assert r.status_code == 200 and '"Score":10' in raw and ".0" not in raw
    scores = {h["Host"]: h["Score"] for h in r.get_json()}
    assert scores["n2"] > scores["n1"] and all(isinstance(s, int) for s in scores.values())


def test_bind_writes_annotations_and_reserves(env):
    client, ext, source, _ = env
    p = training("job", util=30, mem=5000, gpus=2)
    source.create_pod(p)
    assert client.post("/bind", json=binding(p, "n2")).get_json() == {"Error": ""}
    ann = source.read_pod("default", "job")["metadata"]["annotations"]
    assert ann["tandem.io/gpu-index"] == "0,1"
    assert ann["tandem.io/gpu-uuid"] == "GPU-n2-0,GPU-n2-1"
    assert ann["tandem.io/predicted-gpu-util"] == "30.00"
    assert float(ann["tandem.io/cost"]) > 0
    gpus = state_of(client)["nodes"]["n2"]["gpus"]
    assert [g["reserved_mib"] for g in gpus[:2]] == [5000, 5000]
    # a retried bind of the same pod is idempotent, not a double booking
    assert client.post("/bind", json=binding(p, "n2")).get_json() == {"Error": ""}
    assert state_of(client)["placed"] == 1
    # but binding it elsewhere is an error
    assert "already bound" in client.post("/bind", json=binding(p, "n1")).get_json()["Error"]


def test_bind_inference_records_batch_and_duty_cycle(env):
    client, ext, source, _ = env
    p = inference("serve", rate=300)
    source.create_pod(p)
    assert client.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert client.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    ann = source.read_pod("default", "serve")["metadata"]["annotations"]
    assert int(ann["tandem.io/batch"]) >= 1 and float(ann["tandem.io/duty-cycle-ms"]) > 0


@pytest.mark.parametrize(("make_body", "expected"), [
    (lambda p: binding(p, "ghost"), "ghost"),
    (lambda p: {**binding(p, "n1"), "PodName": "missing", "PodUID": "other"},
     "not in the simulated cluster"),
], ids=["unknown-node", "unknown-pod"])
def test_bind_logical_failures_are_200_with_error(env, make_body, expected):
    client, ext, source, _ = env
    p = training("bindme")
    source.create_pod(p)
    before = state_of(client)
    r = client.post("/bind", json=make_body(p))
    assert r.status_code == 200 and expected in r.get_json()["Error"]
    assert state_of(client) == before


def test_bind_refuses_recreated_pod_with_other_uid(env):
    client, ext, source, _ = env
    p = training("same-name", uid="old-uid")
    source.create_pod(training("same-name", uid="new-uid"))
    r = client.post("/bind", json=binding(p, "n1")).get_json()
    assert "recreated" in r["Error"]


def test_bind_with_a_known_uid_under_another_name_creates_and_binds_nothing(env):
    """A bind naming another pod than the one filter saw with that UID is refused: bind
    reads the pod from the cluster (here the simulated registry), which has no such pod."""
    client, ext, source, _ = env
    p = training("real", uid="uid-1")
    source.create_pod(p)
    assert client.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    forged = training("forged", uid="uid-1")
    r = client.post("/bind", json=binding(forged, "n1")).get_json()
    assert r["Error"].startswith("pod default/forged is not in the simulated cluster"), r
    assert source.read_pod("default", "forged") is None
    assert ext.state.placement_of("uid-1") is None
    assert client.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}


def test_bind_refused_when_not_leader():
    app, *_ = make_app(may_bind=lambda: False)
    r = app.test_client().post("/bind", json=binding(training(), "n1")).get_json()
    assert "not the leader" in r["Error"]


def test_not_synced_filter_error_prioritize_zero_readyz_503():
    app, ext, source, _ = make_app(start_source=False)
    client = app.test_client()
    body = client.post("/filter", json=args(training(), ["n1"])).get_json()
    assert "not synced" in body["Error"] and body["NodeNames"] == []
    assert client.post("/prioritize", json=args(training(), ["n1"])).get_json() == [
        {"Host": "n1", "Score": 0}]
    assert client.get("/readyz").status_code == 503
    assert client.get("/livez").status_code == 200
    source.start(ext.state)
    assert client.get("/readyz").status_code == 200


def test_readyz_consults_readiness_callables():
    flag = {"ok": False}
    app, *_ = make_app(readiness=[lambda: flag["ok"]])
    client = app.test_client()
    assert client.get("/readyz").status_code == 503
    flag["ok"] = True
    assert client.get("/readyz").status_code == 200


def test_bad_annotation_gives_unresolvable_reason_and_no_state_change(env):
    client, *_ = env
    before = state_of(client)
    body = client.post("/filter", json=args(pod("typo", 1, gpu_util="lots", gpu_mem_mib="1"),
                                            ["n1", "n2"])).get_json()
    assert body["NodeNames"] == []
    assert all("tandem.io/gpu-util" in m for m in body["FailedAndUnresolvableNodes"].values())
    assert state_of(client) == before


@pytest.mark.parametrize(("path", "data", "status"), [
    ("/filter", b"{not json", 400),
    ("/filter", b"\xff\xfe", 400),
    ("/filter", b"[]", 400),
    ("/filter", json.dumps({"Pod": "x", "NodeNames": []}).encode(), 400),
    ("/filter", json.dumps({"Pod": {"metadata": {}}, "NodeNames": [1]}).encode(), 400),
    ("/filter", json.dumps({"Pod": {"metadata": {"name": "a"}}}).encode(), 400),
    ("/prioritize", json.dumps({"NodeNames": ["n1"]}).encode(), 400),
    ("/bind", json.dumps({"PodName": "a"}).encode(), 400),
    ("/bind", json.dumps({"PodName": 1, "PodNamespace": "d", "PodUID": "u",
                          "Node": "n"}).encode(), 400),
    ("/preempt", json.dumps({"Pod": {"metadata": {}}, "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": 5}]}}}).encode(), 400),
], ids=["malformed", "not-utf8", "array", "pod-string", "names-ints", "no-nodes",
        "prioritize-no-pod", "bind-missing", "bind-wrong-type", "preempt-bad-uid"])
def test_undecodable_bodies_are_400_never_500(env, path, data, status):
    client, *_ = env
    before = state_of(client)
    r = client.post(path, data=data, content_type="application/json")
    assert r.status_code == status and r.get_json()["Error"]
    assert state_of(client) == before


def test_oversize_body_is_413():
    app, *_ = make_app(raw_config={"server": {"max_body_bytes": 2048}})
    client = app.test_client()
    big = args(training(), [f"node-{i:05d}" for i in range(500)])
    assert client.post("/filter", json=big).status_code == 413
    assert client.post("/filter", json=args(training(), ["n1"])).status_code == 200


def test_unknown_verb_404_and_wrong_method_405(env):
    client, *_ = env
    assert client.post("/frobnicate", json={}).status_code == 404
    assert client.get("/filter").status_code == 405


def test_case_insensitive_request_keys(env):
    client, *_ = env
    body = client.post("/filter", json={"pod": training(), "nodenames": ["n1"]}).get_json()
    assert body["NodeNames"] == ["n1"]


def test_preempt_keeps_nodes_where_victims_free_enough(env):
    client, ext, source, _ = env
    victims = []
    for i in range(4):
        v = training(f"v{i}", mem=35000)
        source.create_pod(v)
        client.post("/bind", json=binding(v, "n1"))
        victims.append(v["metadata"]["uid"])
    incoming = training("big", mem=30000)
    body = {"Pod": incoming, "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": victims[0]}], "NumPDBViolations": 0},
        "n2": {"Pods": [], "NumPDBViolations": 0}}}
    result = client.post("/preempt", json=body).get_json()
    assert result == {"NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": victims[0]}], "NumPDBViolations": 0},
        "n2": {"Pods": [], "NumPDBViolations": 0}}}
    body["NodeNameToMetaVictims"]["n1"]["Pods"] = []  # evicting nothing frees nothing
    assert "n1" not in client.post("/preempt", json=body).get_json()["NodeNameToMetaVictims"]


def test_preempt_full_victims_form_answers_meta_victims(env):
    client, *_ = env
    body = {"Pod": training(), "NodeNameToVictims": {"n2": {"Pods": [
        {"metadata": {"name": "x", "uid": "ux"}}], "NumPDBViolations": 1}}}
    result = client.post("/preempt", json=body).get_json()
    assert result["NodeNameToMetaVictims"]["n2"]["Pods"] == [{"UID": "ux"}]


def report(node_name="n1", util=75.0, used=1000, token=TOKEN):
    return {"node": node_name, "timestamp": 1.0, "interval_seconds": 1.0,
            "gpus": [{"index": i, "uuid": f"GPU-real-{i}", "product": "NVIDIA A100-SXM4-40GB",
                      "memory_total_mib": 40960, "memory_used_mib": used,
                      "utilization_percent": util, "processes": []} for i in range(4)]}


@pytest.mark.parametrize(("header", "status"), [
    (None, 401), ("Bearer wrong", 401), (f"Basic {TOKEN}", 401), (f"Bearer {TOKEN}", 200)],
    ids=["missing", "wrong", "basic", "good"])
def test_agent_report_auth(env, header, status):
    client, *_ = env
    headers = {"Authorization": header} if header else {}
    r = client.post("/v1/agents/report", json=report(), headers=headers)
    assert r.status_code == status
    assert TOKEN not in r.get_data(as_text=True)


def test_agent_report_updates_observed_load_and_inventory(env):
    client, ext, source, clock = env
    ok = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/v1/agents/report", json=report(), headers=ok).status_code == 200
    gpus = state_of(client)["nodes"]["n1"]["gpus"]
    assert gpus[0]["observed_util"] == 75.0 and gpus[0]["uuid"] == "GPU-real-0"
    clock.now += 60  # stale: ignored again
    assert state_of(client)["nodes"]["n1"]["gpus"][0]["observed_util"] is None
    bad = report(util=250)
    r = client.post("/v1/agents/report", json=bad, headers=ok)
    assert r.status_code == 400 and "utilization_percent" in r.get_json()["Error"]


def test_metrics_exposes_verbs_decisions_and_gpus(env):
    client, ext, source, _ = env
    client.post("/filter", json=args(training(mem=99999), ["n1"]))
    text = client.get("/metrics").get_data(as_text=True)
    assert 'tandem_extender_requests_total{code="200",verb="filter"} 1.0' in text
    assert "tandem_extender_request_duration_seconds_bucket" in text
    assert 'reason="GpuMemoryTooSmall"' in text
    assert "tandem_gpu_predicted_utilization_ratio{" in text


def test_config_hot_reload_swaps_weights(tmp_path):
    from extender.config.loader import ConfigHolder, load_config
    from extender.wiring import create_app

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("limits: {max_pods_per_gpu: 1}\n")
    holder = ConfigHolder(load_config(cfg_file, {}), loader=lambda: load_config(cfg_file, {}))
    source = SimSource([node("n1", 1)])
    client = create_app(holder, source).test_client()
    first = training("a", mem=10)
    source.create_pod(first)
    client.post("/bind", json=binding(first, "n1"))
    assert client.post("/filter", json=args(training("b", mem=10), ["n1"])).get_json()[
        "NodeNames"] == []
    cfg_file.write_text("limits: {max_pods_per_gpu: oops}\n")
    import os
    os.utime(cfg_file, ns=(1, 1))
    assert holder.reload_if_changed() == ["limits.max_pods_per_gpu: must be int, got str"]
    cfg_file.write_text("limits: {max_pods_per_gpu: 4}\n")
    os.utime(cfg_file, ns=(2, 2))
    assert holder.reload_if_changed() == []
    assert client.post("/filter", json=args(training("b", mem=10), ["n1"])).get_json()[
        "NodeNames"] == ["n1"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                      children, max_size=4),
    max_leaves=12)
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"Pod": json_values, "NodeNames": json_values}),
    st.fixed_dictionaries({"Pod": st.fixed_dictionaries({
        "metadata": st.fixed_dictionaries({"name": st.text(min_size=1, max_size=5),
                                           "annotations": st.dictionaries(
                                               st.sampled_from(["tandem.io/gpu-util",
                                                                "tandem.io/gpu-mem-mib",
                                                                "tandem.io/workload",
                                                                "tandem.io/model"]),
                                               json_values, max_size=4)}),
        "spec": json_values}), "NodeNames": st.lists(st.text(max_size=4), max_size=4)}),
    st.fixed_dictionaries({"PodName": json_values, "PodNamespace": json_values,
                           "PodUID": json_values, "Node": json_values}))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(verb=st.sampled_from(["filter", "prioritize", "bind", "preempt"]), body=bodies)
def test_property_any_body_gets_200_or_400_and_state_survives(verb, body):
    app, ext, source, _ = _shared_app()
    client = app.test_client()
    before = client.get("/v1/state", headers=AGENT_AUTH).get_json()
    r = client.post(f"/{verb}", data=json.dumps(body), content_type="application/json")
    assert r.status_code in (200, 400)
    doc = r.get_json()
    if verb == "prioritize" and r.status_code == 200:
        assert all(isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in doc)
    elif r.status_code == 200 and verb == "filter":
        assert isinstance(doc["NodeNames"], list)
    assert "internal error" not in json.dumps(doc)
    if verb != "bind" or doc.get("Error"):
        assert client.get("/v1/state", headers=AGENT_AUTH).get_json() == before


_SHARED = {}


def _shared_app():
    if "app" not in _SHARED:
        _SHARED["app"] = make_app()
    return _SHARED["app"]


def test_report_with_repeated_or_empty_uuids_is_refused():
    from extender.errors import BadRequest
    from extender.state.reports import decode_report

    gpu = {"index": 0, "uuid": "GPU-A", "product": "A100", "memory_total_mib": 40960,
           "memory_used_mib": 0, "utilization_percent": 0}
    with pytest.raises(BadRequest, match="UUIDs repeat"):
        decode_report({"node": "n1", "gpus": [gpu, {**gpu, "index": 1}]})
    with pytest.raises(BadRequest, match="non-empty"):
        decode_report({"node": "n1", "gpus": [{**gpu, "uuid": ""}]})
