"""Admission counts each SLO session at the rate it was admitted at (issue #43)."""

from __future__ import annotations

import pytest

from agent.inference.clock import VirtualClock
from agent.inference.errors import AdmissionRefused
from agent.inference.executors.executors import SimExecutor
from agent.inference.runtime.pathcost import PathFigures, RequestPathCost, RequestPathLimits
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from predictor.batching import BatchingProfile


def _sim_runtime() -> ServingRuntime:
    clock = VirtualClock()
    profiles = {"m": BatchingProfile.linear("m", "sim", 2.0, 1.0, max_batch=16)}
    return ServingRuntime(SimExecutor(profiles, clock, "sim"), clock, RuntimeConfig("sim"),
                          profiles=profiles,
                          path_cost=RequestPathCost(PathFigures(1.0, 1.0, 0.05)),
                          path_limits=RequestPathLimits(workers=64, cores=1.0))


def test_an_earlier_session_counts_at_its_admitted_rate_before_any_traffic() -> None:
    """Between registrations no request came, a replan followed the rates observed
    (0.1 requests/s), and the next admission counted the earlier session so: a second
    session was admitted beside it that the executor could not hold with the first."""
    rt = _sim_runtime()
    rt.add_slo_session("a", "m", 200, 300)
    for t in range(1, 40):  # several rate windows without a request
        rt.clock.advance_to(t * 250.0)
        rt.step()
    assert rt.planning.replans >= 1
    assert rt.sessions.slo["a"].spec.rate_rps < 10.0  # the plan follows what was observed
    with pytest.raises(AdmissionRefused):
        rt.add_slo_session("b", "m", 200, 300)
    assert _sim_runtime().add_slo_session("b", "m", 200, 300)  # alone it fits
