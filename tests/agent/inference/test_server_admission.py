"""Admission additions (agent.inference.runtime.admission): learned latency margin, overrun
headroom."""

from __future__ import annotations

import pytest

from agent.inference.runtime.admission import LatencyMargin, plan_with_headroom, scaled_profile
from planner import GpuPlan, SessionSpec
from predictor.batching import BatchingProfile

PROFILE = BatchingProfile.linear("m", "cpu", 5.0, 1.0, max_batch=64)


def test_margin_is_the_quantile_of_observed_over_profiled_and_ignores_small_moves() -> None:
    margin = LatencyMargin(quantile=0.99, window=1000, min_samples=100)
    for _ in range(99):
        margin.observe(12.0, 10.0)
    assert not margin.refresh() and margin.margin == 0.0  # too few samples yet
    for i in range(901):
        margin.observe(10.0 + (30.0 if i % 100 == 0 else 2.0), 10.0)
    assert margin.refresh()
    assert margin.margin == pytest.approx(3.0)  # 1% of 1000 batches took 4x: p99 is 4x
    margin.observe(12.1, 10.0)
    assert not margin.refresh()  # unchanged within the noise band: no replan


def test_scaled_profile_multiplies_every_batch() -> None:
    scaled = scaled_profile(PROFILE, 0.5)
    assert [scaled.latency_ms(b) for b in (1, 8, 64)] == pytest.approx(
        [1.5 * PROFILE.latency_ms(b) for b in (1, 8, 64)])
    assert scaled_profile(PROFILE, 0.0) is PROFILE


@pytest.mark.parametrize(
    ("longest_ms", "headroom_ms"),
    [
        pytest.param(1.0, 0.0, id="fits-the-slack"),
        pytest.param(30.0, 30.0, id="overruns-headroom-kept"),
        pytest.param(99.0, 0.0, id="longer-than-what-the-slo-allows"),
    ],
)
def test_plan_keeps_headroom_only_for_a_segment_that_will_overrun(longest_ms, headroom_ms) -> None:
    specs = [SessionSpec("s", "m", 100.0, 100.0)]
    plan, headroom = plan_with_headroom(specs, {("m", "cpu"): PROFILE}, "cpu", 1e12, longest_ms)
    assert isinstance(plan, GpuPlan) and headroom == headroom_ms
    (alloc,) = plan.allocations
    assert alloc.latency_ms + headroom <= 100.0
