"""The ``/v1/state`` document: one codec, bounded, who may read what, per-node reading."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from extender_builders import AGENT_AUTH, make_app, node

from agent.errors import StateError
from agent.node.extender_view import StateClient, parse_node_view
from contracts.state import (
    MAX_ANNOTATION_CHARS,
    StateDocument,
    StateGpu,
    StateNode,
    StatePod,
    decode_state,
    encode_state,
)
from extender.cluster.sim import SimSource

PAD = "x" * (250 << 10)


def bound_pod(i: int, node_name: str, **extra: str) -> dict[str, Any]:
    """A pod bound on ``node_name`` GPU ``i % 4`` as bind records it, plus ``extra``."""
    ann = {"tandem.io/workload": "inference", "tandem.io/model": "resnet50",
           "tandem.io/gpu-index": str(i % 4), "tandem.io/predicted-gpu-util": "1.00",
           "tandem.io/predicted-gpu-mem-mib": "100", **extra}
    return {"metadata": {"name": f"p{i}", "namespace": "owner", "uid": f"uid-{i}",
                         "annotations": ann},
            "spec": {"nodeName": node_name}, "status": {"phase": "Running"}}


def padded_cluster() -> SimSource:
    """One owner's 68 pods on n2, each padded to ~256 KiB of ``tandem.io/*`` annotations
    (17 MiB of /v1/state when repeated whole); one honest pod on n1."""
    pods = [bound_pod(i, "n2", **{"tandem.io/padding": PAD, "tandem.io/model": "m" * 5000})
            for i in range(68)]
    return SimSource([node("n1", 4), node("n2", 4)], [*pods, bound_pod(99, "n1")])


def test_codec_round_trips_the_typed_value() -> None:
    pod = StatePod("assumed", "inference", 12.5, 2048.0, "ns/a", "uid-a",
                   (("tandem.io/model", "m.onnx"),), 2, "main")
    doc = StateDocument((StateNode("n1", (StateGpu(0, "GPU-0", "A100", 40960.0, 2048.0, 12.5,
                                                   30.0, 1000.0, 5.0, (pod,)),)),),
                        True, 0, 1, {"alone": []}, 3)
    assert decode_state(json.loads(json.dumps(encode_state(doc)))) == doc


def test_pod_owner_padding_cannot_grow_the_document() -> None:
    app, *_ = make_app(source=padded_cluster())
    body = app.test_client().get("/v1/state", headers=AGENT_AUTH).get_data()
    assert len(body) < 1 << 20  # 17.4 MiB when every tandem.io/* annotation was repeated
    doc = decode_state(json.loads(body))
    (entry, *_) = doc.node("n2").gpus[0].pods
    assert entry.annotation("tandem.io/padding") is None
    assert entry.annotation("tandem.io/model") is None  # over MAX_ANNOTATION_CHARS
    assert entry.annotations_omitted == 2
    assert entry.annotation("tandem.io/gpu-index") == "0"
    assert all(len(v) <= MAX_ANNOTATION_CHARS for p in doc.node("n2").pods()
               for _, v in p.annotations)


def test_agent_reads_its_own_node_whatever_the_others_hold() -> None:
    app, *_ = make_app(source=padded_cluster())
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        answer = app.test_client().get(request.url.raw_path.decode(),
                                       headers=dict(request.headers))
        return httpx.Response(answer.status_code, content=answer.get_data())

    client = StateClient("http://ext", transport=httpx.MockTransport(handler))
    view = client.fetch("n1", AGENT_AUTH["Authorization"].removeprefix("Bearer "))
    assert [p.uid for p in view.pods()] == ["uid-99"]
    assert asked == ["http://ext/v1/state?node=n1"]
    only = app.test_client().get("/v1/state?node=n1", headers=AGENT_AUTH).get_json()
    assert list(only["nodes"]) == ["n1"]


def test_a_broken_node_entry_blinds_only_that_node() -> None:
    good = {"index": 0, "uuid": "GPU-0", "pods": [{"pod": "ns/a", "uid": "u", "state": "placed",
                                                   "workload": "training"}]}
    raw = {"nodes": {"n1": {"gpus": [good]},
                     "n2": {"gpus": [{"index": 0, "predicted_util": "NaN"}]},
                     "n3": {"gpus": [{"index": 0, "pods": [{"state": "bogus"}]}]}}}
    doc = decode_state(raw)
    assert [n.name for n in doc.nodes] == ["n1"] and doc.unreadable == ("n2", "n3")
    assert [p.uid for p in parse_node_view(raw, "n1").pods()] == ["u"]
    with pytest.raises(StateError, match="n2"):
        parse_node_view(raw, "n2")


def test_oversized_answer_is_refused_without_parsing() -> None:
    huge = b'{"nodes": {}, "pad": "' + b"x" * (17 << 20) + b'"}'
    client = StateClient("http://ext", transport=httpx.MockTransport(
        lambda _: httpx.Response(200, content=huge)))
    with pytest.raises(StateError, match="too large"):
        client.fetch("n1")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "Basic abc"}],
                         ids=["none", "wrong-token", "other-scheme"])
def test_without_the_agent_token_the_document_is_redacted(headers: dict[str, str]) -> None:
    app, *_ = make_app(source=padded_cluster())
    raw = app.test_client().get("/v1/state", headers=headers).get_json()
    assert "learning" not in raw and raw["redacted"] is True
    pods = [p for n in raw["nodes"].values() for g in n["gpus"] for p in g["pods"]]
    assert len(pods) == 69
    assert all(set(p) == {"state", "workload", "util_percent", "mem_mib"} for p in pods)
    full = app.test_client().get("/v1/state", headers=AGENT_AUTH).get_json()
    assert "redacted" not in full
    assert "learning" in full and all("pod" in p and "uid" in p for n in full["nodes"].values()
                                      for g in n["gpus"] for p in g["pods"])


def test_fleet_rows_read_learning_through_the_decoder() -> None:
    from predictor.observed import ObservationDocumentError, observed_rows

    app, *_ = make_app(source=padded_cluster())
    full = app.test_client().get("/v1/state", headers=AGENT_AUTH).get_json()
    assert observed_rows(full) == []  # nothing learned yet, but the document is read
    redacted = app.test_client().get("/v1/state").get_json()
    with pytest.raises(ObservationDocumentError, match="agent token"):
        observed_rows(redacted)


def test_the_agent_sees_the_container_and_an_untrusted_state() -> None:
    raw = {"nodes": {"n1": {"gpus": [{"index": 0, "pods": [
        {"pod": "ns/a", "uid": "u", "state": "untrusted", "container": "c2"}]}]}}}
    (pod,) = parse_node_view(raw, "n1").pods()
    assert (pod.container, pod.state, pod.trusted) == ("c2", "untrusted", False)


def test_one_pod_entry_repeats_at_most_the_per_pod_total() -> None:
    from contracts.state import MAX_POD_ANNOTATION_CHARS, bounded_annotations

    long = "m" * MAX_ANNOTATION_CHARS
    ann = {"tandem.io/model": long, "tandem.io/prediction-source": long,
           "tandem.io/gpu-uuid": long, "tandem.io/workload": "inference"}
    kept, omitted = bounded_annotations(ann)
    assert sum(len(v) for _, v in kept) <= MAX_POD_ANNOTATION_CHARS
    assert omitted == 2 and dict(kept)["tandem.io/workload"] == "inference"


def test_an_agent_with_a_wrong_token_keeps_its_view_instead_of_an_empty_one() -> None:
    """A redacted answer has no pod UIDs: read as a view it would drop every session."""
    app, *_ = make_app(source=padded_cluster())
    raw = app.test_client().get("/v1/state?node=n1", headers={"Authorization": "Bearer no"})
    with pytest.raises(StateError, match="agent token"):
        parse_node_view(raw.get_json(), "n1")
