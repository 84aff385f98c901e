"""The ``tandem.io/*`` annotation contract: one parser, one output codec, one answer everywhere."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from extender_builders import pod
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from agent.inference.clock import MonotonicClock
from agent.inference.executors.executors import SimExecutor
from agent.inference.http.app import create_app
from agent.inference.quanta import JobSpec, QuantaError
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from agent.node.extender_view import parse_node_view
from agent.node.sessions import desired_sessions
from contracts.annotations import (
    PRIORITY_RANGE,
    WEIGHT_RANGE,
    AnnotationError,
    BindOutputs,
    PodInputs,
    decode_outputs,
    encode_outputs,
    parse_inputs,
    read_bound_inputs,
)
from extender.cluster.source import placement_from_pod
from extender.core import DemandError, parse_demand
from predictor.batching import BatchingProfile


def notes(**values: str) -> dict[str, str]:
    """Annotations from keyword arguments (underscores for dashes: slo_ms -> slo-ms)."""
    return {f"tandem.io/{k.replace('_', '-')}": v for k, v in values.items()}


INF = {"workload": "inference", "model": "tiny"}

# ---- inputs: one table of annotation sets -------------------------------------------------

PARSED = [
    pytest.param(notes(model="m"), PodInputs(model="m"), id="training-model-only"),
    pytest.param(notes(gpu_util="40", gpu_mem_mib="1000"),
                 PodInputs(util_percent=40.0, mem_mib=1000.0), id="training-asserted"),
    pytest.param(notes(model="m", batch_size=" 64 ", gpu_util="1e1"),
                 PodInputs(model="m", batch_size=64, util_percent=10.0), id="spaces-and-exponent"),
    pytest.param(notes(**INF, slo_ms="100", rate_rps="200"),
                 PodInputs("inference", "tiny", slo_ms=100.0, rate_rps=200.0), id="slo-session"),
    pytest.param(notes(**INF, slo_ms="100", rate_rps="200", priority="3"),
                 PodInputs("inference", "tiny", slo_ms=100.0, rate_rps=200.0, priority=3),
                 id="slo-session-keeps-priority"),
    pytest.param(notes(**INF), PodInputs("inference", "tiny"), id="best-effort-default"),
    pytest.param(notes(**INF, weight="1000"), PodInputs("inference", "tiny", weight=1000),
                 id="weight-at-quanta-limit"),
    pytest.param(notes(**INF, priority="+5"), PodInputs("inference", "tiny", priority=5),
                 id="signed-priority"),
    pytest.param(notes(**INF, priority="-1000000"),
                 PodInputs("inference", "tiny", priority=-1_000_000), id="lowest-priority"),
]

REJECTED = [
    pytest.param(notes(workload="serving", model="m"), "tandem.io/workload", id="unknown-workload"),
    pytest.param(notes(model="  "), "tandem.io/model", id="blank-model"),
    pytest.param(notes(model="m", gpu_util="lots"), "tandem.io/gpu-util", id="util-typo"),
    pytest.param(notes(model="m", gpu_util="nan"), "tandem.io/gpu-util", id="util-nan"),
    pytest.param(notes(model="m", gpu_mem_mib="inf"), "tandem.io/gpu-mem-mib", id="mem-inf"),
    pytest.param(notes(model="m", gpu_util="101"), "tandem.io/gpu-util", id="util-over-100"),
    pytest.param(notes(model="m", gpu_util="٣"), "tandem.io/gpu-util", id="util-arabic-digit"),
    pytest.param(notes(model="m", batch_size="0"), "tandem.io/batch-size", id="batch-zero"),
    pytest.param(notes(model="m", batch_size="²"), "tandem.io/batch-size", id="batch-superscript"),
    pytest.param(notes(model="m", batch_size="9" * 5000), "tandem.io/batch-size",
                 id="batch-5000-digits"),
    pytest.param(notes(workload="inference"), "tandem.io/model", id="inference-without-model"),
    pytest.param(notes(**INF, slo_ms="50"), "tandem.io/rate-rps", id="slo-without-rate"),
    pytest.param(notes(**INF, rate_rps="50"), "tandem.io/slo-ms", id="rate-without-slo"),
    pytest.param(notes(**INF, slo_ms="5e6", rate_rps="1"), "tandem.io/slo-ms",
                 id="slo-over-an-hour"),
    pytest.param(notes(**INF, weight="5000"), "tandem.io/weight", id="weight-over-quanta-limit"),
    pytest.param(notes(**INF, weight="0"), "tandem.io/weight", id="weight-zero"),
    pytest.param(notes(**INF, weight="1.5"), "tandem.io/weight", id="weight-fraction"),
    pytest.param(notes(**INF, priority="²"), "tandem.io/priority", id="priority-superscript"),
    pytest.param(notes(**INF, priority="high"), "tandem.io/priority", id="priority-word"),
    pytest.param(notes(**INF, priority="2000000"), "tandem.io/priority", id="priority-huge"),
    pytest.param(notes(**INF, slo_ms="100", rate_rps="200", priority="high"),
                 "tandem.io/priority", id="slo-priority-word"),
]


@pytest.mark.parametrize(("ann", "expected"), PARSED)
def test_annotation_sets_parse_to_typed_inputs(ann: dict[str, str], expected: PodInputs) -> None:
    assert parse_inputs(ann) == expected


@pytest.mark.parametrize(("ann", "field"), REJECTED)
def test_annotation_sets_are_rejected_naming_the_field(ann: dict[str, str], field: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        parse_inputs(ann)
    assert caught.value.field == field
    assert caught.value.problem  # the user is told what is accepted


@pytest.mark.parametrize(("ann", "field"), REJECTED)
def test_the_extender_rejects_them_at_filter_with_the_same_field(ann: dict[str, str],
                                                                 field: str) -> None:
    with pytest.raises(DemandError) as caught:
        parse_demand(pod("p", 1, **{k.removeprefix("tandem.io/").replace("-", "_"): v
                                    for k, v in ann.items()}))
    assert caught.value.field == field


def test_the_quanta_accept_exactly_the_contract_ranges() -> None:
    for weight in (WEIGHT_RANGE.low, WEIGHT_RANGE.high):
        JobSpec("a", weight=weight)
    for priority in (PRIORITY_RANGE.low, PRIORITY_RANGE.high):
        JobSpec("a", priority=priority)
    for bad in ({"weight": WEIGHT_RANGE.high + 1}, {"weight": WEIGHT_RANGE.low - 1},
                {"priority": PRIORITY_RANGE.high + 1}, {"priority": PRIORITY_RANGE.low - 1}):
        with pytest.raises(QuantaError, match=next(iter(bad))):
            JobSpec("a", **bad)


# ---- extender, agent and server give one answer per inference annotation set --------------

SESSION_SETS = [
    pytest.param(notes(**INF, slo_ms="2000", rate_rps="100"), None, id="slo-session"),
    pytest.param(notes(**INF, slo_ms="2000", rate_rps="100", weight="3"), None,
                 id="slo-session-with-weight"),
    pytest.param(notes(**INF), None, id="best-effort-default-weight"),
    pytest.param(notes(**INF, weight="1000"), None, id="weight-1000"),
    pytest.param(notes(**INF, priority="+5"), None, id="priority-plus-5"),
    pytest.param(notes(**INF, priority="-3", weight="7"), None, id="priority-wins-over-weight"),
    pytest.param(notes(**INF, weight="5000"), "tandem.io/weight", id="weight-5000"),
    pytest.param(notes(**INF, weight="0"), "tandem.io/weight", id="weight-0"),
    pytest.param(notes(**INF, weight="²"), "tandem.io/weight", id="weight-superscript"),
    pytest.param(notes(**INF, priority="²"), "tandem.io/priority", id="priority-superscript"),
    pytest.param(notes(**INF, priority="2000000"), "tandem.io/priority", id="priority-2e6"),
    pytest.param(notes(**INF, slo_ms="50"), "tandem.io/rate-rps", id="slo-without-rate"),
    pytest.param(notes(**INF, slo_ms="5e6", rate_rps="1"), "tandem.io/slo-ms", id="slo-5e6"),
    pytest.param(notes(**INF, rate_rps="0", slo_ms="100"), "tandem.io/rate-rps", id="rate-0"),
]


@pytest.fixture()
def server() -> Iterator[FlaskClient]:
    clock = MonotonicClock()
    profiles = {"tiny": BatchingProfile.linear("tiny", "sim", 0.01, 0.05, max_batch=32)}
    runtime = ServingRuntime(SimExecutor(profiles, clock, "sim"), clock,
                             RuntimeConfig("sim", quantum_ms=1.0), post_workers=1)
    runtime.start()
    yield create_app(runtime).test_client()
    runtime.stop()


def _json_value(text: str) -> Any:
    """An annotation's text as a client would put it in JSON: a number when it reads as one."""
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


@pytest.mark.parametrize(("ann", "field"), SESSION_SETS)
def test_extender_agent_and_server_accept_and_reject_the_same_sets(
        ann: dict[str, str], field: str | None, server: FlaskClient) -> None:
    try:
        parse_demand(pod("a", 1, **{k.removeprefix("tandem.io/").replace("-", "_"): v
                                    for k, v in ann.items()}))
        extender = None
    except DemandError as err:
        extender = err.field
    state = {"nodes": {"n": {"gpus": [{"index": 0, "pods": [
        {"pod": "ns/a", "uid": "u", "workload": "inference", "annotations": ann}]}]}}}
    wanted, skipped = desired_sessions(parse_node_view(state, "n"))
    agent = re.split("[=:]", skipped[0][1])[0] if skipped else None
    assert (extender, agent) == (field, field)
    if field is None:  # what binds runs: the agent's body is registered
        (spec,) = wanted[0].values()
        answer = server.post("/v1/sessions", json=spec.json())
        assert answer.status_code == 201, answer.json
    else:  # the server refuses the same value sent to it directly
        body = {"name": "ns.a", "model": "tiny"}
        body.update({k.removeprefix("tandem.io/").replace("-", "_"): _json_value(v)
                     for k, v in ann.items() if k not in ("tandem.io/workload", "tandem.io/model")})
        answer = server.post("/v1/sessions", json=body)
        assert answer.status_code == 400, answer.json


# ---- outputs: one encoder, one decoder ------------------------------------------------------

def _on_the_wire_grid() -> st.SearchStrategy[BindOutputs]:
    """Records whose numbers the encoding writes exactly (its decimals), so decode is exact."""
    return st.builds(
        BindOutputs,
        gpu_indices=st.lists(st.integers(0, 63), min_size=1, max_size=8).map(tuple),
        gpu_uuids=st.lists(st.from_regex(r"GPU-[0-9a-f]{8}", fullmatch=True),
                           max_size=8).map(tuple),
        util_percent=st.integers(0, 10_000).map(lambda n: n / 100),
        mem_mib=st.integers(0, 4_000_000).map(float),
        cost=st.none() | st.integers(-10**8, 10**8).map(lambda n: n / 10_000),
        batch=st.none() | st.integers(0, 65536),
        duty_cycle_ms=st.none() | st.integers(0, 10**9).map(lambda n: n / 1000),
    )


@given(_on_the_wire_grid())
def test_decode_of_encode_is_the_identity(out: BindOutputs) -> None:
    assert decode_outputs(encode_outputs(out)) == out


@given(util=st.floats(0, 100), mem=st.floats(0, 4e6), cost=st.floats(-1e6, 1e6),
       duty=st.floats(0, 1e6))
def test_any_record_is_a_fixed_point_after_one_trip(util: float, mem: float, cost: float,
                                                    duty: float) -> None:
    wire = encode_outputs(BindOutputs((0,), ("GPU-0",), util, mem, cost, 4, duty))
    decoded = decode_outputs(wire)
    assert decoded is not None and encode_outputs(decoded) == wire
    # two decimals: at most half a hundredth off (plus float error, e.g. 0.875 -> "0.88")
    assert abs(decoded.util_percent - util) <= 0.005 + 1e-9 and abs(decoded.mem_mib - mem) <= 0.5


@pytest.mark.parametrize(("ann", "expected"), [
    pytest.param({}, None, id="not-bound-by-tandem"),
    pytest.param({"tandem.io/gpu-index": ""}, None, id="empty-index"),
    pytest.param({"tandem.io/gpu-index": "0", "tandem.io/predicted-gpu-util": "x"}, None,
                 id="unreadable-prediction"),
    pytest.param({"tandem.io/gpu-index": "1,2", "tandem.io/predicted-gpu-util": "-5"},
                 BindOutputs((1, 2)), id="index-only-and-negative-util"),
    pytest.param({"tandem.io/gpu-index": "0", "tandem.io/cost": "oops", "tandem.io/batch": "²"},
                 BindOutputs((0,)), id="unreadable-records-never-drop-the-placement"),
])
def test_decode_outputs_of_hand_written_annotations(ann: dict[str, str],
                                                    expected: BindOutputs | None) -> None:
    assert decode_outputs(ann) == expected


def test_a_bound_pod_stays_accounted_for_when_its_inputs_no_longer_parse() -> None:
    ann = {**notes(**INF, weight="5000", slo_ms="fast", rate_rps="1"),
           **encode_outputs(BindOutputs((0,), ("GPU-0",), 20.0, 512.0, 0.1))}
    assert read_bound_inputs(ann) == PodInputs("inference", "tiny")
    bound = {"metadata": {"name": "a", "namespace": "ns", "uid": "u", "annotations": ann},
             "spec": {"nodeName": "n"}, "status": {"phase": "Running"}}
    placement = placement_from_pod(bound)
    assert placement is not None
    assert (placement.gpu_indices, placement.mem_mib, placement.session, placement.weight) == \
        ((0,), 512.0, None, 1)
