"""The hand-off gate: one pod per node waiting for the device plugin, released by the
kubelet's admission, a deletion or the timeout."""

from __future__ import annotations

import threading

import pytest

from extender.state.handoff import HandoffGate, Waiting, admitted


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pod(uid: str, **status) -> dict:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "ml"}, "status": status}


@pytest.mark.parametrize(("status", "done"), [
    pytest.param({"phase": "Pending"}, False, id="pending"),
    pytest.param({"phase": "Pending", "startTime": "2026-11-23T00:00:00Z"}, True,
                 id="admitted-pending-images"),
    pytest.param({"phase": "Running"}, True, id="running"),
    pytest.param({"phase": "Failed"}, True, id="rejected-by-the-kubelet"),
    pytest.param({}, False, id="no-status"),
])
def test_admitted(status, done):
    assert admitted(pod("u", **status)) is done


def test_gate_holds_a_node_for_one_pod_until_released_or_expired():
    clock = Clock()
    gate = HandoffGate(clock)
    gate.begin("n1", "u1", "ml/a", timeout_seconds=30)
    assert gate.holder("n1", "u2") == Waiting("u1", "ml/a", 130.0)
    assert gate.holder("n1", "u1") is None  # the waiting pod itself is not blocked
    assert gate.holder("n2", "u2") is None
    gate.observe(pod("u1", phase="Pending"))
    assert gate.holder("n1", "u2") is not None
    gate.observe(pod("u1", phase="Pending", startTime="t"))
    assert gate.holder("n1", "u2") is None
    gate.begin("n1", "u3", "ml/c", timeout_seconds=30)
    gate.observe(pod("u3", phase="Pending"), deleted=True)
    assert gate.waiting() == {}
    gate.begin("n1", "u4", "ml/d", timeout_seconds=30)
    clock.now = 129.9
    assert gate.holder("n1") is not None
    clock.now = 130.0
    assert gate.holder("n1") is None and gate.waiting() == {}


def test_claim_is_check_and_reserve_in_one_step():
    clock = Clock()
    gate = HandoffGate(clock)
    assert gate.claim("n1", "u1", "ml/a", timeout_seconds=30) is None
    assert gate.claim("n1", "u2", "ml/b", timeout_seconds=30) == Waiting("u1", "ml/a", 130.0)
    assert gate.claim("n1", "u1", "ml/a", timeout_seconds=30) is None  # a retried bind
    clock.now = 131.0  # the first hand-off timed out: the next pod may have the node
    assert gate.claim("n1", "u2", "ml/b", timeout_seconds=30) is None
    assert gate.waiting() == {"n1": Waiting("u2", "ml/b", 161.0)}


def test_concurrent_claims_leave_exactly_one_pod_waiting_per_node():
    """The scheduler binds pods concurrently; only one of them may get the node."""
    gate = HandoffGate(Clock())
    start = threading.Barrier(8)
    won: list[str] = []

    def bind(uid: str) -> None:
        start.wait()
        if gate.claim("n1", uid, f"ml/{uid}", timeout_seconds=30) is None:
            won.append(uid)

    threads = [threading.Thread(target=bind, args=(f"u{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(won) == 1 and gate.waiting()["n1"].uid == won[0]
