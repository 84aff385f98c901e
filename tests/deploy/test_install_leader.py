"""Lease-based leadership (extender/ha/) on an in-memory Lease API and fake clocks."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from extender.ha.election import (
    LeaderConfigError,
    LeaderElectionConfig,
    LeaseElector,
    LeaseFollower,
)
from extender.ha.leader import (
    LEADER_LABEL,
    AlwaysLeader,
    LeadershipLoop,
    PodLabeler,
    build_leadership,
)
from extender.ha.lease import KubeLeaseApi, LeaseApiError, LeaseConflict, LeaseRecord

NS, NAME = "tandem-system", "tandem-extender"


class FakeClock:
    """Monotonic and wall time advanced by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=self.now)


class FakeLeaseApi:
    """In-memory Lease store with resourceVersion conflicts, like the API server."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], LeaseRecord] = {}
        self.versions = itertools.count(1)
        self.fail_next: int = 0

    def _maybe_fail(self, op: str) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise LeaseApiError(op, 503)

    def read(self, namespace: str, name: str) -> LeaseRecord | None:
        self._maybe_fail("read")
        return self.leases.get((namespace, name))

    def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        self._maybe_fail("create")
        if (namespace, name) in self.leases:
            raise LeaseConflict("create", 409)
        stored = replace(record, resource_version=str(next(self.versions)))
        self.leases[(namespace, name)] = stored
        return stored

    def replace(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        self._maybe_fail("replace")
        current = self.leases.get((namespace, name))
        if current is None or current.resource_version != record.resource_version:
            raise LeaseConflict("replace", 409)
        stored = replace(record, resource_version=str(next(self.versions)))
        self.leases[(namespace, name)] = stored
        return stored


def make_elector(
    identity: str, api: FakeLeaseApi, clock: FakeClock, changes: list | None = None
) -> LeaseElector:
    config = LeaderElectionConfig(namespace=NS, name=NAME, identity=identity)
    return LeaseElector(
        config,
        api,
        monotonic=clock.monotonic,
        wall=clock.wall,
        on_change=None if changes is None else changes.append,
    )


@pytest.fixture
def env() -> SimpleNamespace:
    clock = FakeClock()
    api = FakeLeaseApi()
    changes: list[bool] = []
    return SimpleNamespace(
        clock=clock,
        api=api,
        changes=changes,
        a=make_elector("pod-a_1", api, clock, changes),
        b=make_elector("pod-b_2", api, clock),
    )


def test_first_candidate_creates_the_lease_and_leads(env: SimpleNamespace) -> None:
    assert env.a.step() is True
    assert env.a.is_leader()
    lease = env.api.leases[(NS, NAME)]
    assert lease.holder_identity == "pod-a_1"
    assert lease.lease_transitions == 0
    assert env.changes == [True]


def test_renew_keeps_acquire_time_and_advances_renew_time(env: SimpleNamespace) -> None:
    env.a.step()
    first = env.api.leases[(NS, NAME)]
    env.clock.now += 2
    assert env.a.step()
    second = env.api.leases[(NS, NAME)]
    assert second.acquire_time == first.acquire_time
    assert second.renew_time > first.renew_time
    assert second.lease_transitions == 0


def test_second_candidate_waits_while_the_lease_is_renewed(env: SimpleNamespace) -> None:
    env.a.step()
    for _ in range(20):  # 40 s of renewals, far beyond one lease duration
        env.clock.now += 2
        assert env.a.step()
        assert env.b.step() is False
    assert env.api.leases[(NS, NAME)].holder_identity == "pod-a_1"


def test_standby_takes_over_only_after_the_observed_lease_expires(env: SimpleNamespace) -> None:
    env.a.step()
    assert env.b.step() is False  # b observes a's lease now
    env.clock.now += 14.9
    assert env.b.step() is False  # still within 15 s since b saw a change
    env.clock.now += 0.2
    assert env.b.step() is True
    lease = env.api.leases[(NS, NAME)]
    assert lease.holder_identity == "pod-b_2"
    assert lease.lease_transitions == 1


def test_leader_that_cannot_renew_steps_down_before_anyone_can_take_over(
    env: SimpleNamespace,
) -> None:
    env.a.step()
    env.b.step()
    env.api.fail_next = 100
    env.clock.now += 9.9
    assert env.a.step() is True  # a failed round is not a lost lease
    env.clock.now += 0.2
    assert env.a.step() is False  # past the 10 s renew deadline
    assert env.changes == [True, False]
    env.api.fail_next = 0
    env.clock.now += 4.8  # 14.9 s since b saw a change: b must still wait
    assert env.b.step() is False
    assert not env.a.is_leader()


def test_is_leader_expires_without_steps(env: SimpleNamespace) -> None:
    env.a.step()
    env.clock.now += 10.5
    assert env.a.is_leader() is False


def test_release_hands_over_immediately(env: SimpleNamespace) -> None:
    env.a.step()
    env.b.step()
    env.a.release()
    assert not env.a.is_leader()
    assert env.api.leases[(NS, NAME)].holder_identity == ""
    assert env.b.step() is True
    assert env.changes == [True, False]


def test_lost_race_on_create_is_not_leadership(env: SimpleNamespace) -> None:
    env.api.leases[(NS, NAME)] = LeaseRecord("pod-b_2", 15, None, None, 0, resource_version="9")
    # b wrote between a's read (None) and a's create: simulate with a read that lies once.
    real_read = env.api.read
    env.api.read = lambda ns, name: None
    assert env.a.step() is False
    env.api.read = real_read
    assert env.api.leases[(NS, NAME)].holder_identity == "pod-b_2"


def test_never_two_leaders_in_a_randomised_schedule() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    electors = [make_elector(f"pod-{i}_{i}", api, clock) for i in range(3)]
    schedule = itertools.islice(itertools.cycle([0, 1, 2, 0, 2, 1, 1, 0]), 600)
    for step_no, who in enumerate(schedule):
        clock.now += 0.7
        if step_no % 97 == 0:
            api.fail_next = 20  # an API outage of several rounds
        electors[who].step()
        leaders = [e.identity for e in electors if e.is_leader()]
        assert len(leaders) <= 1, (step_no, leaders)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"identity": ""}, "identity: required"),
        ({"retry_period_seconds": 0}, "retry_period_seconds"),
        ({"renew_deadline_seconds": 2.0, "retry_period_seconds": 2.0}, "renew_deadline_seconds"),
        ({"lease_duration_seconds": 10.0}, "lease_duration_seconds"),
    ],
    ids=["no-identity", "zero-retry", "deadline-too-short", "duration-not-above-deadline"],
)
def test_bad_timings_are_rejected_with_every_problem(kwargs: dict, problem: str) -> None:
    base = {"namespace": NS, "name": NAME, "identity": "x_1"}
    with pytest.raises(LeaderConfigError) as err:
        LeaderElectionConfig(**(base | kwargs))
    assert any(problem in p for p in err.value.problems)


@pytest.mark.parametrize(
    ("holder", "age_seconds", "expected"),
    [
        ("tandem-scheduler-7d9f-abc_5e1f", 1.0, True),
        ("tandem-scheduler-7d9f-xyz_5e1f", 1.0, False),
        ("tandem-scheduler-7d9f-abc", 1.0, False),  # no uuid suffix: not kube's format
        ("tandem-scheduler-7d9f-abcdef_5e1f", 1.0, False),  # prefix of another pod name
        ("tandem-scheduler-7d9f-abc_5e1f", 16.0, False),  # not renewed within its duration
        ("", 1.0, False),
    ],
    ids=["ours", "other-pod", "no-uuid", "longer-name", "stale", "released"],
)
def test_follower_leads_when_its_scheduler_holds_a_fresh_lease(
    holder: str, age_seconds: float, expected: bool
) -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    api.leases[(NS, "tandem-scheduler")] = LeaseRecord(holder, 15, None, clock.wall(), 3, "1")
    follower = LeaseFollower(
        NS, "tandem-scheduler", "tandem-scheduler-7d9f-abc", api, clock.monotonic
    )
    follower.step()
    clock.now += age_seconds
    follower.step()  # unchanged lease: the age keeps counting from the first sight
    assert follower.is_leader() is expected


def test_follower_survives_read_errors_until_expiry() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    api.leases[(NS, "s")] = LeaseRecord("host_1", 15, None, clock.wall(), 0, "1")
    follower = LeaseFollower(NS, "s", "host", api, clock.monotonic)
    assert follower.step()
    api.fail_next = 100
    clock.now += 10
    assert follower.step() is True
    clock.now += 6
    assert follower.step() is False


def test_always_leader_and_loop_lifecycle() -> None:
    assert AlwaysLeader().is_leader()
    calls: list[str] = []
    loop = LeadershipLoop(
        step=lambda: calls.append("step") is None,
        period_seconds=0.01,
        on_stop=lambda: calls.append("stop"),
    )
    loop.start()
    for _ in range(200):  # bounded wait for the first step
        if calls:
            break
        loop._stop.wait(0.005)
    loop.stop()
    assert calls[0] == "step" and calls[-1] == "stop"


class _ApiException(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class RecordingCoordinationApi:
    """Stands in for kubernetes.client.CoordinationV1Api at the library boundary."""

    def __init__(self, fail_status: int | None = None) -> None:
        self.bodies: list[dict] = []
        self.fail_status = fail_status

    def _lease(self, body: dict) -> SimpleNamespace:
        spec = body["spec"]
        return SimpleNamespace(
            metadata=SimpleNamespace(resource_version="42"),
            spec=SimpleNamespace(
                holder_identity=spec["holderIdentity"],
                lease_duration_seconds=spec["leaseDurationSeconds"],
                acquire_time=datetime.fromisoformat(spec["acquireTime"].replace("Z", "+00:00")),
                renew_time=spec["renewTime"],
                lease_transitions=spec["leaseTransitions"],
            ),
        )

    def read_namespaced_lease(self, name: str, namespace: str, **_: object) -> SimpleNamespace:
        raise _ApiException(self.fail_status or 404)

    def create_namespaced_lease(self, namespace: str, body: dict, **_: object) -> SimpleNamespace:
        if self.fail_status:
            raise _ApiException(self.fail_status)
        self.bodies.append(body)
        return self._lease(body)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict, **_: object
    ) -> SimpleNamespace:
        return self.create_namespaced_lease(namespace, body)


def test_kube_adapter_writes_micro_time_and_maps_statuses() -> None:
    coordination = RecordingCoordinationApi()
    api = KubeLeaseApi(coordination)
    assert api.read(NS, NAME) is None
    when = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)  # microsecond == 0 on purpose
    stored = api.create(NS, NAME, LeaseRecord("a_1", 15.2, when, when, 0))
    spec = coordination.bodies[0]["spec"]
    assert spec["renewTime"] == "2025-03-01T12:00:00.000000Z"
    assert spec["leaseDurationSeconds"] == 16
    assert stored.resource_version == "42" and stored.renew_time == when
    with pytest.raises(LeaseConflict):
        KubeLeaseApi(RecordingCoordinationApi(409)).create(NS, NAME, stored)
    with pytest.raises(LeaseApiError) as err:
        KubeLeaseApi(RecordingCoordinationApi(500)).read(NS, NAME)
    assert err.value.status == 500 and not isinstance(err.value, LeaseConflict)


class RecordingCoreApi:
    """Stands in for kubernetes.client.CoreV1Api.patch_namespaced_pod."""

    def __init__(self, failures: int = 0) -> None:
        self.patches: list[tuple[str, str, dict]] = []
        self.failures = failures

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict) -> None:
        if self.failures:
            self.failures -= 1
            raise _ApiException(503)
        self.patches.append((name, namespace, body))


def test_pod_labeler_patches_only_on_change_and_retries_failures() -> None:
    core = RecordingCoreApi(failures=1)
    labeler = PodLabeler(core, NS, "pod-a")
    labeler.sync(True)  # fails: retried on the next call
    labeler.sync(True)
    labeler.sync(True)
    labeler.sync(False)
    labels = [body["metadata"]["labels"][LEADER_LABEL] for _, _, body in core.patches]
    assert labels == ["true", None]
    assert core.patches[0][:2] == ("pod-a", NS)


@pytest.mark.parametrize(
    ("mode", "kind", "has_loop"),
    [("single", AlwaysLeader, False), ("follow-scheduler", LeaseFollower, True),
     ("elect", LeaseElector, True)],
    ids=["single", "follow", "elect"],
)
def test_build_leadership_modes(mode: str, kind: type, has_loop: bool) -> None:
    leadership, loop = build_leadership(
        mode, namespace=NS, pod_name="p", hostname="p", lease_name="l",
        coordination_api=RecordingCoordinationApi(), core_api=RecordingCoreApi(),
    )
    assert isinstance(leadership, kind)
    assert (loop is not None) is has_loop


def test_build_leadership_rejects_unknown_mode_and_missing_clients() -> None:
    with pytest.raises(LeaderConfigError, match="not one of"):
        build_leadership("raft", namespace=NS, pod_name="p", hostname="p", lease_name="l")
    with pytest.raises(LeaderConfigError, match="needs the Kubernetes API"):
        build_leadership("elect", namespace=NS, pod_name="p", hostname="p", lease_name="l")
