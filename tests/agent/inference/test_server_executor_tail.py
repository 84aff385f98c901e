"""The executor's tail measured at start-up (issue #43: sessions admitted on median
profiles were missed after admission on a busy host): the delay a preemption adds,
planned with until served batches give the learned margin."""

from __future__ import annotations

import pytest

from agent.inference.runtime.admission import LatencyMargin, scaled_profile
from agent.inference.runtime.executor_tail import start_delay_ms
from predictor.batching import BatchingProfile


class _Cpu:
    device = "cpu"


class _Host:
    """A virtual clock: each run takes 1 ms, every ``pauses_every``-th 30 ms more."""

    def __init__(self, pauses_every: int | None):
        self.now, self.count, self.every = 0.0, 0, pauses_every

    def run(self) -> None:
        self.count += 1
        held = self.every and self.count % self.every == 0
        self.now += 0.031 if held else 0.001


def test_a_preempted_host_shows_its_delay_and_a_quiet_one_none() -> None:
    busy = _Host(pauses_every=5)
    delay = start_delay_ms(_Cpu(), 0.9, repeats=40, work=busy.run, timer=lambda: busy.now)
    assert delay == pytest.approx(30.0)  # one run in five waited 30 ms more than the median
    quiet = _Host(pauses_every=None)
    assert start_delay_ms(_Cpu(), 0.9, repeats=40, work=quiet.run,
                          timer=lambda: quiet.now) == pytest.approx(0.0)
    # Rarer than the quantile: not planned for.
    rare = _Host(pauses_every=50)
    assert start_delay_ms(_Cpu(), 0.9, repeats=40, work=rare.run,
                          timer=lambda: rare.now) == pytest.approx(0.0)


def test_the_start_delay_is_planned_with_until_the_margin_is_learned() -> None:
    profile = BatchingProfile.linear("m", "cpu", 2.0, 1.0, max_batch=4)
    margin = LatencyMargin(0.99, window=100, min_samples=10)
    margin.start_delay_ms = 25.0
    planned = scaled_profile(profile, margin.margin, margin.start_delay_ms)
    assert planned.latency_ms(1) == pytest.approx(profile.latency_ms(1) + 25.0)
    assert planned.latency_ms(4) == pytest.approx(profile.latency_ms(4) + 25.0)
    for _ in range(10):
        margin.observe(3.0, 3.0)  # served batches as profiled: the host is quiet now
    assert margin.refresh()  # the delay gives way: a replan follows
    assert margin.start_delay_ms == 0.0 and margin.margin == 0.0
    assert scaled_profile(profile, margin.margin, margin.start_delay_ms) is profile


def test_the_start_up_measurement_runs_on_this_host() -> None:
    assert 0.0 <= start_delay_ms(_Cpu(), 0.99, repeats=20) < 60_000.0
