"""An SLO session registered beside a best-effort job (issue #43): admission plans it
with best effort giving way first. Deterministic where it can be: path figures are
given, time is a virtual clock."""

from __future__ import annotations

import math

import pytest
from flask.testing import FlaskClient

from agent.inference.clock import VirtualClock
from agent.inference.errors import AdmissionRefused
from agent.inference.executors.executors import SimExecutor
from agent.inference.http.app import create_app
from agent.inference.runtime.holding import Hold
from agent.inference.runtime.pathcost import (
    PathFigures,
    RequestPathCost,
    RequestPathLimits,
)
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from agent.inference.runtime.sacrifice import FLOOR, Held, Sacrifice
from predictor.batching import BatchingProfile

PROFILES = {"mlp": BatchingProfile.linear("mlp", "sim", 0.1, 0.6, max_batch=16),
            "conv": BatchingProfile.linear("conv", "sim", 2.0, 1.0, max_batch=4)}
# A quiet 2-core host's request path at start-up: a few ms.
HOST = PathFigures(front_ms=2.5, back_ms=1.0, cpu_ms=1.2, wake_ms=0.5, write_ms=0.1)
LIMITS = RequestPathLimits(workers=40, cores=1.0)  # a quiet host: all of a core


def _runtime(figures: PathFigures = HOST) -> tuple[ServingRuntime, VirtualClock]:
    clock = VirtualClock()
    rt = ServingRuntime(SimExecutor(PROFILES, clock, "sim"), clock, RuntimeConfig("sim"),
                        profiles=PROFILES, path_cost=RequestPathCost(figures),
                        path_limits=LIMITS)
    return rt, clock


def test_an_slo_session_beside_best_effort_is_admitted_with_best_effort_at_its_floor() -> None:
    """The issue's case: a 50 ms session at 20 rps registered after a best-effort job is
    admitted (the request path predicted at about 17 ms), and best effort gives way at
    once: the answer, the job's entry and the throttle say so."""
    rt, clock = _runtime()
    client: FlaskClient = create_app(rt).test_client()
    assert client.post("/v1/sessions", json={"name": "conv", "model": "conv"}).status_code \
        == 201
    answer = client.post("/v1/sessions", json={"name": "b50", "model": "mlp", "slo_ms": 50,
                                               "rate_rps": 20})
    assert answer.status_code == 201, answer.json
    assert answer.json["promised"]["rate_rps"] == 20
    assert answer.json["best_effort"]["share"] == FLOOR
    assert answer.json["best_effort"]["reason"].startswith("SloAdmitted: SLO session b50")
    snap = client.get("/v1/sessions").json
    assert snap["best_effort_throttle"]["share"] == FLOOR
    job = next(s for s in snap["sessions"] if s["name"] == "conv")
    assert job["promised"]["share"] == FLOOR and "gives way first" in job["promised"]["reason"]
    assert client.delete("/v1/sessions/b50").status_code in (200, 204)
    assert rt.snapshot()["best_effort_throttle"]["share"] == 1.0  # no one to give way to
    # The same host counting the lock wait at every crossing could not hold it.
    old = PathFigures(front_ms=2.5 + 2 * 10.0, back_ms=1.0 + 2 * 10.0, cpu_ms=1.2,
                      wake_ms=10.0, write_ms=0.1)
    with pytest.raises(AdmissionRefused) as refused:
        _runtime(old)[0].add_slo_session("b50", "mlp", 50, 20)
    assert refused.value.details["reason"] == "RequestPathQueue"


def test_best_effort_comes_back_up_while_the_slo_sessions_meet_their_deadlines() -> None:
    sac = Sacrifice()
    held = [Held("b50", 0, Hold(20.0, 0.0))]
    assert sac.admitted(0.0, "b50") and sac.best_effort.share == FLOOR
    assert not sac.admitted(10.0, "again")  # already at its floor: nothing more to give
    shares = []
    for now in range(1000, 20001, 1000):
        for _ in range(20):
            held[0].hold.outcome(False)
        sac.review(float(now), held, best_effort=True, why="")
        shares.append(sac.best_effort.share)
    assert shares[3] == FLOOR  # held through the cool-down
    assert shares[-1] == 1.0 and sac.best_effort.reason is None
    assert math.isclose(min(shares), FLOOR)


def test_a_throttled_job_keeps_few_requests_waiting() -> None:
    """At its floor a job's clients send faster than it is served; every waiting request
    holds an HTTP worker the SLO session needs, so beyond a few they are answered
    ``throttled`` at once, and at all of the executor again they wait as before."""
    import numpy as np

    from agent.inference.errors import DropReason
    from agent.inference.runtime.sacrifice import THROTTLED_QUEUE
    from agent.inference.runtime.stats import Outcome

    rt, _clock = _runtime()
    rt.add_best_effort_session("conv", "conv")
    rt.add_slo_session("b50", "mlp", 50, 20)
    got: list[Outcome] = []
    x = np.zeros((1, 2), np.float32)
    for _ in range(THROTTLED_QUEUE + 3):
        rt.submit("conv", x, got.append)
    assert [o.reason for o in got] == [DropReason.THROTTLED] * 3  # the rest wait
    rt.remove_session("b50")  # all of it again: requests wait
    rt.submit("conv", x, got.append)
    assert len(got) == 3
