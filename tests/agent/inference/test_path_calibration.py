"""The request path's start-up figures from real requests (``http.calibration``), and
admission planning with the whole path's tail instead of its steps' tails added."""

from __future__ import annotations

import math

import pytest

from agent.inference.clock import VirtualClock
from agent.inference.errors import AdmissionRefused
from agent.inference.executors.executors import SimExecutor
from agent.inference.http.calibration import (
    CLIENT_TIMEOUT_S,
    RateSample,
    _figures,
    _queue_scale,
    measure,
)
from agent.inference.runtime.pathcost import (
    PathFigures,
    PathLoad,
    RequestPathCost,
    RequestPathLimits,
    path_queue_ms,
    queue_tail_ms,
)
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from predictor.batching import BatchingProfile


def _request(rid: int, which: int, start: float, front: float, executor: float,
             back: float, wake: float) -> tuple[list[float], dict[str, float]]:
    """One client record and the server's stamps (seconds; 1 ms to connect, 0.5 to write)."""
    arrived = start + 0.001
    submitted = arrived + front
    ready = submitted + executor
    done = ready + back
    written = done + 0.0005
    row = {"arrived": arrived, "submitted": submitted, "ready": ready,
           "resumed": ready + back / 2, "done": done, "written": written}
    return [rid, 200, start, written + wake, which], row


def test_the_whole_path_is_one_tail_not_its_steps_tails_added() -> None:
    """Each request meets one slow step at most (front, back or the client's wake-up,
    30 ms each, in different requests): the steps' p99s add to over 90 ms, while no
    request spent more than 34 ms on the path."""
    records, rows = [], {}
    for rid in range(200):
        slow = [0.0, 0.0, 0.0]
        if rid % 20 == 0:
            slow[(rid // 20) % 3] = 0.030
        rec, row = _request(rid, 0, rid * 0.01, 0.001 + slow[0], 0.050, 0.001 + slow[1],
                            0.0005 + slow[2])
        records.append(rec)
        rows[rid] = row
    figures, samples = _figures(records, rows, (50.0,), [0.4])
    steps = figures.front_ms + figures.back_ms + figures.wake_ms
    assert steps > 90.0
    # connect, front, back, write and wake, one of them slow; the executor's 50 ms aside
    assert figures.path_ms == pytest.approx(34.0, abs=0.5)
    assert figures.cpu_ms == pytest.approx(2.0)  # 0.4 s of CPU over 200 answers
    assert samples[0].answered == 200


def test_unanswered_requests_are_in_the_tail_at_the_clients_timeout() -> None:
    records, rows = [], {}
    for rid in range(200):
        rec, row = _request(rid, 0, rid * 0.01, 0.001, 0.001, 0.001, 0.0005)
        records.append(rec)
        rows[rid] = row
    fast, _ = _figures(records, rows, (50.0,), [0.4])
    assert fast.path_ms < 10.0
    refused = [[200 + i, 503, 2.0, 2.001, 0] for i in range(3)]  # 3 of 203: over 1%
    slow, samples = _figures(records + refused, rows, (50.0,), [0.4])
    assert slow.path_ms == CLIENT_TIMEOUT_S * 1000 and samples[0].answered == 200
    with pytest.raises(RuntimeError, match="0 of 3 requests at 50/s answered"):
        _figures(refused, {}, (50.0,), [0.1])


def test_the_queue_counts_as_much_as_the_rates_showed() -> None:
    figures = PathFigures(0.0, 0.0, cpu_ms=2.0, path_ms=5.0, path_rate_rps=50.0)
    limits = RequestPathLimits(workers=1024, cores=1.0)
    at90 = math.log(10.0) / math.log(100.0)
    foreseen = (queue_tail_ms([PathLoad(200.0, 0.0, 0.0)], figures, limits)
                - queue_tail_ms([PathLoad(50.0, 0.0, 0.0)], figures, limits)) * at90
    grew_more = [RateSample(50.0, 100, 5.0, 4.0, 2.0),
                 RateSample(200.0, 200, 80.0, 4.0 + 3 * foreseen, 2.0)]
    assert _queue_scale(figures, grew_more) == pytest.approx(3.0)
    grew_less = [RateSample(50.0, 100, 5.0, 4.0, 2.0), RateSample(200.0, 200, 9.0, 6.0, 2.0)]
    assert _queue_scale(figures, grew_less) == 1.0  # never below the model


def test_the_queue_beyond_the_rate_the_path_was_measured_at() -> None:
    """The whole path measured at 50 rps holds that rate's queue: only more counts."""
    limits = RequestPathLimits(workers=1024, cores=1.0)
    steps = PathFigures(0.0, 0.0, cpu_ms=2.0)
    measured = PathFigures(0.0, 0.0, cpu_ms=2.0, path_ms=5.0, path_rate_rps=50.0)
    at = {r: queue_tail_ms([PathLoad(r, 0.0, 0.0)], steps, limits) for r in (30.0, 50.0, 200.0)}
    assert path_queue_ms([PathLoad(200.0, 0.0, 0.0)], steps, limits) == at[200.0]
    assert path_queue_ms([PathLoad(200.0, 0.0, 0.0)], measured, limits) == pytest.approx(
        at[200.0] - at[50.0])
    assert path_queue_ms([PathLoad(30.0, 0.0, 0.0)], measured, limits) == 0.0
    assert path_queue_ms([PathLoad(600.0, 0.0, 0.0)], measured, limits) == math.inf


def test_own_time_is_the_measured_whole_path_and_the_scaled_queue() -> None:
    cost = RequestPathCost(PathFigures(front_ms=20.0, back_ms=20.0, cpu_ms=1.0, wake_ms=10.0,
                                       path_ms=8.0, queue_scale=2.0), min_samples=50)
    # The path measured, its queue scaled, and what the last check will keep back beyond
    # the client's wake-up the path held: the way back (20 ms) stands for the hand-off.
    assert cost.own_ms(3.0) == pytest.approx(8.0 + 6.0 + (20.0 - 10.0))
    # Served requests that spend longer (front and back of the same request) raise it.
    for _ in range(100):
        cost.observe_front(30.0)
        cost.observe(back_ms=10.0, cpu_ms=1.0, front_ms=30.0)
        cost.observe_write(1.0)
    assert cost.own_ms(3.0) == pytest.approx(40.0 + cost.write_reserve_ms())
    # Without a whole-path measurement, the steps' tails are added as before.
    steps = RequestPathCost(PathFigures(front_ms=20.0, back_ms=20.0, cpu_ms=1.0))
    assert steps.own_ms(3.0) == pytest.approx(43.0)


def _sim_runtime(path: PathFigures) -> ServingRuntime:
    clock = VirtualClock()
    profiles = {"m": BatchingProfile.linear("m", "sim", 2.0, 1.0, max_batch=16)}
    return ServingRuntime(SimExecutor(profiles, clock, "sim"), clock, RuntimeConfig("sim"),
                          profiles=profiles, path_cost=RequestPathCost(path),
                          path_limits=RequestPathLimits(workers=64, cores=1.0))


def test_a_50ms_session_is_admitted_when_real_requests_showed_the_path_holds_it() -> None:
    """Regression (issue #43): the steps' tails added (front 20 + back 20 + a 12 ms wake)
    refused a 50 ms session on a quiet 2-core host whose requests spent 5-20 ms on the
    path; the whole path as real requests met it admits it."""
    steps = dict(front_ms=20.0, back_ms=20.0, cpu_ms=2.0, wake_ms=12.0)
    with pytest.raises(AdmissionRefused) as refused:
        _sim_runtime(PathFigures(**steps)).add_slo_session("c50", "m", 50, 20)
    assert refused.value.to_json()["reason"] == "RequestPathQueue"
    rt = _sim_runtime(PathFigures(**steps, path_ms=10.0))
    answer = rt.add_slo_session("c50", "m", 50, 20)
    assert answer["promised"]["rate_rps"] == 20
    assert answer["request_path"]["path_ms"] == 10.0


def test_a_path_measured_slower_than_the_slo_names_the_measurement() -> None:
    rt = _sim_runtime(PathFigures(front_ms=1.0, back_ms=1.0, cpu_ms=2.0, path_ms=60.0))
    with pytest.raises(AdmissionRefused) as refused:
        rt.add_slo_session("c50", "m", 50, 20)
    assert "measured through the HTTP front with real requests" in refused.value.message


def test_real_requests_through_a_real_front() -> None:
    """Another process sends real requests over loopback; the stand-in executor's time
    (here 5 ms a batch) is not the path's, its CPU not the path's either."""
    calls = []

    def work() -> None:
        calls.append(1)
        sum(range(20_000))

    figures, samples = measure(4, rates=(40.0, 80.0), seconds=(0.5, 0.3), work=work)
    assert calls and [s.rate_rps for s in samples] == [40.0, 80.0]
    assert [r for r, _share in figures.executor_at] == [40.0, 80.0]
    assert all(0.05 <= share <= 1.0 for _r, share in figures.executor_at)
    assert samples[0].answered >= 5
    assert 0 < figures.path_ms < 1000 and 0 < figures.cpu_ms < 100
    assert figures.front_ms > 0 and figures.write_ms > 0 and figures.queue_scale >= 1.0
    assert figures.path_rate_rps == 40.0


def test_the_app_is_warmed_up_before_it_listens() -> None:
    """Requests for a session that does not exist: answered 404, nothing registered, and
    the answers' writes do not count as the request path's."""
    from agent.inference.clock import MonotonicClock
    from agent.inference.http.app import create_app
    from agent.inference.http.serve import warm_up

    clock = MonotonicClock()
    rt = ServingRuntime(SimExecutor({}, clock, "sim"), clock, RuntimeConfig("sim"))
    app = create_app(rt)
    seen = []
    answer = app.wsgi_app  # the inference route is answered before Flask's hooks

    def recorded(environ, start_response):
        def start(status, headers, exc_info=None):
            seen.append(int(status.split()[0]))
            return start_response(status, headers, exc_info)
        return answer(environ, start)

    app.wsgi_app = recorded
    warm_up(app, repeats=3)
    assert seen == [404, 200] * 3
    assert rt.snapshot()["sessions"] == [] and rt.path_cost.observed == 0


def test_the_executor_share_beside_the_path_at_the_sessions_rate() -> None:
    """Linear between the calibration's rates (the lowest rate's below it), along the
    last two beyond them, never below 0.05; none measured: a whole core."""
    figures = PathFigures(0.0, 0.0, 0.0, executor_at=((75.0, 0.9), (200.0, 0.5)))
    assert figures.executor_share(0.0) == 0.9
    assert figures.executor_share(37.5) == pytest.approx(0.9)
    assert figures.executor_share(137.5) == pytest.approx(0.7)
    assert figures.executor_share(325.0) == pytest.approx(0.1)
    assert figures.executor_share(2000.0) == 0.05
    assert PathFigures(0.0, 0.0, 0.0).executor_share(500.0) == 1.0
    assert figures.to_json()["executor_at"] == [[75.0, 0.9], [200.0, 0.5]]


def test_a_session_is_planned_at_the_executor_share_its_rate_leaves() -> None:
    """Regression (issue #43): an idle host gave the executor's priority a whole core at
    registration, and a 50 ms session admitted at 86 requests/s there lost 13% after
    admission (the executor ran 3x its profile once clients and the path loaded the
    host). The share the calibration measured beside the path at the sessions' rate
    plans it; the registration's probe of the host now still counts where lower."""
    from agent.inference.runtime.executor_tail import ExecutorHost

    def runtime(probe_share: float) -> ServingRuntime:
        clock = VirtualClock()
        profiles = {"m": BatchingProfile.linear("m", "sim", 2.0, 1.0, max_batch=16)}
        path = PathFigures(1.0, 1.0, 0.1, path_ms=2.0,
                           executor_at=((50.0, 0.8), (200.0, 0.4)))
        return ServingRuntime(SimExecutor(profiles, clock, "sim"), clock, RuntimeConfig("sim"),
                              profiles=profiles, path_cost=RequestPathCost(path),
                              executor_probe=lambda: ExecutorHost(0.0, probe_share))

    rt = runtime(1.0)
    assert rt.add_slo_session("a", "m", 100, 50)["executor_share"] == pytest.approx(0.8)
    assert rt.add_slo_session("b", "m", 100, 75)["executor_share"] == pytest.approx(0.6)
    hog = runtime(0.25)  # the probe sees a hog now: the lower share counts
    assert hog.add_slo_session("a", "m", 100, 50)["executor_share"] == pytest.approx(0.25)


def test_the_holdable_rate_is_tried_with_the_executor_its_own_rate_leaves() -> None:
    """A session refused at its rate (the executor's share beside the path at the rate
    all would send left nothing) names a rate this host holds, tried with the share at
    that rate, and is admitted at it; before, every rate was tried at the refused rate's
    share, and the answer was 0 requests/s."""
    from agent.inference.runtime.executor_tail import ExecutorHost

    clock = VirtualClock()
    profiles = {"m": BatchingProfile.linear("m", "sim", 2.0, 1.0, max_batch=16)}
    path = PathFigures(1.0, 1.0, 0.1, path_ms=2.0,
                       executor_at=((100.0, 1.0), (200.0, 0.1)))
    rt = ServingRuntime(SimExecutor(profiles, clock, "sim"), clock, RuntimeConfig("sim"),
                        profiles=profiles, path_cost=RequestPathCost(path),
                        executor_probe=lambda: ExecutorHost(0.0, 1.0))
    rt.add_slo_session("a", "m", 40, 100)
    with pytest.raises(AdmissionRefused) as refused:
        rt.add_slo_session("b", "m", 40, 200)
    holdable = refused.value.to_json()["holdable_rate_rps"]
    assert holdable >= 5.0
    assert rt.planning.margin.share == 1.0  # the executor as the admitted session leaves it
    assert rt.add_slo_session("b", "m", 40, holdable)["promised"]["rate_rps"] == holdable


def test_the_executor_share_is_its_runs_cpu_over_their_time_at_p99() -> None:
    """A stand-in whose runs wait as long as they compute (here: a sleep, as a preempted
    thread waits) got at most half a core at p99, whatever its mean."""
    import time

    def work() -> None:
        spin = time.thread_time() + 0.001
        while time.thread_time() < spin:
            pass
        time.sleep(0.002)

    figures, _ = measure(4, rates=(40.0,), seconds=(0.4,), work=work)
    assert len(figures.executor_at) == 1 and figures.executor_at[0][1] <= 0.5


def test_the_stand_in_route_is_answered_as_the_real_inference_route_is() -> None:
    """The start-up path is the served one: answered from the WSGI environ, no framework
    (the real route skips Flask, which cost more CPU than the rest of the path), the write
    stamped when the server closes the answer."""
    import io
    import threading
    from queue import SimpleQueue

    import numpy as np

    from agent.inference.http import calibration
    from agent.inference.runtime.tensors import decode_npy, encode_npy

    stamps, crossing = calibration._Stamps(), SimpleQueue()

    def executor() -> None:
        tensor, future = crossing.get()
        future.set_result((tensor * 2, 1.0))

    threading.Thread(target=executor, daemon=True).start()
    app = calibration._app(stamps, crossing)
    assert not hasattr(app, "url_map")  # not a Flask app
    body = encode_npy(np.ones((1, calibration.FLOATS), np.float32))
    seen: list[str] = []
    answer = app({"REQUEST_METHOD": "POST", "PATH_INFO": "/calibrate",
                  "HTTP_X_CALIBRATION_ID": "7", "CONTENT_LENGTH": str(len(body)),
                  "wsgi.input": io.BytesIO(body)}, lambda status, headers: seen.append(status))
    assert seen == ["200 OK"]
    assert float(decode_npy(b"".join(answer)).sum()) == 2.0 * calibration.FLOATS
    assert "written" not in stamps.rows[7]
    answer.close()
    assert {"arrived", "submitted", "ready", "resumed", "done", "written"} <= set(stamps.rows[7])
