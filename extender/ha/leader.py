"""Leadership: at most one extender replica binds pods at a time.

Two topologies need two ways of knowing who leads (docs/deploy.md):

- **Sidecar** (default install): the extender runs beside its own kube-scheduler,
  and that scheduler already runs leader election on a ``coordination.k8s.io/v1``
  Lease whose ``holderIdentity`` is ``<hostname>_<uuid>``. Only the leading
  scheduler calls its sidecar, so :class:`LeaseFollower` merely *reads* that Lease
  and reports leadership when the holder's hostname is ours (both containers of a
  pod share the pod's hostname).
- **Standalone** (an existing kube-scheduler calls an extender Deployment with
  several replicas): :class:`LeaseElector` runs its own election with the same
  rules as client-go's ``leaderelection`` package, so one replica binds.

Both implement :class:`Leadership` (``is_leader()``), which the server's
``may_bind`` hook calls; :class:`AlwaysLeader` serves a single replica and
``sim:`` clusters. :class:`PodLabeler` marks the leader's pod so that the
Services route agent reports (and standalone scheduler calls) to it;
:func:`build_leadership` wires a mode to all of these. The Lease record and the
calls on it are :mod:`extender.ha.lease`.

Expiry is judged on the local monotonic clock from the moment a *change* of the
Lease was observed, never from the timestamps written in it, because the nodes'
wall clocks may disagree (the same choice client-go makes). A leader steps down
once it has failed to renew for ``renew_deadline_seconds``, which is shorter than
``lease_duration_seconds``, so two replicas never both believe they lead.

Errors::

    LeaderError
     ├── LeaderConfigError    invalid timings or identity (caller: fix the config)
     └── LeaseApiError        the API call failed (caller: retry next period)
          └── LeaseConflict   someone else wrote first (caller: lost this round)
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from extender.ha.lease import (
    KubeLeaseApi,
    LeaderError,
    LeaseApi,
    LeaseApiError,
    LeaseConflict,
    LeaseRecord,
)

__all__ = [
    "AlwaysLeader",
    "LeaderConfigError",
    "LeaderError",
    "LeaderElectionConfig",
    "Leadership",
    "LeaseApiError",
    "LeaseConflict",
    "LeaseRecord",
    "LeaseApi",
    "KubeLeaseApi",
    "LeaseElector",
    "LeaseFollower",
    "LeadershipLoop",
    "LEADER_LABEL",
    "PodLabeler",
    "LEADERSHIP_MODES",
    "build_leadership",
]

_log = logging.getLogger("tandem.leader")

# client-go's JitterFactor: the retry period must leave room for jitter before the
# renew deadline passes.
_JITTER_FACTOR = 1.2

# Pod label that the Services in front of the extender select on.
LEADER_LABEL = "tandem.io/leader"

class LeaderConfigError(LeaderError, ValueError):
    """Invalid election settings; carries every problem found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


class Leadership(Protocol):
    """Answers whether this replica may bind pods now."""

    def is_leader(self) -> bool:
        """True while this replica is the single active binder."""
        ...


class AlwaysLeader:
    """Leadership for a single replica or a simulated cluster: always leads."""

    def is_leader(self) -> bool:
        """Always true."""
        return True


@dataclass(frozen=True)
class LeaderElectionConfig:
    """Where the Lease lives, who we are, and the client-go timings (defaults as kube's)."""

    namespace: str
    name: str
    identity: str
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        for field in ("namespace", "name", "identity"):
            if not getattr(self, field):
                problems.append(f"{field}: required")
        if self.retry_period_seconds <= 0:
            problems.append("retry_period_seconds: must be > 0")
        if self.renew_deadline_seconds <= _JITTER_FACTOR * self.retry_period_seconds:
            problems.append(
                "renew_deadline_seconds: must exceed "
                f"{_JITTER_FACTOR} * retry_period_seconds ({self.retry_period_seconds})"
            )
        if self.lease_duration_seconds <= self.renew_deadline_seconds:
            problems.append("lease_duration_seconds: must exceed renew_deadline_seconds")
        if problems:
            raise LeaderConfigError(problems)


class _Observation:
    """The last Lease content we saw and when (monotonic) it last changed."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.changed_at: float = 0.0

    def see(self, record: LeaseRecord, now_monotonic: float) -> None:
        if self.record is None or not self.record.same_holding(record):
            self.changed_at = now_monotonic
        self.record = record

    def expired(self, now_monotonic: float) -> bool:
        if self.record is None or not self.record.holder_identity:
            return True
        return now_monotonic > self.changed_at + self.record.lease_duration_seconds


class LeaseElector:
    """Our own Lease election for a standalone, replicated extender."""

    def __init__(
        self,
        config: LeaderElectionConfig,
        api: LeaseApi,
        monotonic: Callable[[], float],
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._config = config
        self._api = api
        self._monotonic = monotonic
        self._wall = wall
        self._on_change = on_change
        self._observed = _Observation()
        self._last_renew: float | None = None
        self._lock = threading.Lock()
        self._was_leader = False

    @property
    def identity(self) -> str:
        """This candidate's identity as written into the Lease."""
        return self._config.identity

    def is_leader(self) -> bool:
        """True if we hold the Lease and renewed it within the renew deadline."""
        with self._lock:
            return self._leading_at(self._monotonic())

    def _leading_at(self, now: float) -> bool:
        return (
            self._last_renew is not None
            and now - self._last_renew <= self._config.renew_deadline_seconds
        )

    def step(self) -> bool:
        """One acquire-or-renew round against the API; returns whether we lead after it."""
        with self._lock:
            try:
                self._try_acquire_or_renew()
            except LeaseApiError as exc:
                # A failed round is not a lost lease: keep leading until the deadline.
                _log.warning(
                    "lease round failed",
                    extra={"lease": self._config.name, "error": type(exc).__name__},
                )
            leading = self._leading_at(self._monotonic())
            if not leading:
                self._last_renew = None
        self._notify(leading)
        return leading

    def _try_acquire_or_renew(self) -> None:
        cfg = self._config
        now_wall = self._wall()
        current = self._api.read(cfg.namespace, cfg.name)
        if current is None:
            fresh = LeaseRecord(
                holder_identity=cfg.identity,
                lease_duration_seconds=cfg.lease_duration_seconds,
                acquire_time=now_wall,
                renew_time=now_wall,
                lease_transitions=0,
            )
            created = self._api.create(cfg.namespace, cfg.name, fresh)
            self._won(created)
            return
        now = self._monotonic()
        self._observed.see(current, now)
        holder = current.holder_identity
        if holder and holder != cfg.identity and not self._observed.expired(now):
            self._last_renew = None
            return
        if holder == cfg.identity:
            wanted = replace(
                current,
                renew_time=now_wall,
                lease_duration_seconds=cfg.lease_duration_seconds,
            )
        else:
            wanted = LeaseRecord(
                holder_identity=cfg.identity,
                lease_duration_seconds=cfg.lease_duration_seconds,
                acquire_time=now_wall,
                renew_time=now_wall,
                lease_transitions=current.lease_transitions + 1,
                resource_version=current.resource_version,
            )
        self._won(self._api.replace(cfg.namespace, cfg.name, wanted))

    def _won(self, record: LeaseRecord) -> None:
        now = self._monotonic()
        self._observed.see(record, now)
        self._last_renew = now

    def release(self) -> None:
        """Give the Lease up (on graceful shutdown) so a standby takes over at once."""
        with self._lock:
            if self._last_renew is None:
                return
            self._last_renew = None
            cfg = self._config
            try:
                current = self._api.read(cfg.namespace, cfg.name)
                if current is not None and current.holder_identity == cfg.identity:
                    # client-go's ReleaseOnCancel: empty holder, 1 s duration.
                    self._api.replace(
                        cfg.namespace,
                        cfg.name,
                        replace(
                            current,
                            holder_identity="",
                            lease_duration_seconds=1.0,
                            renew_time=self._wall(),
                        ),
                    )
            except LeaseApiError as exc:
                _log.warning(
                    "lease release failed; a standby takes over after expiry",
                    extra={"lease": cfg.name, "error": type(exc).__name__},
                )
        self._notify(False)

    def _notify(self, leading: bool) -> None:
        if leading != self._was_leader:
            self._was_leader = leading
            _log.info(
                "leadership changed",
                extra={"lease": self._config.name, "leader": leading},
            )
            if self._on_change is not None:
                self._on_change(leading)


class LeaseFollower:
    """Leadership of the co-located kube-scheduler, read from its Lease."""

    def __init__(
        self,
        namespace: str,
        name: str,
        hostname: str,
        api: LeaseApi,
        monotonic: Callable[[], float],
    ) -> None:
        if not (namespace and name and hostname):
            raise LeaderConfigError(["namespace, name and hostname are required"])
        self._namespace = namespace
        self._name = name
        self._prefix = f"{hostname}_"
        self._api = api
        self._monotonic = monotonic
        self._observed = _Observation()
        self._lock = threading.Lock()

    def step(self) -> bool:
        """Read the scheduler's Lease once; returns whether our scheduler leads."""
        with self._lock:
            try:
                record = self._api.read(self._namespace, self._name)
            except LeaseApiError as exc:
                # Keep the last observation: it expires on its own if reads keep failing.
                _log.warning(
                    "lease read failed",
                    extra={"lease": self._name, "error": type(exc).__name__},
                )
            else:
                if record is None:
                    self._observed = _Observation()
                else:
                    self._observed.see(record, self._monotonic())
        return self.is_leader()

    def is_leader(self) -> bool:
        """True while the Lease names our hostname and has changed within its duration."""
        with self._lock:
            record = self._observed.record
            return (
                record is not None
                and record.holder_identity.startswith(self._prefix)
                and not self._observed.expired(self._monotonic())
            )


class PodLabeler:
    """Keeps the label ``tandem.io/leader=true`` on our own pod exactly while we lead.

    The Services in front of the extender select this label, so agent reports
    (and, standalone, the scheduler's calls) reach only the active binder.
    Readiness cannot carry leadership instead: a Deployment whose standby is
    never Ready cannot roll out, and its PodDisruptionBudget blocks node drains.
    """

    def __init__(self, core_api: Any, namespace: str, pod_name: str) -> None:
        self._api = core_api
        self._namespace = namespace
        self._pod = pod_name
        self._applied: bool | None = None

    def sync(self, leading: bool) -> None:
        """Patch the label if it differs from ``leading``; failures retry on the next call."""
        if leading == self._applied:
            return
        # A JSON merge patch with null deletes the label.
        body = {"metadata": {"labels": {LEADER_LABEL: "true" if leading else None}}}
        try:
            self._api.patch_namespaced_pod(self._pod, self._namespace, body)
        except Exception as exc:
            _log.warning(
                "leader label patch failed",
                extra={"pod": self._pod, "error": type(exc).__name__},
            )
            return
        self._applied = leading


class LeadershipLoop:
    """Runs ``step()`` every period on a daemon thread until stopped."""

    def __init__(
        self,
        step: Callable[[], bool],
        period_seconds: float,
        on_result: Callable[[bool], None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        if period_seconds <= 0:
            raise LeaderConfigError(["period_seconds: must be > 0"])
        self._step = step
        self._period = period_seconds
        self._on_result = on_result
        self._on_stop = on_stop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-leader", daemon=True)

    def start(self) -> None:
        """Start stepping in the background."""
        self._thread.start()

    def stop(self, timeout_seconds: float = 5.0) -> None:
        """Stop the loop, then run ``on_stop`` (e.g. release the Lease)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_seconds)
        if self._on_stop is not None:
            self._on_stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                leading = self._step()
                if self._on_result is not None:
                    self._on_result(leading)
            except LeaderError:
                _log.exception("leadership step failed")
            self._stop.wait(self._period)


LEADERSHIP_MODES = ("single", "follow-scheduler", "elect")


def build_leadership(
    mode: str,
    *,
    namespace: str,
    pod_name: str,
    hostname: str,
    lease_name: str,
    coordination_api: Any = None,
    core_api: Any = None,
    monotonic: Callable[[], float] = time.monotonic,
    period_seconds: float = 2.0,
) -> tuple[Leadership, LeadershipLoop | None]:
    """The leadership for ``mode`` and the (not yet started) loop that maintains it.

    ``single``: one replica, always leads, no loop. ``follow-scheduler``: the
    sidecar topology, reads kube-scheduler's Lease ``lease_name``. ``elect``: the
    standalone topology, elects on ``lease_name`` with identity
    ``<hostname>_<uuid>`` like kube-scheduler.
    """
    if mode not in LEADERSHIP_MODES:
        raise LeaderConfigError([f"mode: {mode!r} not one of {', '.join(LEADERSHIP_MODES)}"])
    if mode == "single":
        return AlwaysLeader(), None
    if coordination_api is None or core_api is None:
        raise LeaderConfigError([f"mode {mode!r} needs the Kubernetes API clients"])
    leases = KubeLeaseApi(coordination_api)
    labeler = PodLabeler(core_api, namespace, pod_name)
    if mode == "follow-scheduler":
        follower = LeaseFollower(namespace, lease_name, hostname, leases, monotonic)
        loop = LeadershipLoop(
            follower.step, period_seconds, on_result=labeler.sync,
            on_stop=lambda: labeler.sync(False),
        )
        return follower, loop
    config = LeaderElectionConfig(
        namespace=namespace, name=lease_name, identity=f"{hostname}_{uuid.uuid4()}",
        retry_period_seconds=period_seconds,
    )
    elector = LeaseElector(config, leases, monotonic)

    def stop() -> None:
        elector.release()
        labeler.sync(False)

    return elector, LeadershipLoop(
        elector.step, period_seconds, on_result=labeler.sync, on_stop=stop
    )
