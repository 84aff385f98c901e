"""Deadlines counted from arrival and checked where requests wait; the request path's
own cost counted by admission (issue: serving that holds what it admits)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from server_helpers import served_over_http

from agent.inference.clock import MonotonicClock, VirtualClock
from agent.inference.errors import AdmissionRefused, DropReason
from agent.inference.executors.executors import SimExecutor
from agent.inference.runtime.pathcost import (
    PathFigures,
    PathLoad,
    RequestPathCost,
    RequestPathLimits,
    queue_tail_ms,
)
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from agent.inference.runtime.stats import Outcome
from predictor.batching import BatchingProfile

X = np.zeros((1, 2), np.float32)


def _npy(array: np.ndarray) -> bytes:
    from agent.inference.runtime.tensors import encode_npy

    return encode_npy(array)


@pytest.fixture()
def served() -> Iterator[tuple[str, ServingRuntime]]:
    """A real cheroot server with ONE worker over a sim runtime on the real clock:
    a slow request holds the worker while the next waits in cheroot's queue."""
    clock = MonotonicClock()
    profiles = {"tiny": BatchingProfile.linear("tiny", "sim", 0.01, 0.05, max_batch=8),
                "slow": BatchingProfile.linear("slow", "sim", 300.0, 1.0, max_batch=1)}
    rt = ServingRuntime(SimExecutor(profiles, clock, "sim"), clock, RuntimeConfig("sim"),
                        post_workers=1)
    rt.add_slo_session("fast", "tiny", 100, 5)
    rt.add_slo_session("roomy", "tiny", 10_000, 5)
    rt.add_best_effort_session("hog", "slow")
    with served_over_http(rt, threads=1) as url:
        yield url, rt


def test_time_waiting_for_a_worker_counts_against_the_deadline(served) -> None:
    """The fast request waits ~300 ms for the only worker (its SLO is 100 ms): it must
    be refused, not answered 200 late (before: its clock started when a worker took it)."""
    base, rt = served
    answers: dict[str, httpx.Response] = {}

    def post(name: str) -> None:
        answers[name] = httpx.post(f"{base}/v1/sessions/{name}/infer", content=_npy(X),
                                   headers={"Content-Type": "application/x-npy"}, timeout=10)

    hog = threading.Thread(target=post, args=("hog",))
    hog.start()
    while not any(s["name"] == "hog" and s["arrived"] for s in rt.snapshot()["sessions"]):
        time.sleep(0.005)  # until the hog's request holds the only worker
    started = time.monotonic()
    post("fast")
    hog.join()
    assert answers["hog"].status_code == 200
    assert time.monotonic() - started > 0.1  # it did wait past its SLO
    assert answers["fast"].status_code == 503, answers["fast"].text
    assert answers["fast"].json()["reason"] == DropReason.DEADLINE_EXPIRED.value
    # The server's own count agrees: nothing was served late.
    fast = next(s for s in rt.snapshot()["sessions"] if s["name"] == "fast")
    assert fast["good"] == fast["served"]


def test_client_deadline_header(served) -> None:
    base, _rt = served
    url = f"{base}/v1/sessions/roomy/infer"  # a 10 s SLO: the client's deadline decides
    npy = {"Content-Type": "application/x-npy"}
    ok = httpx.post(url, content=_npy(X), headers={**npy, "X-Tandem-Timeout-Ms": "3000"})
    assert ok.status_code == 200
    gone = httpx.post(url, content=_npy(X), headers={**npy, "X-Tandem-Timeout-Ms": "0.001"})
    assert gone.status_code == 503 and gone.json()["reason"] in {"deadline_expired", "timeout"}
    for bad in ("0", "-5", "abc", "1e9"):
        answer = httpx.post(url, content=_npy(X), headers={**npy, "X-Tandem-Timeout-Ms": bad})
        assert answer.status_code == 400 and "X-Tandem-Timeout-Ms" in answer.json()["message"]
    assert httpx.post(url, content=_npy(X),
                      headers={**npy, "X-Tandem-Late": "yes"}).status_code == 400
    # An absolute deadline counts time before the server saw the request at all.
    now = time.time() * 1000
    ok = httpx.post(url, content=_npy(X), headers={**npy, "X-Tandem-Deadline": f"{now + 3000}"})
    assert ok.status_code == 200
    past = httpx.post(url, content=_npy(X), headers={**npy, "X-Tandem-Deadline": f"{now - 1}"})
    assert past.status_code == 503 and past.json()["reason"] == "deadline_expired"
    for bad in ("soon", "nan", f"{now + 10**9}"):
        answer = httpx.post(url, content=_npy(X), headers={**npy, "X-Tandem-Deadline": bad})
        assert answer.status_code == 400 and "X-Tandem-Deadline" in answer.json()["message"]


def _late_runtime() -> tuple[ServingRuntime, VirtualClock]:
    """Planned at 1 ms a batch, executed at 80 ms: every batch finishes after a 50 ms SLO."""
    clock = VirtualClock()
    planned = {"m": BatchingProfile.linear("m", "sim", 0.01, 1.0, max_batch=4)}
    executed = {"m": BatchingProfile.linear("m", "sim", 0.01, 80.0, max_batch=4)}
    rt = ServingRuntime(SimExecutor(executed, clock, "sim"), clock, RuntimeConfig("sim"),
                        profiles=planned)
    rt.add_slo_session("s", "m", 50, 10)
    return rt, clock


def test_late_outputs_only_for_clients_that_accept_them() -> None:
    rt, _clock = _late_runtime()
    got: list[Outcome] = []
    for late_ok in (False, True):
        rt.submit("s", X, got.append, late_ok=late_ok)
        while rt.step():
            pass
    plain, accepting = got
    assert plain.reason is DropReason.DEADLINE_MISSED and plain.outputs is None
    assert accepting.reason is None and accepting.late and accepting.outputs is not None


def test_deadline_checked_before_queueing() -> None:
    rt, clock = _late_runtime()
    clock.advance_to(1000.0)
    got: list[Outcome] = []
    rt.submit("s", X, got.append, arrival_ms=900.0)  # arrived 100 ms ago, SLO 50 ms
    rt.submit("s", X, got.append, deadline_ms=1000.5)  # the client's deadline: in 0.5 ms
    assert [o.reason for o in got] == [DropReason.DEADLINE_EXPIRED] * 2
    snap = rt.snapshot()["sessions"][0]
    assert snap["drop_reasons"] == {"deadline_expired": 2} and snap["queue"] == 0


def _sim_runtime(path: PathFigures, limits: RequestPathLimits | None = None) -> ServingRuntime:
    clock = VirtualClock()
    profiles = {"m": BatchingProfile.linear("m", "sim", 2.0, 1.0, max_batch=16)}
    return ServingRuntime(SimExecutor(profiles, clock, "sim"), clock, RuntimeConfig("sim"),
                          profiles=profiles, path_cost=RequestPathCost(path),
                          path_limits=limits)


def test_admission_takes_the_request_paths_time_from_the_slo() -> None:
    assert _sim_runtime(PathFigures(0, 0, 0)).add_slo_session("s", "m", 12, 100)
    slow_path = _sim_runtime(PathFigures(front_ms=6.0, back_ms=3.0, cpu_ms=0.0))
    with pytest.raises(AdmissionRefused) as refused:
        slow_path.add_slo_session("s", "m", 12, 100)  # 3 ms left for d + l(b)
    assert "request path's own 9 ms" in refused.value.message
    assert slow_path.snapshot()["sessions"] == []


def test_admission_refuses_what_the_request_paths_cpu_cannot_hold() -> None:
    limits = RequestPathLimits(workers=1000, cores=1.0, max_load=0.5)
    rt = _sim_runtime(PathFigures(0.1, 0.1, cpu_ms=2.0), limits)
    with pytest.raises(AdmissionRefused) as refused:
        rt.add_slo_session("s", "m", 200, 400)  # 400 rps x 2 ms = 0.8 cores > 0.5
    err = refused.value.to_json()
    assert err["reason"] == "RequestPathCpu"
    assert err["required"] == pytest.approx(0.8, rel=0.01) and err["available"] == 0.5
    holdable = err["holdable_rate_rps"]
    assert 240 <= holdable <= 250  # 0.5 cores / 2 ms = 250 rps
    assert rt.add_slo_session("s", "m", 200, holdable)["name"] == "s"  # scaled down, admitted


def test_admission_refuses_what_the_workers_cannot_hold() -> None:
    limits = RequestPathLimits(workers=8, cores=100.0)
    rt = _sim_runtime(PathFigures(0.1, 0.1, 0.0), limits)
    with pytest.raises(AdmissionRefused) as refused:
        rt.add_slo_session("s", "m", 200, 400)  # ~200 ms held x 400 rps: ~80 in flight
    err = refused.value.to_json()
    assert err["reason"] == "RequestWorkers" and err["available"] == 8
    assert 0 < err["holdable_rate_rps"] < 400


def test_observed_request_path_time_replans() -> None:
    rt = _sim_runtime(PathFigures(0.1, 0.1, 0.0))
    rt.add_slo_session("s", "m", 40, 200)
    batch_before = rt.planning.plan.allocations[0].batch
    for _ in range(60):  # serving shows 15 ms per request before the queue
        rt.path_cost.observe_front(15.0)
        rt.path_cost.observe(back_ms=0.5, cpu_ms=0.2)
    assert rt.path_cost.figures().front_ms == pytest.approx(15.0)
    rt.clock.advance_to(2000.0)
    rt.step()
    assert rt.planning.replans == 1
    assert rt.planning.plan.allocations[0].batch < batch_before  # less time left: smaller batches
    assert rt.snapshot()["request_path"]["front_ms"] == pytest.approx(15.0)


def test_queue_tail_of_the_request_path() -> None:
    limits = RequestPathLimits(workers=100, cores=0.1)
    figures = PathFigures(0.0, 0.0, cpu_ms=0.5)
    # 100 rps x 0.5 ms = 0.05 cores of 0.1: rho 0.5, 5 ms per request at this share.
    tail = queue_tail_ms([PathLoad(100.0, 50.0, 0.0)], figures, limits)
    assert tail == pytest.approx(5.0 * math.log(100) / 0.5)
    assert queue_tail_ms([PathLoad(200.0, 50.0, 0.0)], figures, limits) == math.inf
    assert queue_tail_ms([PathLoad(100.0, 50.0, 0.0)], figures, None) == 0.0


def test_admission_counts_the_request_paths_queue() -> None:
    """A host that gives the path a tenth of a core: 100 rps would queue ~46 ms at p99,
    which a 50 ms SLO cannot spare; the refusal names a lower rate, which is admitted."""
    limits = RequestPathLimits(workers=100, cores=0.1, max_load=0.9)
    rt = _sim_runtime(PathFigures(0.0, 0.0, cpu_ms=0.5), limits)
    with pytest.raises(AdmissionRefused) as refused:
        rt.add_slo_session("s", "m", 50, 100)
    err = refused.value.to_json()
    assert "request path's own" in err["message"]
    assert 0 < err["holdable_rate_rps"] < 100
    assert rt.add_slo_session("s", "m", 50, err["holdable_rate_rps"])["name"] == "s"
    assert rt.planning.queue_ms > 0


def test_a_path_queue_longer_than_the_slo_is_its_own_reason() -> None:
    limits = RequestPathLimits(workers=100, cores=0.1, max_load=0.9)
    rt = _sim_runtime(PathFigures(0.0, 0.0, cpu_ms=0.5), limits)
    with pytest.raises(AdmissionRefused) as refused:
        rt.add_slo_session("s", "m", 50, 150)  # rho 0.75: ~92 ms at p99 on the path alone
    err = refused.value.to_json()
    assert err["reason"] == "RequestPathQueue" and err["available"] == 50
    assert err["required"] == pytest.approx(5.0 * math.log(100) / 0.25)
    assert 0 < err["holdable_rate_rps"] < 150


def test_the_last_check_keeps_time_to_write_the_answer(served) -> None:
    """Writing answers has been taking 10 s (as observed): a 100 ms SLO cannot be met
    once the answer is ready, so it is refused (before it runs: a certain miss), unless
    the client accepts late answers."""
    base, rt = served
    for _ in range(60):
        rt.path_cost.observe_write(10_000.0)
    assert rt.path_cost.write_reserve_ms() == 10_000.0
    url = f"{base}/v1/sessions/fast/infer"
    npy = {"Content-Type": "application/x-npy"}
    refused = httpx.post(url, content=_npy(X), headers=npy)
    assert refused.status_code == 503 and refused.json()["reason"] == "deadline_expired"
    late = httpx.post(url, content=_npy(X), headers={**npy, "X-Tandem-Late": "accept"})
    assert late.status_code == 200 and late.headers["X-Tandem-Late"] == "true"


def test_write_reserve_from_the_first_answer_and_the_quantile_once_enough() -> None:
    cost = RequestPathCost(min_samples=50)
    assert cost.write_reserve_ms() == 0.0  # nothing measured, nothing observed
    cost.observe_write(30.0)  # one slow write: kept until the quantile has samples
    assert cost.write_reserve_ms() == 30.0
    for _ in range(199):
        cost.observe_write(5.0)
    assert cost.write_reserve_ms() == 5.0


def test_the_executor_deadline_keeps_the_typical_time_back() -> None:
    cost = RequestPathCost(PathFigures(0.0, back_ms=2.0, cpu_ms=0.0), min_samples=50)
    assert cost.back_reserve_ms() == 2.0  # the start-up figure until answers were seen
    for i in range(100):  # a heavy tail: the p99 is 40 ms, the median 1 ms
        cost.observe_front(1.0)
        cost.observe(back_ms=40.0 if i % 50 == 0 else 1.0, cpu_ms=0.1)
    assert cost.figures().back_ms == 40.0 and cost.back_reserve_ms() == 1.0


def test_the_server_keeps_the_interpreter_lock_switch_interval() -> None:
    """Regression (issue #43): a 1 ms switch interval set by the server made the request
    path's p99 four times longer for clients in another process on a 2-core host; the
    server leaves the process's interval as it found it and calibrates under it."""
    import dataclasses
    import sys
    import threading

    from agent.inference.http.serve import ServeOptions, serve_forever

    fields = {f.name: None for f in dataclasses.fields(ServeOptions)}
    options = ServeOptions(**{**fields, "host": "127.0.0.1", "port": 0, "http_threads": 2,
                              "max_body_bytes": 1 << 20, "read_deadline_seconds": 30.0})
    clock = MonotonicClock()
    rt = ServingRuntime(SimExecutor({}, clock, "sim"), clock, RuntimeConfig("sim"))
    before, stop = sys.getswitchinterval(), threading.Event()
    served = threading.Thread(target=serve_forever, args=(rt, options, None, stop), daemon=True)
    try:
        served.start()
        # Start-up calibrates the request path (about 4 s on a quiet 2-core host, twice
        # that where the first measurement met a stall, as on a busy CI host).
        for _ in range(1500):
            if rt.is_running():
                break
            time.sleep(0.02)
        assert rt.is_running()
        assert sys.getswitchinterval() == pytest.approx(before)
        assert rt.path_cost.startup.wake_ms > 0  # calibrated before serving
    finally:
        stop.set()
        served.join(timeout=15)
    assert not served.is_alive()
