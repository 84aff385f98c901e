"""cheroot servers that slow or stuck clients cannot take over.

cheroot hands a connection to a worker thread as soon as one byte is readable,
and the worker then blocks until the whole request has arrived. A client that
sends one byte every few seconds therefore holds a worker indefinitely (each
read is within the socket timeout), and as many such clients as there are
workers stop the server answering anything, health checks included.

:func:`harden` changes two things, for the extender and the inference server:

- **Request first, worker second.** A worker reads only what is already there
  (non-blocking) into a per-connection buffer and, while the request head (and a
  ``Content-Length`` body up to ``body_limit``) is incomplete, gives the
  connection back to cheroot's selector at once. So a slow client costs a few
  microseconds per byte, never a blocked worker. A request not complete within
  ``read_deadline_seconds`` of its first byte is dropped.
- **Strict headers, answered in JSON.** A ``Content-Length`` that is not plain
  digits (``-5``, ``+5``, ``abc``), two that disagree, one beside
  ``Transfer-Encoding`` (the request-smuggling shapes), or a repeated ``Host`` or
  ``Authorization`` header gets HTTP 400 with the reason, before any application
  code runs; every error cheroot itself answers carries a JSON body
  (``error_body``) in the server's own error shape instead of plain text.
- **413 before the body.** A request whose declared ``Content-Length`` is over
  ``body_limit`` is answered 413 as soon as its head is here, without waiting for
  (or reading) the body, and the connection is closed. Applications read bodies
  with :func:`read_body`, the one size-limited reader (the same rule for requests
  that reach them another way, e.g. a test client, and for chunked bodies).
- **When the request arrived, for the application.** Each request's WSGI
  environ carries ``tandem.arrived`` (``time.monotonic()`` seconds): when its
  connection was accepted, or for a later request on a kept-alive connection
  when its first byte was read. A server with deadlines counts them from there,
  so time spent waiting for a worker is not hidden from it.
- **Its own errors as JSON log lines.** cheroot writes its error log (a worker's
  unexpected exception, a socket error mid-request) to stderr as raw text and a
  traceback; here it goes through logging (``contracts.logs``): one JSON line, the
  traceback in its ``exc`` field.
- **TLS handshakes off the accept loop.** cheroot's builtin adapter completes
  the handshake in the thread that accepts connections, so a client that
  connects and stays silent stalls every accept for the socket timeout. The
  adapter here defers the handshake; the non-blocking reads above drive it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from cheroot.makefile import MakeFile
from cheroot.server import HeaderReader, HTTPConnection, HTTPRequest
from cheroot.ssl.builtin import BuiltinSSLAdapter

DEFAULT_READ_DEADLINE_SECONDS = 10.0
KEEP_ALIVE_CONNECTIONS = 512
"""Open keep-alive connections kept (idle ones wait in the selector, without a worker)."""
ARRIVED = "tandem.arrived"
"""WSGI environ key: when the request arrived, in ``time.monotonic()`` seconds."""
CLIENT_VERIFY = "SSL_CLIENT_VERIFY"
"""WSGI environ key: ``SUCCESS`` when the TLS client presented a verified certificate."""
CLIENT_CN = "SSL_CLIENT_S_DN_CN"
"""WSGI environ key: the common name of that certificate's subject."""
MAX_HEAD_BYTES = 64 * 1024
"""A request head longer than this is handed to cheroot at once (which refuses it)."""
_HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]{1,18})[ \t]*\r\n", re.IGNORECASE)
_EXPECT_CONTINUE = re.compile(rb"\r\nexpect:[ \t]*100-continue[ \t]*\r\n", re.IGNORECASE)
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


_DIGITS = re.compile(rb"[0-9]{1,18}")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""RFC 9110 field names: no spaces (``Host :`` is a request-smuggling shape)."""
_SINGLE = (b"Content-Length", b"Host", b"Authorization")
"""Headers a request may carry once (Content-Length: several only when all agree)."""


_KINDS = {"413": "PayloadTooLarge", "408": "RequestTimeout", "414": "URITooLong"}
"""The error kind of the answers the server gives itself (others: BadRequest)."""


def json_error(message: str, kind: str = "BadRequest") -> bytes:
    """The default error body: the inference server's and the session proxy's shape."""
    return json.dumps({"error": kind, "message": message}).encode()


class BodyTooLarge(ValueError):
    """The request body is (or says it is) over the limit: HTTP 413."""

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"body larger than {limit} bytes")


class BadContentLength(ValueError):
    """The ``Content-Length`` header is not a plain non-negative integer: HTTP 400."""


_READ_CHUNK = 1 << 16


def read_body(environ: Mapping[str, Any], limit: int) -> bytes:
    """The request body of a WSGI ``environ``, never more than ``limit`` bytes buffered.

    A declared length over ``limit`` is refused before anything is read; without a
    length only a server-terminated (chunked) stream is read, and refused once it
    passes ``limit``. BodyTooLarge (413) or BadContentLength (400).
    """
    raw = environ.get("CONTENT_LENGTH")
    if raw and not _DIGITS.fullmatch(str(raw).encode("latin-1", "replace")):
        raise BadContentLength("Content-Length must be a non-negative integer "
                               "(at most 18 digits)")
    length = int(raw) if raw else None
    if length is not None and length > limit:
        raise BodyTooLarge(limit)
    stream = environ["wsgi.input"]
    if length is not None:
        return bytes(stream.read(length)) if length else b""
    if not environ.get("wsgi.input_terminated"):
        return b""
    parts, total = [], 0
    while True:
        chunk = stream.read(min(_READ_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(parts)
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(limit)
        parts.append(chunk)


class _SeenHeaders(dict):  # type: ignore[type-arg]
    """A header dict that remembers every value given to a single-valued header."""

    def __init__(self) -> None:
        super().__init__()
        self.repeated: dict[bytes, list[bytes]] = {}

    def __setitem__(self, key: bytes, value: bytes) -> None:
        if key in _SINGLE:
            self.repeated.setdefault(key, []).append(value)
        super().__setitem__(key, value)


class StrictHeaderReader(HeaderReader):
    """cheroot's header reader, plus the checks cheroot leaves out (ValueError: a 400)."""

    def __call__(self, rfile: Any, hdict: Any = None) -> Any:
        """Read the headers into ``hdict``; ValueError with the reason when malformed."""
        seen = _SeenHeaders()
        super().__call__(rfile, seen)
        lengths = seen.repeated.get(b"Content-Length", [])
        for value in lengths:
            if not _DIGITS.fullmatch(value):
                raise ValueError("Content-Length must be a non-negative integer "
                                 "(at most 18 digits)")
        if len(set(lengths)) > 1:
            raise ValueError("conflicting Content-Length headers")
        if lengths and b"Transfer-Encoding" in seen:
            raise ValueError("Content-Length together with Transfer-Encoding")
        for name in (b"Host", b"Authorization"):
            if len(seen.repeated.get(name, [])) > 1:
                raise ValueError(f"more than one {name.decode()} header")
        hdict = {} if hdict is None else hdict
        hdict.update(seen)
        return hdict


    def _transform_key(self, key_name: bytes) -> bytes:
        if not _TOKEN.fullmatch(key_name):
            raise ValueError("malformed header name")
        return super()._transform_key(key_name)


class JsonErrorRequest(HTTPRequest):
    """An HTTPRequest whose own error answers (400, 408, 413, 501...) are JSON, and which
    answers 413 to a declared body over ``body_limit`` before the application runs."""

    header_reader = StrictHeaderReader()
    error_body: Callable[[str, str], bytes] = staticmethod(json_error)
    body_limit = 0
    """0: no limit here (the application's)."""

    def read_request_headers(self) -> bool:
        """cheroot's header reading, then the size check on the declared length."""
        if not super().read_request_headers():
            return False
        declared = self.inheaders.get(b"Content-Length")
        if self.body_limit and declared and int(declared) > self.body_limit:
            self.simple_response("413 Payload Too Large",
                                 f"body larger than {self.body_limit} bytes")
            return False
        return True

    def simple_response(self, status: Any, msg: Any = "") -> None:
        """cheroot's simple response, with the message as a JSON error body."""
        code = str(status)[:3]
        if code < "400":
            super().simple_response(status, msg)
            return
        text = msg.decode("latin-1") if isinstance(msg, bytes) else str(msg or status)
        body = self.error_body(text, _KINDS.get(code, "BadRequest"))
        head = [f"{self.server.protocol} {status}", "Content-Type: application/json",
                f"Content-Length: {len(body)}"]
        if code in ("400", "413", "414"):
            self.close_connection = True  # the rest of the stream cannot be trusted
            head.append("Connection: close")
        wire = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        with contextlib.suppress(OSError):  # the client went away; nothing left to tell it
            self.conn.wfile.write(wire)


class _BufferedSocket:
    """A socket whose reads return the bytes gathered ahead of time first."""

    def __init__(self, sock: Any):
        self._sock = sock
        self.gathered = bytearray()

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """Serve gathered bytes, then read the socket."""
        if self.gathered:
            n = min(len(buffer), nbytes or len(buffer), len(self.gathered))
            buffer[:n] = self.gathered[:n]
            del self.gathered[:n]
            return n
        return self._sock.recv_into(buffer, nbytes, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class GatheringConnection(HTTPConnection):
    """An HTTPConnection that waits in the selector, not in a worker, for its request."""

    read_deadline_seconds = DEFAULT_READ_DEADLINE_SECONDS
    body_limit = 4 << 20

    def __init__(self, server: Any, sock: Any, makefile: Any = MakeFile):
        super().__init__(server, sock, makefile)
        self._buffered = _BufferedSocket(sock)
        self.rfile = makefile(self._buffered, "rb", self.rbufsize)
        self._first_byte_at: float | None = None
        self.arrived_at: float | None = time.monotonic()
        """When the request being gathered arrived: its accept, or a kept-alive
        request's first byte."""
        self._eof = False

    def communicate(self) -> bool:
        """Serve one request once it is all here; until then, back to the selector."""
        self._take_back_read_ahead()
        if not self._gather():
            if self._eof:
                return False
            started = self._first_byte_at
            return started is None or \
                time.monotonic() - started < self.read_deadline_seconds
        self._first_byte_at = None
        self._note_client_certificate()
        try:
            return bool(super().communicate())
        finally:
            self.arrived_at = None  # the next request on this connection stamps its own

    def _take_back_read_ahead(self) -> None:
        """Bytes of a pipelined request that cheroot read ahead go back before the gathered
        ones, so that request too is served only once all here (a worker read the rest of
        it from the socket, for as long as a trickle kept each byte within the timeout)."""
        ahead = bytearray()
        while self.rfile.has_data():
            ahead += self.rfile.read1(65536)
        self._buffered.gathered[:0] = ahead

    def _note_client_certificate(self) -> None:
        """Once the handshake is done: whether the client proved a certificate (mutual
        TLS; the handshake verified it where the server asked for one), for WSGI."""
        getpeercert = getattr(self.socket, "getpeercert", None)
        if getpeercert is None or self.ssl_env is None or CLIENT_VERIFY in self.ssl_env:
            return
        try:
            cert = getpeercert()
        except ValueError:  # not connected or no handshake: no certificate
            cert = None
        self.ssl_env[CLIENT_VERIFY] = "SUCCESS" if cert else "NONE"
        if cert:
            subject = dict(pair for rdn in cert.get("subject", ()) for pair in rdn)
            self.ssl_env[CLIENT_CN] = str(subject.get("commonName", ""))

    def _gather(self) -> bool:
        """Read what is available without blocking; True when the request is complete
        (or can never be: end of stream, a head over the size limit)."""
        data = self._buffered.gathered
        sock = self.socket
        sock.settimeout(0)
        try:
            while not self._complete(data):
                try:
                    chunk = sock.recv(65536)
                except _WOULD_BLOCK:
                    break
                except (OSError, ssl.SSLError):
                    self._eof = True
                    return False
                if not chunk:
                    self._eof = True
                    return bool(data)  # a partial request: let cheroot answer 400
                if self._first_byte_at is None:
                    self._first_byte_at = time.monotonic()
                if self.arrived_at is None:
                    self.arrived_at = self._first_byte_at
                data += chunk
        finally:
            sock.settimeout(self.server.timeout)
        return self._complete(data)

    def _complete(self, data: bytearray) -> bool:
        end = data.find(_HEAD_END)
        if end < 0:
            return len(data) > (self.server.max_request_header_size or MAX_HEAD_BYTES)
        if _EXPECT_CONTINUE.search(data, 0, end + 2):
            return True  # the client sends its body only after cheroot's 100 Continue
        match = _CONTENT_LENGTH.search(data, 0, end + 2)
        wanted = int(match.group(1)) if match else 0
        if wanted > self.body_limit:
            return True  # answered 413 from the head alone: wait for no body
        return len(data) >= end + len(_HEAD_END) + wanted


class DeferredHandshakeAdapter(BuiltinSSLAdapter):
    """TLS whose handshake happens in the connection's reads, not in the accept loop."""

    def wrap(self, sock: socket.socket) -> tuple[Any, dict[str, str]]:
        """Wrap without the handshake; WSGI gets the scheme (no cipher details)."""
        wrapped = self.context.wrap_socket(sock, do_handshake_on_connect=False,
                                           server_side=True)
        return wrapped, {"wsgi.url_scheme": "https", "HTTPS": "on"}


def harden(server: Any, read_deadline_seconds: float = DEFAULT_READ_DEADLINE_SECONDS,
           body_limit: int = 4 << 20,
           error_body: Callable[[str, str], bytes] = json_error) -> Any:
    """Make ``server`` (a cheroot ``wsgi.Server``) gather requests before using a worker,
    refuse malformed headers with a 400 and declared bodies over ``body_limit`` with a 413,
    and answer its own errors with ``error_body(message, kind)``.

    It also keeps up to ``KEEP_ALIVE_CONNECTIONS`` keep-alive connections: cheroot's
    default (10) answers ``Connection: close`` to every request once ten are open, so a
    scheduler binding 16 pods at once reconnected (and redid TLS) on every call.
    """
    server.keep_alive_conn_limit = KEEP_ALIVE_CONNECTIONS
    # The head handed over unfinished at MAX_HEAD_BYTES is refused (413) from what is
    # here; with cheroot's default (no limit) a worker read the rest from the socket.
    server.max_request_header_size = server.max_request_header_size or MAX_HEAD_BYTES
    request_class = type("TandemRequest", (JsonErrorRequest,), {
        "error_body": staticmethod(error_body), "body_limit": body_limit})
    server.ConnectionClass = type("TandemConnection", (GatheringConnection,), {
        "read_deadline_seconds": read_deadline_seconds, "body_limit": body_limit,
        "RequestHandlerClass": request_class})
    server.gateway = _stamped(server.gateway)
    server.error_log = _error_log
    return server


_SERVER_LOG = logging.getLogger("tandem.http")


def _error_log(msg: str = "", level: int = logging.INFO, traceback: bool = False) -> None:
    """cheroot's ``error_log`` (same signature), as a log record instead of raw stderr."""
    _SERVER_LOG.log(level, str(msg), exc_info=traceback or None)


def _stamped(gateway: Any) -> Any:
    """``gateway`` whose environ carries the request's arrival time (``ARRIVED``)."""

    def get_environ(self: Any) -> Any:
        env = gateway.get_environ(self)
        env[ARRIVED] = getattr(self.req.conn, "arrived_at", None) or time.monotonic()
        return env

    return type(f"Stamped{gateway.__name__}", (gateway,), {"get_environ": get_environ})


def tls_adapter(cert_file: str, key_file: str) -> DeferredHandshakeAdapter:
    """The TLS adapter for a hardened server."""
    return DeferredHandshakeAdapter(cert_file, key_file)


def stop_on_signals(server: Any, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
                    ) -> threading.Event:
    """Stop ``server`` (a cheroot server whose ``serve()`` runs in this, the main thread)
    when one of ``signals`` arrives; the event is set once it has stopped.

    The stop runs in a thread of its own: the handler interrupts the thread inside
    ``serve()``, and ``stop()`` called from that frame waits on the loop it interrupted
    (the process stayed up until SIGKILL)."""
    stopped = threading.Event()

    def stop() -> None:
        try:
            server.stop()
        finally:
            stopped.set()

    def on_signal(*_: object) -> None:
        threading.Thread(target=stop, name="tandem-stop", daemon=True).start()

    for signum in signals:
        signal.signal(signum, on_signal)
    return stopped
