"""Property-based fuzzing of every POST body tandem serves (tests/fuzz_strategies.py):
the extender's verbs and agent reports, the inference server's session and infer
endpoints (JSON and .npy), and the session proxy. No 5xx, no traceback, every 4xx
with a reason, and rejected requests change no state."""

from __future__ import annotations

import os

import pytest
from fuzz_strategies import NPY, Harness, Req, _npy_header, check, fuzz_settings
from hypothesis import given

EXAMPLES = int(os.environ.get("TANDEM_FUZZ_EXAMPLES", "25"))
RANDOM = os.environ.get("TANDEM_FUZZ_RANDOM") == "1"
"""The suite draws the same cases every run (a green build stays green); set
TANDEM_FUZZ_RANDOM=1, with more TANDEM_FUZZ_EXAMPLES, to explore new ones."""
NAMES = ["extender /filter", "extender /prioritize", "extender /bind", "extender /preempt",
         "extender /v1/agents/report", "server /v1/sessions", "server DELETE /v1/sessions/NAME",
         "server /v1/sessions/NAME/infer (json)", "server /v1/sessions/NAME/infer (npy)",
         "proxy /infer", "proxy /v1/sessions/NAME/infer"]


@pytest.fixture(scope="module")
def harness():
    h = Harness()
    assert [t.name for t in h.targets()] == NAMES
    yield h
    h.close()


def target_of(harness, name):
    return next(t for t in harness.targets() if t.name == name)


def run(target, strategy, examples=EXAMPLES, shrink=True):
    @fuzz_settings(examples, shrink, derandomize=not RANDOM)
    @given(strategy)
    def one(req):
        status, found = check(target, req)
        assert not found, f"{target.name}: {req!r} -> {status}: {found}"
    one()


@pytest.mark.parametrize("name", NAMES)
def test_any_body_gets_an_answer_with_a_reason_and_keeps_state(harness, name):
    target = target_of(harness, name)
    run(target, target.requests())


@pytest.mark.parametrize("name", NAMES)
def test_malformed_headers_get_an_answer_with_a_reason(harness, name):
    target = target_of(harness, name)
    run(target, target.requests(headers=True))


@pytest.mark.parametrize("name", [n for n in NAMES if "DELETE" not in n])
def test_deep_json_and_huge_numbers_are_refused(harness, name):
    target = target_of(harness, name)
    run(target, target.adversarial(), max(5, EXAMPLES // 5), shrink=False)


@pytest.mark.parametrize("name", ["server /v1/sessions/NAME/infer (npy)",
                                  "proxy /v1/sessions/NAME/infer"])
def test_npy_header_claiming_more_than_the_body_is_400_before_any_allocation(harness, name):
    target = target_of(harness, name)
    for shape in [(2**40, 4), (1, 2**62), (3, 4)]:
        status, found = check(target, Req(_npy_header("<f4", shape, b"\0" * 16), NPY,
                                          path="ml.web"))
        assert status == 400 and not found
