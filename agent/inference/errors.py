"""Errors of the inference server, one small hierarchy mapped to HTTP in one place.

::

    ServerError
     ├── BadRequest            malformed body, wrong dtype/shape, unknown field (400)
     ├── Unauthorized          admin endpoint without the right bearer token (401)
     ├── PayloadTooLarge       body over the configured limit (413)
     ├── SessionNotFound       no session of that name (404)
     ├── SessionConflict       a session of that name exists (409)
     ├── ModelRejected         model file missing, outside the store, too big or broken (422)
     ├── AdmissionRefused      the new session would break an existing SLO; state unchanged (409)
     ├── BestEffortRefused     a best-effort job could run only by making an SLO miss (422)
     ├── ServerStopping        a session change arrived while the server shuts down (503)
     └── RequestDropped        a request was dropped or missed its deadline (503)
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import predictor.errors as predictor_errors


class ServerError(Exception):
    """Base of every error the inference server reports to a client."""

    status = 500

    def __init__(self, message: str, **details: Any):
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict[str, Any]:
        """The error as the JSON body the API answers."""
        return {"error": type(self).__name__, "message": self.message, **self.details}


class BadRequest(ServerError):
    """The request body or parameters are invalid."""

    status = 400


class Unauthorized(ServerError):
    """A session-management call without the right bearer token."""

    status = 401


class ServerStopping(ServerError):
    """The server is shutting down and takes no new sessions."""

    status = 503


class PayloadTooLarge(ServerError):
    """The body exceeds the configured size limit."""

    status = 413


class SessionNotFound(ServerError):
    """No session has this name."""

    status = 404


class SessionConflict(ServerError):
    """A session with this name is already registered."""

    status = 409


class ModelRejected(ServerError):
    """The model cannot be loaded: missing, outside the store, over a limit, or invalid."""

    status = 422


@contextmanager
def predictor_rejections(ref: str) -> Iterator[None]:
    """Re-raise the predictor's model errors (the checks it owns) as the server's 422."""
    try:
        yield
    except predictor_errors.ModelRejected as exc:
        details: dict[str, Any] = {"reason": exc.reason.value}
        if exc.limit is not None:
            details["limit"] = exc.limit
        raise ModelRejected(f"model {ref!r}: {exc.reason.value}: {exc.detail}", **details) from exc
    except predictor_errors.ModelUnavailable as exc:
        # The server reads only its mounted store: a file that is not there will not appear.
        raise ModelRejected(f"model {ref!r} is not available: {exc}") from exc


class AdmissionRefused(ServerError):
    """Adding the session would break an existing SLO (or its own); nothing changed."""

    status = 409


class BestEffortRefused(ServerError):
    """A best-effort job's longest piece fits neither the slack nor the SLOs' headroom (422).

    The rule is ``planner.overrun``'s, the one the extender's filter applies; the
    reason is the extender's event reason (``NoBestEffortSlack``)."""

    status = 422


class DropReason(enum.Enum):
    """Why a request was not served in time."""

    EARLY_DROP = "early_drop"
    """The sliding window skipped it and it could no longer meet its deadline."""
    DEADLINE_EXPIRED = "deadline_expired"
    """It could not meet its deadline even in a batch of one."""
    SESSION_REMOVED = "session_removed"
    """Its session was deleted while it waited."""
    SHUTDOWN = "shutdown"
    """The server is stopping."""
    TIMEOUT = "timeout"
    """The HTTP wait for the result ran out."""
    EXECUTION_FAILED = "execution_failed"
    """The executor raised while running the batch."""
    DEADLINE_MISSED = "deadline_missed"
    """It ran, but finished after its deadline."""
    QUEUE_FULL = "queue_full"
    """Its session's queue was at its limit."""
    SCALED_DOWN = "scaled_down"
    """Its session was scaled down while serving (the host got busier) and the
    request was above the rate it holds now."""
    THROTTLED = "throttled"
    """A best-effort job's request while best effort gives way to the SLO sessions
    (its share of the executor is none: ``sacrifice.py``)."""


class RequestDropped(ServerError):
    """A request was dropped or could not meet its deadline."""

    status = 503

    def __init__(self, reason: DropReason, message: str = ""):
        super().__init__(message or f"request dropped: {reason.value}", reason=reason.value)
        self.reason = reason
