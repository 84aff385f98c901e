"""The decision core's seams: the planner protocol and what each ``Purpose`` computes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from extender_builders import PROFILES, inference, node, training

from extender.core import (
    CostPolicy,
    DecisionContext,
    GpuTable,
    InferenceContext,
    ProfileIndex,
    Purpose,
    Reason,
    choose,
    evaluate,
    parse_demand,
    resolve_demand,
)
from planner import plan_gpu
from planner.types import GpuPlan, Infeasible, InfeasibleReason, SessionAllocation

PROFILE_INDEX = ProfileIndex(PROFILES)


def resolved(p, table, profiles=None):
    return resolve_demand(parse_demand(p), table.type_names, None, profiles,
                          session_name="default/" + p["metadata"]["name"])


def session_demand(table):
    return resolved(inference("s1", rate=50), table, PROFILE_INDEX)


def fixed_plan(sessions, profiles, gpu_type, memory_mib, /):
    """A planner that gives every session a quarter of a 40 ms duty cycle."""
    allocations = tuple(SessionAllocation(s, 2, s.rate_rps, 50.0, 10.0) for s in sessions)
    return GpuPlan(gpu_type, 40.0, 0.25 * len(sessions), allocations, 1000.0)


def refuse(sessions, profiles, gpu_type, memory_mib, /):
    """A planner that refuses everything, with numbers."""
    return Infeasible(InfeasibleReason.RATE_TOO_HIGH, 500.0, 120.0, sessions[-1].name)


def test_planner_plan_sets_cost_and_the_session_share():
    t = GpuTable.build([node("n1", 1)])
    ctx = DecisionContext(CostPolicy(), 0.0, InferenceContext(fixed_plan, PROFILE_INDEX))
    ev = evaluate(t, ["n1"], session_demand(t), ctx)
    assert ev.node_cost.tolist() == [0.75]  # 1 - occupancy 0.25
    assert choose(ev, 0, "u1", "default/s1").util_percent == 25.0  # 10 ms of 40 ms


def test_planner_refusal_becomes_the_reason_and_its_message_the_detail():
    t = GpuTable.build([node("n1", 1)])
    ctx = DecisionContext(CostPolicy(), 0.0, InferenceContext(refuse, PROFILE_INDEX))
    rejection = evaluate(t, ["n1"], session_demand(t), ctx).rejections["n1"]
    assert rejection.reason is Reason.SLO_UNREACHABLE
    assert "RateTooHigh (needs 500 rps, available 120 rps)" in rejection.detail


def test_planner_answer_of_another_type_is_an_error_not_a_guess():
    @dataclasses.dataclass
    class LooksLikeAPlan:  # has the attributes a duck-typed check would accept
        duty_cycle_ms: float = 40.0
        occupancy: float = 0.5

    t = GpuTable.build([node("n1", 1)])
    ctx = DecisionContext(CostPolicy(), 0.0,
                          InferenceContext(lambda *args: LooksLikeAPlan(), PROFILE_INDEX))
    with pytest.raises(TypeError, match="LooksLikeAPlan"):
        evaluate(t, ["n1"], session_demand(t), ctx)


def test_real_planner_satisfies_the_seam():
    t = GpuTable.build([node("n1", 1)])
    ctx = DecisionContext(CostPolicy(), 0.0, InferenceContext(plan_gpu, PROFILE_INDEX))
    assert evaluate(t, ["n1"], session_demand(t), ctx).feasible_names() == ["n1"]


def test_purposes_agree_on_feasibility_and_differ_in_what_they_compute():
    t = GpuTable.build([node("n1", 2), node("n2", 2, memory_mib=8000)])
    demand = resolved(training(util=30, mem=10000), t)
    ctx = DecisionContext(CostPolicy(), 0.0)
    score, filt, place = (evaluate(t, ["n1", "n2"], demand, ctx, purpose)
                          for purpose in (Purpose.SCORE, Purpose.FILTER, Purpose.PLACE))
    assert score.feasible_names() == filt.feasible_names() == place.feasible_names() == ["n1"]
    assert filt.node_cost[0] == 0.0 and score.node_cost[0] > 0.0  # filter skips the cost
    np.testing.assert_array_equal(place.node_cost, score.node_cost)
    assert score.rejections == filt.rejections and set(score.rejections) == {"n2"}
    assert place.rejections == {}  # the simulator needs no reasons
