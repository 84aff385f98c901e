"""The executor's tail measured at start-up (issue #43: sessions admitted on median
profiles were missed after admission on a busy host): the delay a preemption adds,
planned with until served batches give the learned margin."""

from __future__ import annotations

import pytest

from agent.inference.runtime.admission import LatencyMargin, scaled_profile
from agent.inference.runtime.executor_tail import ExecutorHost, measure_host, start_delay_ms
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
    margin.observe_host(25.0, 0.5)
    assert margin.planning_margin() == pytest.approx(1.0)  # half a core: twice as long
    planned = scaled_profile(profile, margin.margin, margin.start_delay_ms)
    assert planned.latency_ms(1) == pytest.approx(profile.latency_ms(1) + 25.0)
    assert planned.latency_ms(4) == pytest.approx(profile.latency_ms(4) + 25.0)
    for _ in range(10):
        margin.observe(3.0, 3.0)  # served batches as profiled: the host is quiet now
    assert margin.refresh()  # the delay and the share give way: a replan follows
    assert margin.start_delay_ms == 0.0 and margin.margin == 0.0 and margin.share == 1.0
    assert scaled_profile(profile, margin.margin, margin.start_delay_ms) is profile


def test_the_start_up_measurement_runs_on_this_host() -> None:
    assert 0.0 <= start_delay_ms(_Cpu(), 0.99, repeats=20) < 60_000.0


class _Shared(_Host):
    """Each run takes 1 ms of the thread's CPU and ``1 / share`` ms of wall time."""

    def __init__(self, share: float):
        super().__init__(None)
        self.cpu, self.share = 0.0, share

    def run(self) -> None:
        self.cpu += 0.001
        self.now += 0.001 / self.share


def test_the_executors_share_of_a_core_is_measured_with_its_delay() -> None:
    hogged = _Shared(0.25)
    host = measure_host(_Cpu(), 0.9, repeats=40, work=hogged.run, timer=lambda: hogged.now,
                        cpu_timer=lambda: hogged.cpu)
    assert host.share == pytest.approx(0.25) and host.delay_ms == pytest.approx(0.0)
    quiet = _Shared(1.0)
    assert measure_host(_Cpu(), 0.9, repeats=40, work=quiet.run, timer=lambda: quiet.now,
                        cpu_timer=lambda: quiet.cpu).share == pytest.approx(1.0)


def test_a_host_that_got_busier_is_seen_at_the_next_registration() -> None:
    """Regression (issue #43): beside a CPU hog the executor's batches ran at 8.7x their
    profile, and a 250 ms session admitted on its profile lost 17% after admission. The
    executor's share of a core is measured again at each registration and every batch is
    planned at 1/share at least: the busier host refuses the rate the quiet one held,
    naming a lower one, and says what it measured."""
    from agent.inference.clock import VirtualClock
    from agent.inference.errors import AdmissionRefused
    from agent.inference.executors.executors import SimExecutor
    from agent.inference.runtime.executor_tail import ExecutorHost
    from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime

    profiles = {"m": BatchingProfile.linear("m", "sim", 4.0, 1.0, max_batch=16)}
    host = [ExecutorHost(0.0, 1.0)]
    clock = VirtualClock()
    rt = ServingRuntime(SimExecutor(profiles, clock, "sim"), clock, RuntimeConfig("sim"),
                        profiles=profiles, executor_probe=lambda: host[0])
    quiet = rt.add_slo_session("a", "m", 100, 150)
    assert quiet["executor_share"] == 1.0
    rt.remove_session("a")
    host[0] = ExecutorHost(0.0, 0.25)  # a hog took three quarters of the executor's core
    with pytest.raises(AdmissionRefused) as refused:
        rt.add_slo_session("a", "m", 100, 150)
    holdable = refused.value.to_json()["holdable_rate_rps"]
    assert 0 < holdable < 150
    busy = rt.add_slo_session("a", "m", 100, holdable)
    assert busy["executor_share"] == 0.25 and rt.snapshot()["executor_share"] == 0.25
    assert rt.planning.planned(profiles["m"]).latency_ms(4) == pytest.approx(
        4 * profiles["m"].latency_ms(4))


def test_the_host_is_the_median_of_three_measurements() -> None:
    """Regression (issue #43): one 100 ms measurement met a blip of the host, and the
    session refused on it was refused again at the rate the refusal named."""
    from agent.inference.runtime.executor_tail import steady_host

    seen = iter([ExecutorHost(0.5, 1.0), ExecutorHost(30.0, 0.2), ExecutorHost(1.0, 0.9)])
    assert steady_host(lambda: next(seen)) == ExecutorHost(1.0, 0.9)
    hog = iter([ExecutorHost(20.0, 0.2), ExecutorHost(25.0, 0.25), ExecutorHost(0.5, 1.0)])
    assert steady_host(lambda: next(hog)) == ExecutorHost(20.0, 0.25)
