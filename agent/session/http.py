"""HTTP side of the session process: the Flask app it serves and its cheroot lifecycle.

Routes: ``POST /infer`` and ``POST /v1/sessions/NAME/infer`` (the server's own
path, so clients can switch between the pod's Service and the server), both
forwarding the body and its Content-Type unchanged and streaming the answer
back with its status (a 503 drop keeps its JSON ``reason``); ``GET /livez``;
``GET /readyz`` (200 only while the session is registered, the server answers
and the process is not draining). Bodies over the limit get 413 before any
byte is forwarded. cheroot serves it hardened like the inference server
(``contracts.httpserve``): a request is read in full, within
``read_deadline_seconds`` of its first byte, before a worker takes it, and
malformed headers get a 400.

Shutdown (SIGTERM, as in a rollout): readiness turns 503 at once so the
endpoints controller drops the pod, requests keep being served for
``shutdown_delay_seconds`` (endpoint removal is asynchronous), then the HTTP
server stops after its in-flight requests and the session is deregistered.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from agent.session.proxy import Checker, ProxyConfigError, SessionLink
from contracts.deadline import (
    DEADLINE_HEADER,
    TIMEOUT_HEADER,
    DeadlineHeaderError,
    accepts_late,
    client_budget_ms,
)
from contracts.httpserve import ARRIVED, BadContentLength, BodyTooLarge, read_body

log = logging.getLogger(__name__)

_LISTEN_BACKLOG = 128  # connections the kernel queues before accept (cheroot's default: 5)


@dataclass(frozen=True)
class ProxyConfig:
    """Settings of the session process's own HTTP side."""

    listen_host: str = "0.0.0.0"
    listen_port: int = 8080
    """0: any free port (tests)"""
    max_body_bytes: int = 64 * 2**20
    """largest request body forwarded; the server's default limit"""
    check_interval_seconds: float = 5.0
    """how often registration is re-checked without traffic; 0.05..3600"""
    shutdown_delay_seconds: float = 3.0
    """keep serving this long after SIGTERM while readiness is already 503"""
    deregister: bool = True
    """delete the session on shutdown"""
    http_threads: int = 16
    """workers; slow clients never hold one (``contracts.httpserve``)"""
    read_deadline_seconds: float = 10.0
    """a request must arrive in full within this of its first byte; 0.1..600"""

    def __post_init__(self) -> None:
        if not 0 <= self.listen_port <= 65535:
            raise ProxyConfigError(f"listen port {self.listen_port}: expected 0..65535")
        if self.max_body_bytes < 1:
            raise ProxyConfigError("max_body_bytes must be >= 1")
        if not 0.05 <= self.check_interval_seconds <= 3600:
            raise ProxyConfigError("check interval: expected 0.05..3600 s")
        if not 0 <= self.shutdown_delay_seconds <= 300:
            raise ProxyConfigError("shutdown delay: expected 0..300 s")
        if self.http_threads < 1:
            raise ProxyConfigError("http_threads must be >= 1")
        if not 0.1 <= self.read_deadline_seconds <= 600:
            raise ProxyConfigError("read deadline: expected 0.1..600 s")


def create_proxy_app(link: SessionLink, config: ProxyConfig,
                     draining: threading.Event | None = None) -> Flask:
    """The session process's Flask app over ``link``."""
    app = Flask("tandem-session")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    draining = draining or threading.Event()

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException) -> tuple[Response, int]:
        kind = "PayloadTooLarge" if isinstance(err, RequestEntityTooLarge) else type(err).__name__
        return jsonify({"error": kind, "message": err.description}), err.code or 500

    def forward() -> Response | tuple[Response, int]:
        try:
            body = read_body(request.environ, config.max_body_bytes)
        except BodyTooLarge:
            return _error(413, "PayloadTooLarge",
                          f"body over the {config.max_body_bytes}-byte limit")
        except BadContentLength as err:
            return _error(400, "BadRequest", str(err))
        content_type = request.content_type or ""
        if not content_type.isascii() or not content_type.isprintable():
            # Header values forwarded to the server must be plain ASCII (RFC 9110 field values).
            return _error(400, "BadRequest", "Content-Type must be printable ASCII, "
                          "for example application/json or application/x-npy")
        deadline = _deadline_headers(link.slo_ms())
        if isinstance(deadline, tuple):
            return deadline
        try:
            answer = link.forward(body, content_type, deadline)
        except httpx.TimeoutException:
            return _error(504, "ServerTimeout", "the inference server did not answer in time")
        except httpx.TransportError as err:
            return _error(502, "ServerUnavailable", f"inference server: {type(err).__name__}")
        response = Response(_stream(answer.chunks), status=answer.status_code,
                            headers=list(answer.headers), direct_passthrough=True)
        response.call_on_close(answer.close)
        return response

    @app.post("/infer")
    def infer() -> Response | tuple[Response, int]:
        return forward()

    @app.post("/v1/sessions/<name>/infer")
    def infer_named(name: str) -> Response | tuple[Response, int]:
        if name != link.session.name:
            return _error(404, "SessionNotFound", f"this pod serves {link.session.name!r}")
        return forward()

    @app.get("/livez")
    def livez() -> Response:
        return jsonify({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> tuple[Response, int]:
        state = link.state
        ready = state.registered and state.server_reachable and not draining.is_set()
        reason = "draining" if draining.is_set() else state.reason
        return jsonify({"status": "ready" if ready else "not ready", "reason": reason,
                        "session": link.session.name, "server": link.server,
                        "registrations": state.registrations}), 200 if ready else 503

    return app


def _deadline_headers(slo_ms: float | None) -> dict[str, str] | tuple[Response, int]:
    """The deadline headers to forward: what is left of the client's budget (or the
    SLO) after the time this request spent here; an error answer when none is left."""
    try:
        budget = client_budget_ms(request.headers)
        late = accepts_late(request.headers)
    except DeadlineHeaderError as exc:
        return _error(400, "BadRequest", str(exc))
    limits = [b for b in (budget, slo_ms) if b is not None]
    headers = {"X-Tandem-Late": "accept"} if late else {}
    if DEADLINE_HEADER in request.headers:  # absolute: counts this hop by itself
        headers[DEADLINE_HEADER] = request.headers[DEADLINE_HEADER]
    if limits:
        arrived = request.environ.get(ARRIVED, time.monotonic())
        left = min(limits) - (time.monotonic() - arrived) * 1000.0
        if left <= 0:
            return jsonify({"error": "RequestDropped", "reason": "deadline_expired",
                            "message": "request dropped: deadline_expired"}), 503
        headers[TIMEOUT_HEADER] = f"{left:.3f}"
    return headers


def _stream(chunks: Iterator[bytes]) -> Iterator[bytes]:
    try:
        yield from chunks
    except httpx.HTTPError as err:  # the server went away mid-answer: end the body
        log.warning("answer stream broke", extra={"error": type(err).__name__})


def _error(status: int, kind: str, message: str) -> tuple[Response, int]:
    return jsonify({"error": kind, "message": message}), status


class ProxyServer:
    """cheroot serving the proxy app on a thread, with the registration checker."""

    def __init__(self, link: SessionLink, config: ProxyConfig) -> None:
        from cheroot import wsgi

        from contracts.httpserve import harden

        self.link = link
        self.config = config
        self.draining = threading.Event()
        self._app = create_proxy_app(link, config, self.draining)
        # Requests are gathered before a worker takes them and must arrive within the
        # deadline, so slow clients cannot take the workers; malformed headers get a 400.
        self._server = harden(
            wsgi.Server((config.listen_host, config.listen_port), self._app,
                        numthreads=config.http_threads, request_queue_size=_LISTEN_BACKLOG),
            config.read_deadline_seconds, config.max_body_bytes)
        self._checker = Checker(link, config.check_interval_seconds)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (after ``start``)."""
        return int(self._server.bind_addr[1])

    def start(self) -> None:
        """Bind, serve on a thread, start checking registration."""
        self._server.prepare()
        self._thread = threading.Thread(target=self._server.serve, name="session-http",
                                        daemon=True)
        self._thread.start()
        self._checker.start()

    def shutdown(self, wait: threading.Event | None = None) -> None:
        """Drain: not ready, keep serving ``shutdown_delay``, stop HTTP, deregister."""
        self.draining.set()
        (wait or threading.Event()).wait(self.config.shutdown_delay_seconds)
        self._checker.stop()
        self._server.stop()  # joins the worker threads after their current requests
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.config.deregister:
            self.link.deregister()
        self.link.close()


def serve_forever(server: ProxyServer) -> None:
    """Run until SIGTERM/SIGINT, then shut down cleanly (the main thread's loop)."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    print(json.dumps({"event": "session serving", "session": server.link.session.name,
                      "server": server.link.server, "port": server.port}), flush=True)
    stop.wait()
    log.info("session stopping", extra={"session": server.link.session.name})
    server.shutdown()
