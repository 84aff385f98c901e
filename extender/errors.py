"""The extender's error hierarchy and the one mapping onto wire outcomes.

::

    ExtenderError
    ├── BadRequest        undecodable or ill-typed body          -> HTTP 400
    ├── Unauthorized      agent report without a valid token     -> HTTP 401
    ├── Forbidden         agent report for a node not its own    -> HTTP 403
    ├── NotReady          state not synced yet                   -> 200 with Error
    ├── PodRejected       the pod's own request is unusable      -> 200 with Error /
    │                     (bad annotation, demand unknown)          unresolvable nodes
    ├── BindConflict      fresh state no longer fits the pod     -> 200 with Error
    ├── NotLeader         this replica may not bind              -> 200 with Error
    └── SourceError       the cluster API call failed            -> 200 with Error
         └── BindOutcomeUnknown  no answer (timeout, lost, 5xx): the
                               binding may have been applied         -> 200 with Error

kube-scheduler treats every non-200 answer as an error, so only protocol-level
faults (the body is not an ExtenderArgs) use 4xx; logical failures travel in
``Error`` with HTTP 200, as the upstream test extender and HAMi do.
"""

from __future__ import annotations

from typing import Any


class ExtenderError(Exception):
    """Base of every error the extender turns into a wire answer."""

    http_status = 200


class BadRequest(ExtenderError):
    """The request body is not valid JSON or not the expected shape (``path`` names where)."""

    http_status = 400

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class Unauthorized(ExtenderError):
    """Missing or wrong bearer token."""

    http_status = 401


class Forbidden(ExtenderError):
    """A valid identity asking for something it may not (a report for another node)."""

    http_status = 403


class NotReady(ExtenderError):
    """The cluster state has not synced; decisions would be made on partial data."""


class PodRejected(ExtenderError):
    """The pod's request cannot be used (bad annotation, unknown demand)."""

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(message)


class BindConflict(ExtenderError):
    """Bind re-checked against fresh state and the node no longer fits."""

    def __init__(self, message: str, rejection: Any):
        self.rejection = rejection
        super().__init__(message)


class NotLeader(ExtenderError):
    """This replica is not allowed to bind (a leader elector said no)."""


class SourceError(ExtenderError):
    """A call to the cluster source (Kubernetes API) failed."""


class BindOutcomeUnknown(SourceError):
    """The bind call got no usable answer (timeout, connection lost, server error): the API
    server may have applied the binding, so its reservation is kept until the outcome is
    known (the pod is seen bound, the bind is retried, or the assumption expires)."""
