"""The ``coordination.k8s.io/v1`` Lease as leader election sees it, and its API.

:class:`LeaseRecord` holds the spec fields election uses; :class:`LeaseApi` is the
three calls election makes (a fake implements it in tests) and
:class:`KubeLeaseApi` makes them through the ``kubernetes`` client. The election
logic itself is :mod:`extender.ha.election`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

# The API server's MicroTime layout (RFC 3339 with exactly six fractional digits).
_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


class LeaderError(Exception):
    """Base of leadership errors."""


class LeaseApiError(LeaderError):
    """A Lease API call failed; the next round retries."""

    def __init__(self, operation: str, status: int | None = None) -> None:
        super().__init__(f"lease {operation} failed (status {status})")
        self.operation = operation
        self.status = status


class LeaseConflict(LeaseApiError):
    """Another writer changed the Lease first (HTTP 409)."""


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a ``coordination.k8s.io/v1`` Lease spec that election uses."""

    holder_identity: str
    lease_duration_seconds: float
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int
    resource_version: str | None = None

    def same_holding(self, other: LeaseRecord) -> bool:
        """True if ``other`` shows no renewal or change of holder since this one."""
        return (
            self.holder_identity == other.holder_identity
            and self.renew_time == other.renew_time
            and self.lease_transitions == other.lease_transitions
        )


class LeaseApi(Protocol):
    """The three Lease calls election needs; a fake implements it in tests."""

    def read(self, namespace: str, name: str) -> LeaseRecord | None:
        """The Lease, or None if it does not exist."""
        ...

    def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """Create the Lease; LeaseConflict if it already exists."""
        ...

    def replace(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """Replace the Lease guarded by ``record.resource_version``; LeaseConflict if stale."""
        ...


def _format_time(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).strftime(_MICRO_TIME)


def _parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


class KubeLeaseApi:
    """:class:`LeaseApi` over the ``kubernetes`` client's CoordinationV1Api."""

    def __init__(self, coordination_api: Any, request_timeout_seconds: float = 5.0) -> None:
        # Injected (not built here) so tests and callers choose in-cluster or kubeconfig auth.
        self._api = coordination_api
        self._timeout = request_timeout_seconds

    def read(self, namespace: str, name: str) -> LeaseRecord | None:
        """The Lease, or None on 404."""
        try:
            lease = self._api.read_namespaced_lease(
                name, namespace, _request_timeout=self._timeout
            )
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status == 404:
                return None
            raise LeaseApiError("read", status) from exc
        return _record_from_lease(lease)

    def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """Create the Lease; LeaseConflict on 409."""
        return self._write("create", self._api.create_namespaced_lease, namespace,
                           _lease_body(namespace, name, record))

    def replace(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """Replace under optimistic concurrency; LeaseConflict on 409."""
        return self._write("replace", self._api.replace_namespaced_lease, name, namespace,
                           _lease_body(namespace, name, record))

    def _write(self, operation: str, call: Any, *args: Any) -> LeaseRecord:
        try:
            lease = call(*args, _request_timeout=self._timeout)
        except Exception as exc:
            raise _api_error(operation, exc) from exc
        return _record_from_lease(lease)


def _api_error(operation: str, exc: Exception) -> LeaseApiError:
    status = getattr(exc, "status", None)
    if status == 409:
        return LeaseConflict(operation, status)
    return LeaseApiError(operation, status)


def _lease_body(namespace: str, name: str, record: LeaseRecord) -> dict[str, Any]:
    # A plain dict, not V1Lease: the client would serialise datetimes without the
    # fixed six fractional digits that the API server's MicroTime parser requires.
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if record.resource_version is not None:
        metadata["resourceVersion"] = record.resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": record.holder_identity,
            # The API field is integral; never shorten a lease by rounding down.
            "leaseDurationSeconds": max(1, int(-(-record.lease_duration_seconds // 1))),
            "acquireTime": _format_time(record.acquire_time),
            "renewTime": _format_time(record.renew_time),
            "leaseTransitions": record.lease_transitions,
        },
    }


def _record_from_lease(lease: Any) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(
        holder_identity=spec.holder_identity or "",
        lease_duration_seconds=float(spec.lease_duration_seconds or 0),
        acquire_time=_parse_time(spec.acquire_time),
        renew_time=_parse_time(spec.renew_time),
        lease_transitions=int(spec.lease_transitions or 0),
        resource_version=lease.metadata.resource_version,
    )
