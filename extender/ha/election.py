"""Who holds a Lease: our own election, or following kube-scheduler's.

:class:`LeaseElector` runs an election on a ``coordination.k8s.io/v1`` Lease with
the same rules as client-go's ``leaderelection`` package (the standalone
topology); :class:`LeaseFollower` only reads the co-located kube-scheduler's
Lease and leads while its holder's hostname is ours (the sidecar topology).
Both are :class:`extender.ha.leader.Leadership`; the Lease record and the calls
on it are :mod:`extender.ha.lease`.

Expiry is judged on the local monotonic clock from the moment a *change* of the
Lease was observed, never from the timestamps written in it, because the nodes'
wall clocks may disagree (the same choice client-go makes). A leader steps down
once it has failed to renew for ``renew_deadline_seconds``, which is shorter than
``lease_duration_seconds``, so two replicas never both believe they lead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from extender.ha.lease import LeaderError, LeaseApi, LeaseApiError, LeaseRecord

_log = logging.getLogger("tandem.leader")

# client-go's JitterFactor: the retry period must leave room for jitter before the
# renew deadline passes.
_JITTER_FACTOR = 1.2


class LeaderConfigError(LeaderError, ValueError):
    """Invalid election settings; carries every problem found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


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
