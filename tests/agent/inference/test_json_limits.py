"""Hostile JSON (deep nesting, huge numbers, NaN) gets a 400 with a reason on every server."""

from __future__ import annotations

import json
import random

import pytest
from extender_builders import TOKEN, make_app
from test_server_http import sim_runtime  # noqa: F401  (fixture)

from agent.inference.http.app import create_app as create_server_app
from contracts.jsonbody import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    JsonBodyError,
    JsonLimits,
    nesting_depth,
    parse_json,
)

DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_INT = b'{"Pod": ' + b"9" * 5000 + b"}"
HOSTILE = {
    "deep-100k": (DEEP, "nested deeper"),
    "deep-unclosed": (b"{\"a\":" * 100_000, "nested deeper"),
    "int-5000-digits": (HUGE_INT, "digits"),
    "int-31-digits": (b'{"a": -' + b"1" * 31 + b"}", "digits"),
    "long-float": (b"[1." + b"0" * 5000 + b"]", "longer than"),
    "float-overflow": (b"[1e999]", "out of range"),
    "nan": (b"[NaN]", "not a JSON number"),
    "infinity": (b"{\"a\": -Infinity}", "not a JSON number"),
}


def _reference_depth(value):
    if isinstance(value, list):
        return 1 + max(map(_reference_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_reference_depth, value.values()), default=0)
    return 0


def _random_document(rng, depth=0):
    roll = rng.random()
    if depth > 10 or roll < 0.3:  # strings that hide brackets, quotes and escapes
        return rng.choice(['a"[', "\\", '\\"{', '}]"', "x", '\\\\"', "\n[", 7, 1.5, None])
    if roll < 0.65:
        return [_random_document(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {str(_random_document(rng, 11)): _random_document(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


@pytest.mark.parametrize("body,reason", HOSTILE.values(), ids=HOSTILE.keys())
def test_parse_json_refuses_with_a_reason(body, reason):
    with pytest.raises(JsonBodyError) as err:
        parse_json(body)
    assert reason in err.value.problem


def test_limits_are_inclusive_and_configurable():
    assert parse_json(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    assert parse_json(b"[" + b"9" * MAX_INT_DIGITS + b"]") == [int("9" * MAX_INT_DIGITS)]
    with pytest.raises(JsonBodyError):
        parse_json(b"[[[1]]]", JsonLimits(max_depth=2))


def test_nesting_depth_ignores_brackets_inside_strings():
    rng = random.Random(15)
    for _ in range(2000):
        doc = _random_document(rng)
        assert nesting_depth(json.dumps(doc).encode()) == _reference_depth(doc)


def test_ordinary_documents_parse_as_the_standard_library_does():
    doc = {"Pod": {"metadata": {"name": "p", "annotations": {"a": "[{\\\"]"}}},
           "NodeNames": ["n1"], "x": [1, -2, 3.5, 1e300, True, None, "é"]}
    assert parse_json(json.dumps(doc).encode()) == doc
    assert parse_json(json.dumps(doc)) == doc


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind", "/preempt"])
@pytest.mark.parametrize("body,reason", HOSTILE.values(), ids=HOSTILE.keys())
def test_extender_verbs_answer_400_with_the_reason(path, body, reason):
    """Before: RecursionError/ValueError became 'internal error' (200 with Error)."""
    app, *_ = make_app()
    r = app.test_client().post(path, data=body, content_type="application/json")
    assert r.status_code == 400
    assert reason in r.get_json()["Error"] and "internal error" not in r.get_json()["Error"]


def test_agent_report_answers_400_for_deep_json():
    app, *_ = make_app()
    r = app.test_client().post("/v1/agents/report", data=DEEP, content_type="application/json",
                               headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 400 and "nested deeper" in r.get_json()["Error"]


@pytest.mark.parametrize("body,reason", HOSTILE.values(), ids=HOSTILE.keys())
def test_inference_server_answers_400_with_the_reason(sim_runtime, body, reason):  # noqa: F811
    client = create_server_app(sim_runtime, max_body_bytes=1 << 20).test_client()
    r = client.post("/v1/sessions", data=body, content_type="application/json")
    assert r.status_code == 400 and reason in r.get_json()["message"]
    client.post("/v1/sessions", json={"name": "s", "model": "tiny", "slo_ms": 2000,
                                      "rate_rps": 100})
    r = client.post("/v1/sessions/s/infer", data=body, content_type="application/json")
    assert r.status_code == 400 and reason in r.get_json()["message"]
