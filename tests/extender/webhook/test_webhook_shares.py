"""The admission webhook's translation of declared GPU shares (gpushare, HAMi, gpu-milli)
into tandem's annotations, its clear refusals, and the routing of pods of no GPU."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.annotations import GPU_MEM_MIB, GPU_RESOURCE, GPU_UTIL, parse_inputs
from extender.core import parse_demand
from extender.webhook.mutate import WebhookConfigError, parse_settings, review

REVIEW = json.loads((Path(__file__).parents[2] / "data/extender/admission_review_pod.json")
                    .read_text())
ALL = parse_settings({"translate_gpushare": True, "translate_hami": True,
                      "translate_gpu_milli": True, "gpu_milli_memory_mib": 81920})


def body_with(resources: Any = None, annotations: dict | None = None,
              namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(REVIEW)
    pod = body["request"]["object"]
    pod["spec"]["containers"][0]["resources"] = resources if resources is not None else {}
    pod["spec"].update(spec)
    pod["metadata"]["annotations"] = dict(annotations or {})
    body["request"]["namespace"] = namespace
    return body


def apply(body: dict[str, Any], settings_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    response = review(body, settings_)["response"]
    pod = copy.deepcopy(body["request"]["object"])
    for op in json.loads(base64.b64decode(response["patch"])) if "patch" in response else []:
        *parents, last = [t.replace("~1", "/") for t in op["path"].split("/")[1:]]
        node = pod
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        node[int(last) if isinstance(node, list) else last] = op["value"]
    return response, pod


def test_gpushare_memory_becomes_one_gpu_with_that_memory():
    _, pod = apply(body_with({"limits": {"aliyun.com/gpu-mem": "3", "cpu": "2"}}), ALL)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "2", GPU_RESOURCE: "1"}
    assert pod["metadata"]["annotations"][GPU_MEM_MIB] == str(3 * 1024)
    assert pod["spec"]["schedulerName"] == "tandem"
    job = parse_demand(pod)  # what the extender reads of it
    assert job.gpu_count == 1 and job.inputs.mem_mib == 3072 and job.inputs.util_percent is None


def test_gpushare_in_mib():
    mib = parse_settings({"translate_gpushare": True, "gpushare_memory_unit": "MiB"})
    _, pod = apply(body_with({"limits": {"aliyun.com/gpu-mem": "3000"}}), mib)
    assert pod["metadata"]["annotations"][GPU_MEM_MIB] == "3000"


def test_hami_memory_and_cores_are_hard_shares_on_each_gpu():
    _, pod = apply(body_with({"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10240",
                                         "nvidia.com/gpucores": "30"}}), ALL)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {GPU_RESOURCE: "2"}
    inputs = parse_inputs(pod["metadata"]["annotations"])
    assert (inputs.mem_mib, inputs.util_percent) == (10240, 30)
    assert parse_demand(pod).gpu_count == 2


def test_hami_memory_alone_leaves_utilisation_to_prediction():
    _, pod = apply(body_with({"limits": {"nvidia.com/gpumem": "4096"}}), ALL)
    assert pod["metadata"]["annotations"] == {GPU_MEM_MIB: "4096"}
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {GPU_RESOURCE: "1"}


def test_gpu_milli_annotation_is_a_share_of_one_gpu():
    _, pod = apply(body_with({"requests": {"cpu": "4"}},
                             {"alibabacloud.com/gpu-milli": "250"}), ALL)
    annotations = pod["metadata"]["annotations"]
    assert (annotations[GPU_UTIL], annotations[GPU_MEM_MIB]) == ("25", str(81920 // 4))
    assert pod["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "4"}, "limits": {GPU_RESOURCE: "1"}}


def test_each_source_is_off_by_default():
    plain = parse_settings({})
    for resources, declared in (({"limits": {"aliyun.com/gpu-mem": "3"}}, {}),
                                ({"limits": {"nvidia.com/gpumem": "3"}}, {}),
                                ({}, {"alibabacloud.com/gpu-milli": "250"})):
        response, pod = apply(body_with(resources, declared), plain)
        assert "patch" not in response and response["allowed"] is True


@pytest.mark.parametrize(("resources", "annotations", "problem"), [
    ({"limits": {"aliyun.com/gpu-mem": "-1"}}, {}, "aliyun.com/gpu-mem"),
    ({"limits": {"aliyun.com/gpu-mem": "1.5"}}, {}, "aliyun.com/gpu-mem"),
    ({"limits": {"nvidia.com/gpucores": "150"}}, {}, "nvidia.com/gpucores"),
    ({"limits": {"nvidia.com/gpumem": "lots"}}, {}, "nvidia.com/gpumem"),
    ({}, {"alibabacloud.com/gpu-milli": "1500"}, "alibabacloud.com/gpu-milli"),
    ({}, {"alibabacloud.com/gpu-milli": "0"}, "alibabacloud.com/gpu-milli"),
    ({"limits": {"aliyun.com/gpu-mem": "2"}}, {GPU_MEM_MIB: "100"}, "give one of them"),
    ({"limits": {"aliyun.com/gpu-mem": "2"}}, {"alibabacloud.com/gpu-milli": "100"},
     "give one of them"),
])
def test_bad_declared_shares_are_refused_with_the_reason(resources, annotations, problem):
    response = review(body_with(resources, annotations), ALL)["response"]
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert problem in response["status"]["message"] and "patch" not in response


def test_a_share_on_two_containers_is_refused():
    body = body_with({"limits": {"aliyun.com/gpu-mem": "2"}})
    pod = body["request"]["object"]
    pod["spec"]["containers"].append({"name": "side", "resources": {
        "limits": {"aliyun.com/gpu-mem": "1"}}})
    response = review(body, ALL)["response"]
    assert response["allowed"] is False and "more than one container" in \
        response["status"]["message"]


@pytest.mark.parametrize(("raw", "problem"), [
    ({"translate_gpu_milli": True}, "gpu_milli_memory_mib: required"),
    ({"translate_hami": "yes"}, "translate_hami: must be true or false"),
    ({"gpushare_memory_unit": "GB"}, "gpushare_memory_unit"),
    ({"gpu_milli_memory_mib": -5}, "gpu_milli_memory_mib: must be a positive integer"),
    ({"route_namespaces": "web"}, "route_namespaces"),
    ({"route_node_label": 3}, "route_node_label"),
])
def test_bad_share_and_route_settings_name_the_problem(raw, problem):
    with pytest.raises(WebhookConfigError) as err:
        parse_settings(raw)
    assert any(problem in p for p in err.value.problems)


def test_pods_of_no_gpu_are_routed_where_the_admin_says():
    route = parse_settings({"route_namespaces": ["web"],
                            "route_node_label": "nvidia.com/gpu.present"})
    _, pod = apply(body_with({"requests": {"cpu": "1"}}, namespace="web"), route)
    assert pod["spec"]["schedulerName"] == "tandem"
    assert "tandem.io/gpu" not in json.dumps(pod["spec"])  # still a pod of no GPU
    selector = {"nodeSelector": {"nvidia.com/gpu.present": "true"}}
    _, pod = apply(body_with({"requests": {"cpu": "1"}}, **selector), route)
    assert pod["spec"]["schedulerName"] == "tandem"
    affinity = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.present", "operator": "Exists"}]}]}}}}
    _, pod = apply(body_with({"requests": {"cpu": "1"}}, **affinity), route)
    assert pod["spec"]["schedulerName"] == "tandem"
    response, pod = apply(body_with({"requests": {"cpu": "1"}}, namespace="other"), route)
    assert "patch" not in response  # elsewhere kube-scheduler's default profile keeps it
    other = body_with({"requests": {"cpu": "1"}}, namespace="web", schedulerName="volcano")
    assert "patch" not in review(other, route)["response"]


KEYS = st.sampled_from(["spec", "containers", "resources", "limits", "requests", "metadata",
                        "annotations", "aliyun.com/gpu-mem", "nvidia.com/gpumem",
                        "nvidia.com/gpucores", "alibabacloud.com/gpu-milli", "affinity",
                        "nodeSelector", "nvidia.com/gpu", "name"])
JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5000) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(KEYS, inner, max_size=4), max_leaves=14)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(spec=JSON, annotations=JSON)
def test_any_declared_share_is_translated_or_refused_cleanly(spec, annotations):
    body = copy.deepcopy(REVIEW)
    pod = body["request"]["object"]
    if isinstance(spec, dict):
        pod["spec"] = spec
    pod["metadata"]["annotations"] = annotations
    route = parse_settings({"translate_gpushare": True, "translate_hami": True,
                            "translate_gpu_milli": True, "gpu_milli_memory_mib": 1000,
                            "route_node_label": "name"})
    try:
        response = review(body, route)["response"]
    except ValueError:
        return  # a malformed review: 400 with the reason (ReviewError)
    assert response["allowed"] in (True, False)
    if not response["allowed"]:
        assert response["status"]["message"].startswith("tandem: ")
