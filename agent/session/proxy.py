"""The thin session process of an inference pod (``tandem agent session``).

An inference Deployment's container runs this process instead of a model. It
registers the pod's session with the inference server of the GPU tandem bound
the pod to, and serves the server's inference API on its own port, so a
Service, its load balancing and rolling updates work as for any HTTP backend
while the model runs, batched and scheduled, in the per-GPU server.

Node-local channel: TCP to ``hostIP:8700+i`` (the agent pod publishes each
server's port as a hostPort; the pod learns ``status.hostIP`` and
``tandem.io/gpu-index`` through the downward API). A unix socket on a hostPath
was the alternative; it was not chosen because (a) user pods would need a
hostPath volume, which the Pod Security ``baseline`` level forbids, and (b) the
server binds TCP only. The cost: the server's port is reachable from the pod
network of the cluster, so restrict it with a NetworkPolicy (docs/deploy.md),
and registering or deleting a session needs the servers' admin bearer token
(``--admin-token-file``, a mounted Secret, else ``$TANDEM_ADMIN_TOKEN``), which
this process sends on its ``POST`` and ``DELETE`` only, never on forwarded
inference requests.

Session name and who is authoritative: the name is ``<namespace>.<pod>``, the
name the agent's session sync uses, and the request body is built by the same
function (``agent.node.sessions.session_spec``, over the shared annotation validator)
from the same values (the pod's ``tandem.io/*`` annotations, passed in through
the downward API), so whichever registers first, the other finds the session and
adds nothing. The agent's sync
is authoritative: it removes sessions no pod asks for. This process registers
eagerly (the pod is ready as soon as its session is), re-registers when the
server lost it (a restarted server answers 404; a periodic check catches it
without traffic), and deregisters on SIGTERM after draining; while the pod
object still exists the agent may add it back until the pod is gone.

Errors::

    SessionProxyError
    ├── ProxyConfigError      bad flags or environment: fix the pod spec (exit 2)
    ├── RegistrationRefused   the server said no (status, error kind, reason): not ready, retry
    └── ServerUnreachable     network error or 5xx from the server: not ready, retry
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

import httpx

from agent.inference.http.auth import AdminToken, AdminTokenError
from agent.node.extender_view import PodPlacement
from agent.node.sessions import session_spec
from contracts.annotations import (
    GPU_INDEX,
    GPU_INDEX_RANGE,
    INFERENCE,
    MODEL,
    PREFIX,
    PRIORITY,
    RATE_RPS,
    SLO_MS,
    WEIGHT,
    WORKLOAD,
    AnnotationError,
    integer_or_none,
)

log = logging.getLogger(__name__)

DEFAULT_SERVER_BASE_PORT = 8700
_JOIN_SECONDS = 2.0  # the checker is a daemon thread; shutdown does not wait on a slow check
_DEREGISTER_WAIT_SECONDS = 10.0
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_POD = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class SessionProxyError(Exception):
    """Root of the session process's errors."""


class ProxyConfigError(SessionProxyError):
    """Invalid flags or environment."""


class RegistrationRefused(SessionProxyError):
    """The server refused the session (e.g. 409 AdmissionRefused, 422 ModelRejected)."""

    def __init__(self, status_code: int, kind: str, reason: str) -> None:
        super().__init__(f"server refused the session: HTTP {status_code} {kind}: {reason}")
        self.status_code = status_code
        self.kind = kind
        self.reason = reason


class ServerUnreachable(SessionProxyError):
    """The server did not answer, or answered with a server error."""


@dataclass(frozen=True)
class SessionRequest:
    """The session to register: name and the ``POST /v1/sessions`` body."""

    name: str
    gpu_index: int
    body: tuple[tuple[str, Any], ...]

    def json(self) -> dict[str, Any]:
        """The registration body."""
        return dict(self.body)


def session_request(name: str, model: str, gpu_index: int, *, slo_ms: float | None = None,
                    rate_rps: float | None = None, weight: int | None = None,
                    priority: int | None = None) -> SessionRequest:
    """The session as the agent would register it for this pod; ``ProxyConfigError`` if invalid."""
    namespace, _, pod = name.partition(".")
    if not _NAMESPACE.match(namespace) or not _POD.match(pod):
        raise ProxyConfigError(f"session name {name!r}: expected <namespace>.<pod>, the name "
                               "the agent uses (set POD_NAMESPACE and POD_NAME)")
    # The flags carry the pod's annotations (downward API), so they go through the
    # extender's validator and become the very body the agent's sync would send: an
    # SLO wins over a weight or priority, a priority over a weight.
    values = {MODEL: model, SLO_MS: slo_ms, RATE_RPS: rate_rps, WEIGHT: weight,
              PRIORITY: priority}
    annotations = {WORKLOAD: INFERENCE, **{k: str(v) for k, v in values.items() if v is not None}}
    placement = PodPlacement(uid="", name=pod, namespace=namespace, gpu_index=gpu_index,
                             predicted_util_percent=None, memory_mib=None,
                             annotations=tuple(sorted(annotations.items())))
    try:
        spec = session_spec(placement)
    except AnnotationError as err:  # the same check the extender and the agent make
        flag = "--" + err.field.removeprefix(PREFIX)
        raise ProxyConfigError(f"{flag} {err.value!r}: {err.problem}") from None
    return SessionRequest(spec.name, gpu_index, spec.body)


def parse_gpu_index(value: str | None) -> int:
    """The one GPU index of ``tandem.io/gpu-index``; a session lives on exactly one GPU."""
    if not value:
        raise ProxyConfigError(f"no GPU index: the pod has no {GPU_INDEX} annotation "
                               "(was it scheduled with schedulerName: tandem?)")
    index = integer_or_none(value, GPU_INDEX_RANGE)
    if index is None:
        raise ProxyConfigError(f"{GPU_INDEX} {value[:64]!r}: a session needs exactly one GPU "
                               f"(an integer in [0, {GPU_INDEX_RANGE.high}])")
    return index


def server_url(host: str, gpu_index: int, base_port: int = DEFAULT_SERVER_BASE_PORT) -> str:
    """GPU ``gpu_index``'s server on the node (``http://host:base+i``)."""
    if not host:
        raise ProxyConfigError("no server host: set TANDEM_SERVER_HOST from status.hostIP")
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{base_port + gpu_index}"


@dataclass(frozen=True)
class LinkState:
    """What the session process knows about its server (``/readyz`` answers it)."""

    registered: bool = False
    server_reachable: bool = False
    reason: str | None = "not checked yet"
    registrations: int = 0
    checks: int = 0


@dataclass(frozen=True)
class Forwarded:
    """An answer from the server, its body still streaming; ``close`` when done."""

    status_code: int
    headers: tuple[tuple[str, str], ...]
    chunks: Iterator[bytes]
    close: Callable[[], None]


_PASSED_HEADERS = ("content-type", "x-tandem-latency-ms", "x-tandem-late")


class SessionLink:
    """The client side: registers, checks, forwards and deregisters one session."""

    def __init__(self, server: str, session: SessionRequest, *,
                 transport: httpx.BaseTransport | None = None,
                 admin_timeout_seconds: float = 5.0,
                 register_timeout_seconds: float = 60.0,
                 infer_timeout_seconds: float = 90.0,
                 admin_token: AdminToken | None = None) -> None:
        self.server = server.rstrip("/")
        self.session = session
        self.admin_token = admin_token
        self._client = httpx.Client(transport=transport, timeout=admin_timeout_seconds)
        # Registration loads and profiles the model on the server: seconds, not ms.
        self._register_timeout = httpx.Timeout(register_timeout_seconds, connect=5.0)
        # Above the server's own wait (4 x SLO + 1 s; 60 s for best effort).
        self._infer_timeout = httpx.Timeout(infer_timeout_seconds, connect=5.0)
        self._lock = threading.Lock()
        self._closed = False
        self._state = LinkState()
        self._logged: str | None = None
        self._path = f"/v1/sessions/{quote(session.name, safe='')}"

    @property
    def state(self) -> LinkState:
        """The current state (immutable snapshot)."""
        return self._state

    def ensure(self) -> LinkState:
        """Make sure the server holds the session (idempotent); never raises."""
        with self._lock:
            if self._closed:  # deregistered: a late check must not add it back
                return self._state
            try:
                registered_now = self._ensure_locked()
            except SessionProxyError as err:
                self._set(registered=False, server_reachable=not isinstance(
                    err, ServerUnreachable), reason=str(err), checks=self._state.checks + 1)
                self._log_once(logging.WARNING, "session not registered", str(err))
                return self._state
            self._set(registered=True, server_reachable=True, reason=None,
                      checks=self._state.checks + 1,
                      registrations=self._state.registrations + int(registered_now))
            if registered_now:
                log.info("session registered", extra={"session": self.session.name,
                                                      "server": self.server})
            self._logged = None
            return self._state

    def _ensure_locked(self) -> bool:
        present = self._get_sessions()
        if self.session.name in present:
            self._check_same(present[self.session.name])
            return False
        response = self._request("POST", "/v1/sessions", json=self.session.json(),
                                 timeout=self._register_timeout, admin=True)
        if response.status_code < 300:
            return True
        kind, reason = _error_of(response)
        if response.status_code == 409 and kind == "SessionConflict":
            return False  # the agent's sync registered it between our GET and POST
        raise RegistrationRefused(response.status_code, kind, reason)

    def _get_sessions(self) -> dict[str, dict[str, Any]]:
        response = self._request("GET", "/v1/sessions")
        try:
            entries = response.json()["sessions"]
            return {str(e["name"]): e for e in entries}
        except (ValueError, KeyError, TypeError) as err:
            raise ServerUnreachable(f"unexpected /v1/sessions answer: {err}") from None

    def _check_same(self, entry: dict[str, Any]) -> None:
        want = self.session.json()
        # Not rate_rps: the server replans with the observed rate and reports that.
        differs = sorted(k for k in ("model", "slo_ms", "weight", "priority")
                         if k in want and k in entry and entry[k] != want[k])
        if differs:  # the agent (pod annotations) is authoritative: do not fight it
            self._log_once(logging.WARNING, "session registered with other values",
                           f"fields {differs} differ; keeping the server's")

    def _request(self, method: str, path: str, *, admin: bool = False,
                 **kwargs: Any) -> httpx.Response:
        """One call to the server; ``admin`` calls carry the bearer token."""
        if admin and self.admin_token is not None:
            try:
                kwargs["headers"] = self.admin_token.headers()  # re-read: rotation needs no restart
            except AdminTokenError as err:
                raise ProxyConfigError(str(err)) from None
        try:
            response = self._client.request(method, f"{self.server}{path}", **kwargs)
        except httpx.HTTPError as err:
            raise ServerUnreachable(f"{self.server}: {type(err).__name__}: {err}") from None
        if response.status_code >= 500:
            raise ServerUnreachable(f"{self.server}{path}: HTTP {response.status_code}")
        return response

    def deregister(self) -> bool:
        """Delete the session from the server; True if it is gone. Later checks do nothing."""
        self._closed = True
        # Wait (bounded) for a registration in flight, so it cannot land after the DELETE.
        locked = self._lock.acquire(timeout=_DEREGISTER_WAIT_SECONDS)
        try:
            response = self._request("DELETE", self._path, admin=True)
        except (ServerUnreachable, ProxyConfigError) as err:
            log.warning("deregistration failed", extra={"session": self.session.name,
                                                        "error": str(err)})
            return False
        finally:
            if locked:
                self._lock.release()
        self._set(registered=False, reason="deregistered")
        log.info("session deregistered", extra={"session": self.session.name})
        return response.status_code < 300 or response.status_code == 404

    def slo_ms(self) -> float | None:
        """The session's SLO (None for a best-effort job)."""
        slo = dict(self.session.body).get("slo_ms")
        return float(slo) if isinstance(slo, int | float) else None

    def forward(self, body: bytes, content_type: str,
                headers: dict[str, str] | None = None) -> Forwarded:
        """POST an inference request (with the deadline ``headers``); re-registers once
        if the server lost the session."""
        sent = {"Content-Type": content_type, **(headers or {})}
        response = self._send(body, sent)
        if response.status_code == 404 and _peek_kind(response) == "SessionNotFound":
            response.close()
            log.warning("server lost the session; registering again",
                        extra={"session": self.session.name})
            self._set(registered=False, reason="server lost the session")
            self.ensure()
            # Nothing ran the first time (404), so one retry is safe; if registration
            # failed, the retry's 404 is the caller's answer.
            response = self._send(body, sent)
        passed = tuple((k, v) for k, v in response.headers.items()
                        if k.lower() in _PASSED_HEADERS)
        return Forwarded(response.status_code, passed, response.iter_bytes(), response.close)

    def _send(self, body: bytes, headers: dict[str, str]) -> httpx.Response:
        request = self._client.build_request(
            "POST", f"{self.server}{self._path}/infer", content=body,
            headers=headers, timeout=self._infer_timeout)
        try:
            response = self._client.send(request, stream=True)
        except httpx.ConnectError:  # a slow answer (timeout) says nothing about reachability
            self._set(server_reachable=False, reason="server unreachable")
            raise
        if not self._state.server_reachable and self._state.registered:
            self._set(server_reachable=True, reason=None)
        return response

    def _set(self, **changes: Any) -> None:
        self._state = replace(self._state, **changes)

    def _log_once(self, level: int, msg: str, detail: str) -> None:
        if detail != self._logged:  # a refusal repeats every check: log each new one once
            self._logged = detail
            log.log(level, msg, extra={"session": self.session.name, "detail": detail})

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()


def _error_of(response: httpx.Response) -> tuple[str, str]:
    try:
        document = response.json()
        return str(document.get("error", "")), str(document.get("reason")
                                                   or document.get("message", ""))
    except (ValueError, AttributeError):
        return "", response.text[:200]


def _peek_kind(response: httpx.Response) -> str:
    response.read()  # an error body is small; infer bodies are not peeked (status != 404)
    return _error_of(response)[0]


@dataclass
class Checker:
    """Calls ``link.ensure()`` every interval on a thread until stopped."""

    link: SessionLink
    interval_seconds: float = 5.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Check now and then every interval."""
        self._thread = threading.Thread(target=self._run, name="session-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.link.ensure()
            self._stop.wait(self.interval_seconds)

    def stop(self) -> None:
        """Stop checking (waits for a check in progress)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=_JOIN_SECONDS)
