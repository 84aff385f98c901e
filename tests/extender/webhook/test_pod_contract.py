"""The pod contract as the docs write it, end to end: the admission webhook's patch applied
to the pod, then the extender's filter and bind. A pod that gives only ``tandem.io/gpu``
(what ``nvidia.com/gpu`` translation gives) or only its memory is placed by the
cold-start rule; messages name a missing field, never Python's ``None``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from extender_builders import A100_MIB, args, binding, make_app, node
from test_webhook import REVIEW, mutated

from contracts.annotations import AnnotationError, parse_inputs
from extender.core.whole_gpu import IDLE_ALLOWANCE_MIB
from extender.webhook.mutate import parse_settings


def admitted(annotations: dict[str, str] | None, defaults: dict[str, str],
             name: str) -> dict[str, Any]:
    """The review's nvidia.com/gpu pod, translated by the webhook, named as the API names it."""
    body = copy.deepcopy(REVIEW)
    meta = body["request"]["object"]["metadata"]
    if annotations is not None:
        meta["annotations"] = annotations
    settings = parse_settings({"translate_nvidia_gpu": True, "default_annotations": defaults})
    _, pod = mutated(body, settings)
    pod["metadata"].update(name=name, uid=f"uid-{name}")
    assert pod["spec"]["schedulerName"] == "tandem"
    return pod


def place(client: Any, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """Filter then bind on the first node that passes; the filter's answer."""
    answer = client.post("/filter", json=args(pod, nodes)).get_json()
    if answer["NodeNames"]:
        bound = client.post("/bind", json=binding(pod, answer["NodeNames"][0])).get_json()
        assert bound == {"Error": ""}
    return answer


@pytest.mark.parametrize(("annotations", "defaults", "util", "mem", "source"), [
    pytest.param(None, {"tandem.io/gpu-mem-mib": "8192"}, "100.00", "8192",
                 "cold-start+mem:asserted", id="docs-webhook-default-memory-only"),
    pytest.param({"tandem.io/gpu-mem-mib": "8192"}, {}, "100.00", "8192",
                 "cold-start+mem:asserted", id="deploy-md-memory-only"),
    pytest.param({"tandem.io/gpu-util": "30"}, {}, "30.00",
                 f"{A100_MIB - IDLE_ALLOWANCE_MIB:.0f}", "asserted+mem:whole-gpu",
                 id="utilisation-only"),
    pytest.param(None, {}, "100.00", f"{A100_MIB - IDLE_ALLOWANCE_MIB:.0f}",
                 "cold-start+mem:whole-gpu", id="no-annotation-at-all"),
])
def test_documented_pods_are_placed_through_the_webhook(
        annotations: dict[str, str] | None, defaults: dict[str, str], util: str, mem: str,
        source: str) -> None:
    app, _, cluster, _ = make_app([node("n1", 2)])
    pod = admitted(annotations, defaults, "train")
    cluster.create_pod(pod)
    assert place(app.test_client(), pod, ["n1"])["NodeNames"] == ["n1"]
    written = cluster.read_pod("ml-team", "train")["metadata"]["annotations"]
    assert written["tandem.io/predicted-gpu-util"] == util
    assert written["tandem.io/predicted-gpu-mem-mib"] == mem
    assert written["tandem.io/prediction-source"] == source


def test_a_pod_stating_no_memory_takes_a_whole_gpu() -> None:
    """Two annotation-free pods never share a GPU; a third waits for one to leave."""
    app, _, cluster, _ = make_app([node("n1", 2)])
    client = app.test_client()
    pods = [admitted(None, {}, f"p{i}") for i in range(3)]
    for pod in pods:
        cluster.create_pod(pod)
    assert [place(client, p, ["n1"])["NodeNames"] for p in pods[:2]] == [["n1"], ["n1"]]
    indices = {cluster.read_pod("ml-team", p["metadata"]["name"])["metadata"]["annotations"]
               ["tandem.io/gpu-index"] for p in pods[:2]}
    assert indices == {"0", "1"}
    refused = place(client, pods[2], ["n1"])
    reasons = {**refused["FailedNodes"], **refused.get("FailedAndUnresolvableNodes", {})}
    assert refused["NodeNames"] == [] and "insufficient free GPU memory" in reasons["n1"]


@pytest.mark.parametrize(("annotations", "field"), [
    ({"tandem.io/workload": "inference"}, "tandem.io/model"),
    ({"tandem.io/workload": "inference", "tandem.io/model": "m", "tandem.io/slo-ms": "5"},
     "tandem.io/rate-rps"),
])
def test_a_missing_field_is_named_not_shown_as_none(annotations: dict[str, str],
                                                   field: str) -> None:
    with pytest.raises(AnnotationError) as err:
        parse_inputs(annotations)
    assert str(err.value).startswith(f"{field}: ") and "None" not in str(err.value)


def test_a_bad_pod_is_refused_with_a_message_without_none() -> None:
    app, _, cluster, _ = make_app([node("n1", 1)])
    pod = admitted({"tandem.io/workload": "inference"}, {}, "serve")
    cluster.create_pod(pod)
    answer = place(app.test_client(), pod, ["n1"])
    assert answer["NodeNames"] == []
    message = answer.get("Error") or " ".join(
        {**answer["FailedNodes"], **answer.get("FailedAndUnresolvableNodes", {})}.values())
    assert "tandem.io/model" in message and "None" not in message


def test_workload_defaults_to_training() -> None:
    assert parse_inputs({}).workload == "training"


def _doc_pod(path: str, after: str) -> dict[str, Any]:
    """The first YAML block after ``after`` in a doc, as the pod it shows."""
    import yaml

    text = (Path(__file__).resolve().parents[3] / path).read_text()
    block = text[text.index(after):].split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)


def test_the_pod_deploy_md_shows_is_placed() -> None:
    pod = _doc_pod("docs/deploy.md", "A pod that tandem places needs only")
    pod["metadata"].update(namespace="default", uid="uid-doc")
    app, _, cluster, _ = make_app([node("n1", 1)])
    cluster.create_pod(pod)
    assert place(app.test_client(), pod, ["n1"])["NodeNames"] == ["n1"]
    written = cluster.read_pod("default", "train")["metadata"]["annotations"]
    assert written["tandem.io/prediction-source"] == "cold-start+mem:asserted"
