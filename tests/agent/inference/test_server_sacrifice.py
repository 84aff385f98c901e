"""The order of sacrifice: when the host cannot hold every session, best effort gives
way first, then SLO sessions lowest priority first, each with a reason, and what
each session is promised is shown (issue #43: the sessions a server admitted come
first). Deterministic: outcomes are fed in, time is a virtual clock."""

from __future__ import annotations

import numpy as np
import pytest
from flask.testing import FlaskClient

from agent.inference.clock import VirtualClock
from agent.inference.errors import DropReason
from agent.inference.executors.executors import SimExecutor
from agent.inference.http.app import create_app
from agent.inference.runtime.holding import Hold, HoldRule
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from agent.inference.runtime.sacrifice import BestEffortThrottle, Held, Sacrifice
from agent.inference.runtime.stats import Outcome
from predictor.batching import BatchingProfile

RULE = HoldRule(window=100, cooldown_ms=1000.0, min_rps=1.0)
PROFILES = {"tiny": BatchingProfile.linear("tiny", "sim", 0.01, 0.05, max_batch=8),
            "conv": BatchingProfile.linear("conv", "sim", 2.0, 1.0, max_batch=4)}


def _miss(hold: Hold, misses: int, of: int = 50) -> None:
    for i in range(of):
        hold.outcome(i < misses)


def _sessions() -> tuple[Held, Held, Held]:
    """Registered in this order: ``first`` (priority 0), ``vip`` (1), ``last`` (0)."""
    return (Held("first", 0, Hold(40.0, 0.0, RULE)), Held("vip", 1, Hold(40.0, 0.0, RULE)),
            Held("last", 0, Hold(40.0, 0.0, RULE)))


def test_best_effort_gives_way_before_any_slo_session() -> None:
    sac = Sacrifice(RULE)
    first, vip, last = held = _sessions()
    _miss(vip.hold, 10)  # over the 1% target
    assert sac.review(1000.0, held, best_effort=True, why="host now")
    assert sac.best_effort.share == 0.0 and sac.best_effort.stopped
    assert "10 of the last 50 requests of vip" in (sac.best_effort.reason or "")
    assert "best effort gives way first" in (sac.best_effort.reason or "")
    assert all(h.hold.rate_rps == 40.0 and h.hold.reason is None for h in held)
    # Still missing a few with best effort at none: each is dropped where it cannot meet
    # its deadline, and no session is scaled down (that would shed half to save 20%).
    _miss(vip.hold, 10)
    assert not sac.review(2000.0, held, best_effort=True, why="host now")
    assert all(h.hold.rate_rps == 40.0 and h.hold.reason is None for h in held)
    # Losing most of a window: the host cannot serve the rate. The lowest priority
    # registered last gives way, not the session that missed (a busy host is shared).
    _miss(vip.hold, 50)
    assert sac.review(2500.0, held, best_effort=True, why="host now")
    assert last.hold.rate_rps == 20.0 and first.hold.rate_rps == 40.0
    assert vip.hold.rate_rps == 40.0
    assert "last gives way first" in (last.hold.reason or "")
    assert "HostBusier: 60 of the last 100 requests of vip" in (last.hold.reason or "")
    _miss(vip.hold, 30)
    sac.review(3000.0, held, best_effort=True, why="")
    assert last.hold.rate_rps == 10.0 and first.hold.rate_rps == 40.0


def test_slo_sessions_give_way_lowest_priority_then_missed_then_latest() -> None:
    sac = Sacrifice(RULE)
    first, vip, last = held = _sessions()
    now = 0.0
    order = []
    for _ in range(14):
        now += 1000.0
        _miss(first.hold, 30)
        sac.review(now, held, best_effort=False, why="")
        order.append((first.hold.rate_rps, vip.hold.rate_rps, last.hold.rate_rps))
    # ``first`` (lowest priority, and it missed) halves to none (40, 20, 10, 5, 2.5,
    # 1.25, 0), then ``last`` (lowest priority, registered last), then ``vip``.
    assert order[4] == (1.25, 40.0, 40.0) and order[5] == (0.0, 40.0, 40.0)
    assert order[6] == (0.0, 40.0, 20.0)
    assert order[11] == (0.0, 40.0, 0.0) and order[13] == (0.0, 10.0, 0.0)
    assert sac.best_effort.share == 1.0  # no best-effort job: nothing to throttle


def test_back_up_in_the_reverse_order_after_quiet_cool_downs() -> None:
    sac = Sacrifice(RULE)
    first, vip, last = held = _sessions()
    _miss(vip.hold, 10)
    sac.review(1000.0, held, best_effort=True, why="")  # best effort to none
    _miss(vip.hold, 30)
    sac.review(2000.0, held, best_effort=True, why="")  # ``last`` to 20
    assert not sac.review(2500.0, held, best_effort=True, why="")  # within the cool-down
    _miss(last.hold, 0, of=30)
    assert sac.review(3000.0, held, best_effort=True, why="")
    assert last.hold.rate_rps == 30.0 and sac.best_effort.stopped  # SLO first, still none
    _miss(last.hold, 0, of=30)
    assert sac.review(4000.0, held, best_effort=True, why="")
    assert last.hold.rate_rps == 40.0 and last.hold.reason is None
    assert sac.review(5000.0, held, best_effort=True, why="")
    assert sac.best_effort.share == 0.125
    for t, share in ((6000.0, 0.25), (7000.0, 0.5), (8000.0, 1.0)):
        assert sac.review(t, held, best_effort=True, why="") and sac.best_effort.share == share
    assert sac.best_effort.reason is None


def test_misses_above_the_target_halve_best_effort_and_cost_slo_nothing() -> None:
    sac = Sacrifice(RULE)
    held = _sessions()
    _miss(held[0].hold, 1, of=150)  # 1 in 150: within the 1% target, best effort keeps all
    assert not sac.review(500.0, held, best_effort=True, why="")
    assert sac.best_effort.share == 1.0
    _miss(held[1].hold, 1, of=50)
    _miss(held[2].hold, 1, of=50)  # 3 of 250 since: above it, yet no session over its rule
    assert sac.review(1000.0, held, best_effort=True, why="")
    assert sac.best_effort.share == 0.5
    assert "SloMisses: 3 of the last 250 SLO requests" in (sac.best_effort.reason or "")
    assert not sac.review(1500.0, held, best_effort=True, why="")  # no new miss: no change
    assert sac.best_effort.share == 0.5
    assert all(h.hold.reason is None for h in held)


def test_the_throttle_lets_best_effort_take_its_share_only() -> None:
    bet = BestEffortThrottle()
    assert bet.allows(10.0, 0.0)  # all of it: no accounting
    bet.cut(0.0, "busy", to_none=False)
    assert bet.share == 0.5
    assert not bet.allows(10.0, 0.0)  # nothing accrued yet
    assert not bet.allows(10.0, 19.0)
    assert bet.allows(10.0, 20.0) and not bet.allows(10.0, 21.0)
    assert bet.allows(10.0, 40.0)  # 10 ms of every 20: half the executor
    bet.cut(50.0, "busier", to_none=True)
    assert bet.stopped and not bet.allows(0.001, 1e9)


@pytest.fixture()
def runtime() -> tuple[ServingRuntime, VirtualClock]:
    clock = VirtualClock()
    rt = ServingRuntime(SimExecutor(PROFILES, clock, "sim"), clock, RuntimeConfig("sim"))
    rt.add_best_effort_session("batch", "conv")
    rt.add_slo_session("s", "tiny", 50, 40, priority=3)
    return rt, clock


def _entry(rt: ServingRuntime, name: str) -> dict:
    return next(s for s in rt.snapshot()["sessions"] if s["name"] == name)


def test_a_busy_host_throttles_best_effort_and_keeps_the_slo_session(runtime) -> None:
    """The issue's case: the host misses the SLO session's deadlines while a best-effort
    job runs. The job gives way (its waiting requests are answered ``throttled`` at
    once, new ones too, and no segment runs) and the SLO session keeps its rate."""
    rt, clock = runtime
    x = np.zeros((1, 2), np.float32)
    waiting: list[Outcome] = []
    for _ in range(3):
        rt.submit("batch", x, waiting.append)
    for _ in range(60):
        rt.note_answer("s", DropReason.DEADLINE_EXPIRED, counted=False)
    clock.advance_to(1500.0)
    rt.step()
    snap = rt.snapshot()
    assert snap["best_effort_throttle"]["share"] == 0.0
    assert [o.reason for o in waiting] == [DropReason.THROTTLED] * 3
    s, batch = _entry(rt, "s"), _entry(rt, "batch")
    assert s["held"]["scaled_down"] is False and s["promised"]["rate_rps"] == 40
    assert s["priority"] == 3 and s["promised"]["slo_ms"] == 50
    assert batch["promised"]["share"] == 0.0
    assert "HostBusier: 60 of the last 60 requests of s" in batch["promised"]["reason"]
    later: list[Outcome] = []
    rt.submit("batch", x, later.append)
    assert later[0].reason is DropReason.THROTTLED
    assert batch["drop_reasons"]["throttled"] == 3
    assert rt.step() is False  # nothing to run: best effort may not take the executor


def test_registration_answers_and_sessions_say_what_is_promised() -> None:
    clock = VirtualClock()
    rt = ServingRuntime(SimExecutor(PROFILES, clock, "sim"), clock, RuntimeConfig("sim"))
    client: FlaskClient = create_app(rt).test_client()
    answer = client.post("/v1/sessions", json={"name": "s", "model": "tiny", "slo_ms": 50,
                                               "rate_rps": 40, "priority": 2})
    assert answer.status_code == 201, answer.json
    assert answer.json["promised"] == {"slo_ms": 50, "rate_rps": 40, "reason": None}
    assert answer.json["priority"] == 2
    be = client.post("/v1/sessions", json={"name": "b", "model": "conv"})
    assert be.status_code == 201 and be.json["promised"] == {"share": 1.0, "reason": None}
    bad = client.post("/v1/sessions", json={"name": "t", "model": "tiny", "slo_ms": 50,
                                            "rate_rps": 1, "priority": "high"})
    assert bad.status_code == 400
    listed = {s["name"]: s for s in client.get("/v1/sessions").json["sessions"]}
    assert listed["s"]["promised"]["rate_rps"] == 40 and listed["b"]["promised"]["share"] == 1.0


def test_admission_counts_the_answers_reserve_learned_on_this_host() -> None:
    """The executor's deadline keeps back the last check's reserve (the answer's write
    and the client's wake-up), so the plan takes it from the SLO too: a host whose
    answers were seen to take 45 ms refuses an SLO it cannot meet, with the reason,
    rather than admit it and shed it afterwards."""
    from agent.inference.errors import AdmissionRefused
    from agent.inference.runtime.pathcost import PathFigures, RequestPathCost

    def runtime(cost: RequestPathCost) -> ServingRuntime:
        clock = VirtualClock()
        profiles = {"m": BatchingProfile.linear("m", "sim", 2.0, 1.0, max_batch=16)}
        return ServingRuntime(SimExecutor(profiles, clock, "sim"), clock, RuntimeConfig("sim"),
                              profiles=profiles, path_cost=cost)

    quiet = RequestPathCost(PathFigures(1.0, 1.0, 0.0, write_ms=0.1, wake_ms=0.1))
    assert runtime(quiet).add_slo_session("s", "m", 40, 100)["promised"]["rate_rps"] == 100
    busy = RequestPathCost(PathFigures(1.0, 1.0, 0.0, write_ms=0.1, wake_ms=0.1))
    for _ in range(60):
        busy.observe_write(45.0)  # what serving showed on this host
    assert busy.write_reserve_ms() >= 45.0
    rt = runtime(busy)
    with pytest.raises(AdmissionRefused) as refused:
        rt.add_slo_session("s", "m", 40, 100)
    assert refused.value.details["reason"] == "RequestPathQueue"
    assert "kept back for its answer's write" in refused.value.message
    assert rt.snapshot()["sessions"] == []


def test_a_cpu_executor_yields_the_cpu_to_the_request_path() -> None:
    """The executor's thread computes on the CPU at a lower priority than the HTTP front's
    threads (Linux nice), so a batch cannot starve a request before it is queued."""
    import os
    import time

    from agent.inference.clock import MonotonicClock
    from agent.inference.runtime.execution import EXECUTOR_NICE

    if not hasattr(os, "setpriority"):
        pytest.skip("no per-thread priorities here")
    clock = MonotonicClock()
    for device, raised in (("cpu", True), (None, False)):
        executor = SimExecutor(PROFILES, clock, "sim")
        if device:
            executor.device = device  # type: ignore[attr-defined]
        rt = ServingRuntime(executor, clock, RuntimeConfig("sim"))
        rt.start()
        try:
            for _ in range(200):
                if rt.executor_nice or not raised:
                    break
                time.sleep(0.01)
            nice = rt.snapshot()["executor_nice"]
        finally:
            rt.stop()
        process = os.getpriority(os.PRIO_PROCESS, 0)
        assert nice == (min(process + EXECUTOR_NICE, 19) if raised else 0)


def test_best_effort_requests_do_not_set_the_slo_request_path() -> None:
    """Regression (issue #43): a best-effort job's requests (large bodies, no SLO) were
    timed as the request path, so their front and back set the figures the SLO
    sessions were planned and admitted with; the server then refused or shed the SLO
    sessions for work it had admitted without a promise."""
    import httpx
    from server_helpers import served_over_http

    from agent.inference.clock import MonotonicClock
    from agent.inference.runtime.pathcost import RequestPathCost
    from agent.inference.runtime.tensors import encode_npy

    clock = MonotonicClock()
    rt = ServingRuntime(SimExecutor(PROFILES, clock, "sim"), clock, RuntimeConfig("sim"),
                        post_workers=1, path_cost=RequestPathCost(min_samples=1))
    rt.add_slo_session("s", "tiny", 1000, 5)
    rt.add_best_effort_session("batch", "conv")
    npy = {"Content-Type": "application/x-npy"}
    with served_over_http(rt, threads=4) as url:
        for _ in range(3):
            answer = httpx.post(f"{url}/v1/sessions/batch/infer", headers=npy, timeout=10,
                                content=encode_npy(np.zeros((1, 3, 64, 64), np.float32)))
            assert answer.status_code == 200
        # Nor their hand-offs back (they wait while best effort runs): the write reserve.
        assert rt.path_cost.crossing_ms() == 0.0
        for _ in range(2):
            answer = httpx.post(f"{url}/v1/sessions/s/infer", headers=npy, timeout=10,
                                content=encode_npy(np.zeros((1, 2), np.float32)))
            assert answer.status_code == 200
        assert rt.snapshot()["request_path"]["observed_requests"] == 2
        assert rt.path_cost.crossing_ms() > 0.0


class _OnePieceSim(SimExecutor):
    """The sim executor with ``huge`` uncut, as a model with no valid cut is."""

    def load(self, ref: str):
        loaded = super().load(ref)
        if ref == "huge":
            loaded.segment_fractions = (1.0,)
        return loaded


def test_a_job_an_slo_session_leaves_no_slot_is_stopped_with_its_reason() -> None:
    """Regression (issue #43, ONNX Runtime): a best-effort job registered first, then an
    SLO session whose plan leaves its one long piece neither slack nor headroom: the
    job could never run, and its waiting requests held the HTTP workers. It is stopped
    with its reason while that plan stands, and runs again once the session is gone."""
    profiles = {**PROFILES, "huge": BatchingProfile.linear("huge", "sim", 200.0, 1.0,
                                                           max_batch=1)}
    clock = VirtualClock()
    rt = ServingRuntime(_OnePieceSim(profiles, clock, "sim"), clock, RuntimeConfig("sim"))
    assert rt.add_best_effort_session("batch", "huge")["promised"]["share"] == 1.0
    rt.add_slo_session("s", "tiny", 50, 40)
    throttle = rt.snapshot()["best_effort_throttle"]
    assert throttle["share"] == 0.0 and throttle["throttled"]
    assert throttle["reason"].startswith("NoBestEffortSlack: best-effort job batch's longest "
                                         "piece takes 201 ms")
    got: list[Outcome] = []
    rt.submit("batch", np.zeros((1, 2), np.float32), got.append)
    assert got[0].reason is DropReason.THROTTLED
    rt.remove_session("s")  # all of the executor again (the session's floor too)
    assert rt.snapshot()["best_effort_throttle"] == {
        "share": 1.0, "reason": None, "throttled": False, "throttles": 1}
    rt.submit("batch", np.zeros((1, 2), np.float32), got.append)
    assert len(got) == 1  # queued, to run
