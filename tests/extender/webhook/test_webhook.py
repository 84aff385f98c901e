"""The admission webhook against AdmissionReview v1 JSON as the API server sends it: the
JSONPatch it answers, applied to the pod, gives the pod tandem schedules."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from manifests_helpers import MANIFESTS

from extender.webhook.mutate import (
    ReviewError,
    WebhookConfigError,
    WebhookSettings,
    parse_settings,
    review,
)
from extender.webhook.server import make_server

REVIEW = json.loads((Path(__file__).parents[2] / "data/extender/admission_review_pod.json")
                    .read_text())
TRANSLATE = parse_settings({"translate_nvidia_gpu": True,
                            "default_annotations": {"tandem.io/gpu-mem-mib": "8192"}})


def apply_patch(doc: Any, patch: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/replace on a copy (the only operations the webhook emits)."""
    doc = copy.deepcopy(doc)
    for op in patch:
        assert op["op"] in ("add", "replace"), op
        *parents, last = [t.replace("~1", "/").replace("~0", "~")
                          for t in op["path"].split("/")[1:]]
        node = doc
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        if isinstance(node, list) and last == "-":
            assert op["op"] == "add"
            node.append(op["value"])
        elif isinstance(node, list):
            node[int(last)] = op["value"]
        else:
            assert op["op"] == "add" or last in node, f"replace of a missing {op['path']}"
            node[last] = op["value"]
    return doc


def mutated(body: dict[str, Any], settings: WebhookSettings) -> tuple[dict[str, Any], Any]:
    answer = review(body, settings)
    response = answer["response"]
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert response["uid"] == body["request"]["uid"] and response["allowed"] is True
    if "patch" not in response:
        return response, body["request"]["object"]
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    return response, apply_patch(body["request"]["object"], patch)


def test_opted_in_translation_moves_the_gpu_to_tandem() -> None:
    _, pod = mutated(REVIEW, TRANSLATE)
    trainer, logger = pod["spec"]["containers"]
    assert trainer["resources"] == {
        "limits": {"cpu": "4", "memory": "16Gi", "tandem.io/gpu": "1"},
        "requests": {"cpu": "4", "memory": "16Gi", "tandem.io/gpu": "1"}}
    assert logger["resources"] == {"requests": {"cpu": "100m"}}  # untouched
    assert pod["spec"]["schedulerName"] == "tandem"
    assert pod["metadata"]["annotations"] == {"tandem.io/gpu-mem-mib": "8192"}


def test_an_init_containers_gpu_is_translated_where_it_is() -> None:
    """The patch names the init container's own path (the kubelet admits it first)."""
    body = copy.deepcopy(REVIEW)
    pod = body["request"]["object"]
    pod["spec"]["initContainers"] = [{"name": "warm", "resources": {}},
                                     {"name": "load", "resources": {"limits": {
                                         "nvidia.com/gpu": "1"}}}]
    pod["spec"]["containers"] = [c for c in pod["spec"]["containers"] if c["name"] == "logger"]
    _, out = mutated(body, TRANSLATE)
    assert [c["resources"] for c in out["spec"]["initContainers"]] == [
        {}, {"limits": {"tandem.io/gpu": "1"}}]
    assert out["spec"]["containers"] == pod["spec"]["containers"]  # untouched
    assert out["spec"]["schedulerName"] == "tandem"


def test_without_opt_in_an_nvidia_pod_is_left_alone() -> None:
    response, pod = mutated(REVIEW, parse_settings({}))
    assert "patch" not in response and pod == REVIEW["request"]["object"]


def test_translation_only_in_the_namespaces_named() -> None:
    elsewhere = parse_settings({"translate_nvidia_gpu": True, "translate_namespaces": ["other"]})
    assert "patch" not in mutated(REVIEW, elsewhere)[0]
    here = parse_settings({"translate_nvidia_gpu": True, "translate_namespaces": ["ml-team"]})
    assert mutated(REVIEW, here)[1]["spec"]["schedulerName"] == "tandem"


def tandem_review(annotations: dict[str, str] | None, scheduler: str = "default-scheduler",
                  ) -> dict[str, Any]:
    body = copy.deepcopy(REVIEW)
    pod = body["request"]["object"]
    pod["spec"]["schedulerName"] = scheduler
    pod["spec"]["containers"][0]["resources"] = {"limits": {"tandem.io/gpu": "1"}}
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    return body


def test_defaults_fill_only_what_the_pod_does_not_set() -> None:
    settings = parse_settings({"default_annotations": {"tandem.io/gpu-mem-mib": "8192",
                                                      "tandem.io/gpu-util": "40"}})
    _, pod = mutated(tandem_review({"tandem.io/gpu-util": "75", "team": "a/b"}), settings)
    assert pod["metadata"]["annotations"] == {"tandem.io/gpu-util": "75", "team": "a/b",
                                              "tandem.io/gpu-mem-mib": "8192"}
    assert pod["spec"]["schedulerName"] == "tandem"


TOLERATE = {"key": "tandem.io/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_tolerations_for_the_tandem_pool_are_added_once() -> None:
    settings = parse_settings({"translate_nvidia_gpu": True, "tolerations": [TOLERATE]})
    _, pod = mutated(REVIEW, settings)  # the review's pod has one toleration already
    assert pod["spec"]["tolerations"] == [REVIEW["request"]["object"]["spec"]["tolerations"][0],
                                          TOLERATE]
    again = copy.deepcopy(REVIEW)
    again["request"]["object"]["spec"]["tolerations"].append(TOLERATE)
    _, pod = mutated(again, settings)
    assert pod["spec"]["tolerations"].count(TOLERATE) == 1
    bare = copy.deepcopy(REVIEW)
    del bare["request"]["object"]["spec"]["tolerations"]
    assert mutated(bare, settings)[1]["spec"]["tolerations"] == [TOLERATE]
    # a pod that stays with its own scheduler gets none
    assert "tolerations" not in mutated(bare, parse_settings({"tolerations": [TOLERATE]}))[1][
        "spec"]


def test_a_pod_of_another_scheduler_is_not_touched() -> None:
    response, _ = mutated(tandem_review(None, scheduler="volcano"), TRANSLATE)
    assert "patch" not in response
    response, pod = mutated(tandem_review(None, scheduler="tandem"), TRANSLATE)
    assert pod["spec"]["schedulerName"] == "tandem"  # its own name: only the defaults
    assert pod["metadata"]["annotations"] == {"tandem.io/gpu-mem-mib": "8192"}


def test_a_pod_without_gpus_is_not_touched() -> None:
    body = copy.deepcopy(REVIEW)
    body["request"]["object"]["spec"]["containers"][0]["resources"] = {}
    assert "patch" not in mutated(body, TRANSLATE)[0]


def test_updates_and_other_kinds_pass_unchanged() -> None:
    update = copy.deepcopy(REVIEW)
    update["request"]["operation"] = "UPDATE"
    assert "patch" not in mutated(update, TRANSLATE)[0]
    other = copy.deepcopy(REVIEW)
    other["request"]["kind"] = {"group": "batch", "version": "v1", "kind": "Job"}
    assert "patch" not in mutated(other, TRANSLATE)[0]


@pytest.mark.parametrize("body", [
    {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1", "request": {}},
    {"kind": "Pod"}, [], {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"},
])
def test_malformed_reviews_are_refused(body: Any) -> None:
    with pytest.raises(ReviewError):
        review(body, TRANSLATE)


def test_numbers_in_defaults_become_annotation_text() -> None:
    settings = parse_settings({"default_annotations": {"tandem.io/gpu-mem-mib": 8192,
                                                      "tandem.io/gpu-util": 37.5}})
    assert settings.default_annotations == {"tandem.io/gpu-mem-mib": "8192",
                                            "tandem.io/gpu-util": "37.5"}


@pytest.mark.parametrize(("raw", "problem"), [
    ({"default_annotations": {"tandem.io/gpu-index": "0"}}, "not an input annotation"),
    ({"default_annotations": {"tandem.io/gpu-util": True}}, "must be a string or a number"),
    ({"default_annotations": {"tandem.io/gpu-util": "400"}}, "tandem.io/gpu-util"),
    ({"translate_nvidia_gpu": "yes"}, "true or false"),
    ({"schedulerName": "x"}, "unknown key"),
    ({"tolerations": [{"key": "a", "tolerationSecond": 1}]}, "unknown keys"),
    ({"tolerations": {"key": "a"}}, "must be a list"),
])
def test_bad_settings_name_the_problem(raw: dict[str, Any], problem: str) -> None:
    with pytest.raises(WebhookConfigError, match=problem):
        parse_settings(raw)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, ssl.SSLContext]]:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to generate a throwaway certificate")
    subprocess.run(["sh", str(MANIFESTS / "tls/generate-certs.sh"), str(tmp_path)],
                   check=True, capture_output=True, timeout=60)
    server = make_server(TRANSLATE, "127.0.0.1", 0, str(tmp_path / "tls.crt"),
                         str(tmp_path / "tls.key"))
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server.bind_addr[1], ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    server.stop()
    thread.join(5)


def test_the_certificate_names_the_webhook_service(served: tuple[int, ssl.SSLContext]) -> None:
    port, context = served
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="tandem-webhook.tandem-system.svc"):
        pass  # the handshake verified the name the API server calls


def post(port: int, context: ssl.SSLContext, body: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    conn.request("POST", "/mutate", body, {"Content-Type": "application/json"})
    try:
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_served_over_tls_and_survives_bad_input(served: tuple[int, ssl.SSLContext]) -> None:
    port, context = served
    status, answer = post(port, context, json.dumps(REVIEW).encode())
    assert status == 200 and answer["response"]["patchType"] == "JSONPatch"
    assert post(port, context, b"{not json")[0] == 400
    assert post(port, context, b'{"kind": "AdmissionReview"}')[0] == 400
    odd = {**REVIEW, "request": {**REVIEW["request"], "object": "not a pod"}}
    status, answer = post(port, context, json.dumps(odd).encode())
    assert status == 200 and "patch" not in answer["response"]
    status, answer = post(port, context, json.dumps(REVIEW).encode())  # still serving
    assert status == 200 and answer["response"]["allowed"] is True



KEYS = st.sampled_from(["spec", "containers", "initContainers", "resources", "limits",
                        "requests", "nvidia.com/gpu", "tandem.io/gpu", "schedulerName",
                        "metadata", "annotations", "x"])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(pod=JSON)
def test_any_pod_shape_is_answered_or_refused_cleanly(pod: Any) -> None:
    body = copy.deepcopy(REVIEW)
    body["request"]["object"] = pod
    try:
        answer = review(body, TRANSLATE)
    except ReviewError:
        return  # a 400 with the reason
    response = answer["response"]
    assert response["allowed"] is True and response["uid"] == REVIEW["request"]["uid"]
    if "patch" in response:
        json.loads(base64.b64decode(response["patch"]))
