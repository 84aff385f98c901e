"""Bearer-token auth of the inference server's session-management endpoints.

Guarded: ``POST /v1/sessions`` and ``DELETE /v1/sessions/NAME``. They change
what runs on the GPU, and the servers are published as hostPorts on the node's
IP, so anything that reaches the node could otherwise add or remove sessions.

Open, on purpose:

- ``POST /v1/sessions/NAME/infer`` is the data path. The session process of
  each inference pod forwards its clients' requests there; it is node-local
  (hostPort) and its load is bounded by the session's duty-cycle slot and queue
  limit, so a stray caller can only spend that session's own slot, never
  another session's.
- ``GET /v1/sessions``, ``/metrics``, ``/livez``, ``/readyz`` are read-only
  (counters and plan, no tensors) and are what probes and Prometheus scrape.

The token is read from a file (a mounted Secret, re-read on every check so a
rotation takes effect without a restart) or from ``$TANDEM_ADMIN_TOKEN``, by
``contracts.tokens`` (stripped, compared in constant time, in no log, error or
repr). This module has no HTTP dependency, so the agent's clients (session sync,
session process) read the token with the same ``AdminToken``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from agent.inference.errors import Unauthorized
from contracts.listen import is_loopback as is_loopback  # the agent's servers import it here
from contracts.tokens import BearerToken, TokenError, bearer_of, same_token

log = logging.getLogger(__name__)

ADMIN_TOKEN_ENV = "TANDEM_ADMIN_TOKEN"


AdminTokenError = TokenError
"""No usable token: the file is missing, unreadable or empty, or the variable is unset."""


class AdminToken(BearerToken):
    """The admin bearer token, from a file (re-read on each ``get``) or an environment variable."""

    def __init__(self, path: Path | None = None, env: str = ADMIN_TOKEN_ENV,
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(path, env, environ, label="admin token", flag="--admin-token-file")
        self.get()  # fail at start with a clear message, not at the first call

    @classmethod
    def configured(cls, path: Path | None, env: str = ADMIN_TOKEN_ENV,
                   environ: Mapping[str, str] | None = None) -> AdminToken | None:
        """The token from ``path``, else from ``env`` if set, else None (no token configured)."""
        environ = os.environ if environ is None else environ
        if path is None and not environ.get(env, "").strip():
            return None
        return cls(path, env, environ)


class AdminGuard:
    """Checks ``Authorization`` headers against the token, in constant time."""

    def __init__(self, token: AdminToken) -> None:
        self._token = token
        self._last = token.get()
        self._lock = threading.Lock()

    def _expected(self) -> str:
        try:
            current = self._token.get()
        except AdminTokenError as err:
            # A Secret update swaps the mounted file; between reads it may briefly be
            # unreadable. Keep the last good token rather than lock the agent out.
            log.warning("admin token unreadable; using the last one read",
                        extra={"error": str(err)})
            return self._last
        with self._lock:
            self._last = current
        return current

    def check(self, authorization: str | None) -> None:
        """Raise ``Unauthorized`` unless the header is ``Bearer <token>``."""
        given = bearer_of(authorization)
        if not given:
            raise Unauthorized("admin endpoint: missing bearer token")
        if not same_token(given, self._expected()):
            raise Unauthorized("admin endpoint: wrong bearer token")
