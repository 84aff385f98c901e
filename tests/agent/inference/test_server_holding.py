"""The last check keeps the answer's write and the client's wake-up; requests dropped
where they waited are counted; a session the host can no longer hold is scaled down
while serving, with its reason (issue: serving that holds what it admits)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from server_helpers import served_over_http

from agent.inference.clock import MonotonicClock, VirtualClock
from agent.inference.errors import DropReason
from agent.inference.executors.executors import SimExecutor
from agent.inference.http.app import create_app
from agent.inference.runtime.holding import Hold, HoldRule
from agent.inference.runtime.pathcost import PathFigures, RequestPathCost
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from agent.inference.runtime.stats import Outcome
from agent.inference.runtime.tensors import encode_npy
from contracts.deadline import AnswerReserve
from predictor.batching import BatchingProfile

X = encode_npy(np.zeros((1, 2), np.float32))
NPY = {"Content-Type": "application/x-npy"}
TINY = {"tiny": BatchingProfile.linear("tiny", "sim", 0.01, 0.05, max_batch=8)}


@pytest.fixture()
def served() -> Iterator[tuple[str, ServingRuntime]]:
    clock = MonotonicClock()
    rt = ServingRuntime(SimExecutor(TINY, clock, "sim"), clock, RuntimeConfig("sim"),
                        post_workers=1)
    rt.add_slo_session("fast", "tiny", 100, 5)
    with served_over_http(rt, threads=2) as url:
        yield url, rt


def _session(rt: ServingRuntime, name: str = "fast") -> dict:
    return next(s for s in rt.snapshot()["sessions"] if s["name"] == name)


def test_one_slow_write_counts_before_fifty_were_seen(served) -> None:
    """Regression: the reserve was 0 until 50 answers had been written, so the first
    slow writes could still turn into 200s after the deadline."""
    base, rt = served
    rt.path_cost.observe_write(10_000.0)
    answer = httpx.post(f"{base}/v1/sessions/fast/infer", content=X, headers=NPY)
    assert answer.status_code == 503  # a certain miss: dropped before it ran
    assert answer.json()["reason"] == "deadline_expired"
    assert _session(rt)["good"] == 0


class _GrowingReserve(RequestPathCost):
    """A write reserve that grows between a request's queueing and its last check."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def write_reserve_ms(self) -> float:
        self.calls += 1
        return 0.0 if self.calls % 2 else 10_000.0


def test_the_last_check_answers_a_miss_not_a_late_200(served) -> None:
    base, rt = served
    rt.path_cost = _GrowingReserve()
    answer = httpx.post(f"{base}/v1/sessions/fast/infer", content=X, headers=NPY)
    assert answer.status_code == 503 and answer.json()["reason"] == "deadline_missed"
    row = _session(rt)  # served in time by the executor, too late to answer
    assert row["served"] == 1 and row["good"] == 0 and row["late"] == 1


def test_the_start_up_wake_up_tail_is_kept_back() -> None:
    """Regression: the client's wake-up to read the answer was kept nowhere."""
    cost = RequestPathCost(PathFigures(0.0, 0.0, 0.0, wake_ms=30.0, write_ms=2.0))
    assert cost.write_reserve_ms() == 32.0
    for _ in range(60):  # serving shows a worse wake-up: the executor's hand-off
        cost.observe_crossing(100.0)
    assert cost.write_reserve_ms() == 102.0 and cost.crossing_ms() == 100.0


def test_error_answers_teach_the_write_reserve(served) -> None:
    """Regression: only 200s were timed, so a server answering mostly errors learned
    nothing about its writes."""
    base, rt = served
    for _ in range(3):
        bad = httpx.post(f"{base}/v1/sessions/fast/infer", content=b"junk", headers=NPY)
        assert bad.status_code == 400
    deadline = time.monotonic() + 5
    while rt.path_cost.answer.reserve_ms() == 0.0 and time.monotonic() < deadline:
        time.sleep(0.01)  # the write is timed when the connection's answer is closed
    assert rt.path_cost.answer.reserve_ms() > 0.0


def test_a_request_dropped_before_the_queue_is_counted(served) -> None:
    """Regression: a request whose deadline passed before a worker took it was answered
    503 but counted nowhere (the server's attainment looked better than the client's)."""
    base, rt = served
    passed = f"{time.time() * 1000.0 - 5.0:.3f}"
    answer = httpx.post(f"{base}/v1/sessions/fast/infer", content=X,
                        headers={**NPY, "X-Tandem-Deadline": passed})
    assert answer.status_code == 503 and answer.json()["reason"] == "deadline_expired"
    row = _session(rt)
    assert row["arrived"] == 1 and row["drop_reasons"] == {"deadline_expired": 1}
    assert row["slo_attainment"] == 0.0
    # Its deadline had passed before it arrived: not a miss the server could hold.
    assert row["held"]["scaled_down"] is False
    assert row["held"]["recent_misses"] == 0


def test_answer_reserve_floor_and_bad_samples() -> None:
    reserve = AnswerReserve(floor_ms=3.0, min_samples=5)
    reserve.observe(float("nan"))
    reserve.observe(-1.0)
    assert reserve.reserve_ms() == 3.0
    assert reserve.too_late(98.0, 100.0) and not reserve.too_late(96.0, 100.0)
    assert not reserve.too_late(1e9, None)


def test_hold_scales_down_on_misses_and_back_up() -> None:
    rule = HoldRule(window=100, cooldown_ms=1000.0, min_rps=1.0)
    hold = Hold(40.0, 0.0, rule)
    for i in range(50):
        hold.outcome(i % 10 == 0)  # 10% missed: each dropped alone, the rate is kept
    assert not hold.review(1000.0, "busy") and hold.reason is None
    for i in range(50):
        hold.outcome(i % 10 != 0)  # 90% of the next 50: 50 of 100, not more than half
    assert not hold.review(1000.0, "busy")
    hold.outcome(True)
    hold.outcome(True)  # the window keeps the last 100: 51 of them missed
    assert hold.review(1000.0, "busy")
    assert hold.rate_rps == 20.0 and "HostBusier: 51 of the last 100" in (hold.reason or "")
    # Above the held rate, requests are shed: a burst of 40 at once gets ~10 through.
    taken = sum(hold.take(1000.0) for _ in range(40))
    assert taken == 10 and hold.shed == 30
    for _ in range(30):
        hold.outcome(False)
    assert not hold.review(1500.0, "quiet")  # within the cool-down: stays
    assert hold.review(2500.0, "quiet") and hold.rate_rps == 30.0
    for _ in range(30):
        hold.outcome(False)
    assert hold.review(4000.0, "quiet") and hold.rate_rps == 40.0 and hold.reason is None
    assert all(hold.take(4000.0) for _ in range(100))  # not scaled down: nothing shed


def test_hold_stops_at_none_and_probes_back() -> None:
    hold = Hold(1.5, 0.0, HoldRule(window=8, cooldown_ms=1000.0, min_rps=1.0))
    for _ in range(4):
        hold.outcome(True)
    assert hold.review(0.0, "busy") and hold.rate_rps == 0.0
    assert not hold.take(10_000.0) or not hold.take(10_000.0)
    assert hold.review(2000.0, "quiet") and hold.rate_rps == 1.0  # tries again, slowly


def test_a_busier_host_scales_an_admitted_session_down() -> None:
    """Requests start missing at the server after admission: once a rate window, the
    session is scaled down, shown with its reason in GET /v1/sessions and metrics, and
    requests above the held rate are answered at once with ``scaled_down``."""
    clock = VirtualClock()
    rt = ServingRuntime(SimExecutor(TINY, clock, "sim"), clock, RuntimeConfig("sim"))
    rt.add_slo_session("s", "tiny", 50, 40)
    for _ in range(60):
        rt.note_answer("s", DropReason.DEADLINE_EXPIRED, counted=False)
    assert _session(rt, "s")["held"]["scaled_down"] is False
    clock.advance_to(1500.0)
    rt.step()
    held = _session(rt, "s")["held"]
    assert held["scaled_down"] and held["rate_rps"] == 20.0 and held["admitted_rps"] == 40
    assert held["reason"].startswith("HostBusier: 60 of the last 60")
    outcomes: list[Outcome] = []
    for _ in range(30):
        rt.submit("s", np.zeros((1, 2), np.float32), outcomes.append)
    shed = [o for o in outcomes if o.reason is DropReason.SCALED_DOWN]
    assert len(shed) == 20  # a burst of 10 tokens (0.5 s at 20 rps) went through
    assert _session(rt, "s")["drop_reasons"]["scaled_down"] == 20
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    create_app(rt, registry=registry)
    text = generate_latest(registry).decode()
    assert 'tandem_server_scaled_down{kind="slo",session="s"} 1.0' in text
    assert 'tandem_server_held_rate_rps{kind="slo",rate="held",session="s"} 20.0' in text


def test_on_time_answers_keep_the_session_at_its_rate() -> None:
    clock = VirtualClock()
    rt = ServingRuntime(SimExecutor(TINY, clock, "sim"), clock, RuntimeConfig("sim"))
    rt.add_slo_session("s", "tiny", 50, 40)
    for i in range(200):
        rt.note_answer("s", DropReason.DEADLINE_MISSED if i == 0 else None)
    rt.note_answer("s", DropReason.SESSION_REMOVED)  # not the host's doing: not a miss
    clock.advance_to(1500.0)
    rt.step()
    assert _session(rt, "s")["held"]["scaled_down"] is False


def test_admission_measures_the_host_again() -> None:
    """Regression: the request path's cores were measured once at start-up, so a CPU hog
    that started later never counted at admission."""
    from agent.inference.errors import AdmissionRefused
    from agent.inference.runtime.pathcost import HostLimits, RequestPathLimits

    shares = [1.0]
    now = [0.0]
    limits = HostLimits(lambda: RequestPathLimits(workers=100, cores=shares[0], max_load=0.9),
                        max_age_s=2.0, timer=lambda: now[0])
    clock = VirtualClock()
    rt = ServingRuntime(SimExecutor(TINY, clock, "sim"), clock, RuntimeConfig("sim"),
                        path_cost=RequestPathCost(PathFigures(0.0, 0.0, cpu_ms=0.5)),
                        path_limits=limits)
    assert rt.add_slo_session("a", "tiny", 50, 100)["request_path"]["cores"] == 1.0
    shares[0] = 0.1  # a hog takes the cores; measured again only once the last is old
    assert rt.add_slo_session("b", "tiny", 50, 1)["request_path"]["cores"] == 1.0
    now[0] = 10.0
    with pytest.raises(AdmissionRefused) as refused:
        rt.add_slo_session("c", "tiny", 50, 100)
    assert refused.value.to_json()["reason"].startswith("RequestPath")


def test_a_waiter_is_answered_without_a_post_thread_hand_off() -> None:
    """A future's result wakes its waiter from the executor's thread (one thread hand-off
    fewer on a busy host); other callbacks still go to the post-processing threads."""
    clock = MonotonicClock()
    rt = ServingRuntime(SimExecutor(TINY, clock, "sim"), clock, RuntimeConfig("sim"),
                        post_workers=1)
    rt.add_slo_session("s", "tiny", 1000, 5)
    rt.start()
    try:
        threads: list[str] = []
        assert rt.submit_future("s", np.zeros((1, 2), np.float32)).result(5).reason is None
        for inline in (True, False):
            done = threading.Event()
            rt.submit("s", np.zeros((1, 2), np.float32),
                      lambda _o, done=done: (threads.append(threading.current_thread().name),
                                             done.set()),
                      inline=inline)
            assert done.wait(5)
    finally:
        rt.stop()
    assert threads[0] == "tandem-gpu" and threads[1].startswith("tandem-post")


def test_the_server_settles_its_heap_when_sessions_change() -> None:
    """What is alive after a registration (models, modules) is moved out of the cyclic
    collector's reach, so a full collection does not stop every thread while serving."""
    import gc

    clock = VirtualClock()
    rt = ServingRuntime(SimExecutor(TINY, clock, "sim"), clock, RuntimeConfig("sim"))
    client = create_app(rt, freeze_gc=True).test_client()
    try:
        gc.unfreeze()
        answer = client.post("/v1/sessions", json={"name": "s", "model": "tiny",
                                                   "slo_ms": 50, "rate_rps": 5})
        assert answer.status_code == 201 and gc.get_freeze_count() > 0
        gc.unfreeze()
        assert client.delete("/v1/sessions/s").status_code == 200
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
        plain = create_app(rt).test_client()  # in-process use: the process is the caller's
        plain.post("/v1/sessions", json={"name": "t", "model": "tiny", "slo_ms": 50,
                                         "rate_rps": 5})
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
