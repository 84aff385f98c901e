"""A lean keep-alive HTTP/1.1 client for the extender's bind path: the pod read, the
placement record, the binding, and events.

Profiled against a loopback API server, one binding through the official client
took about 0.55 ms, of which the server's work was about 0.2 ms: the rest is
urllib3 and ``http.client`` (request building, two writes per request, header
parsing through ``email``), paid on every bind while the scheduler waits. This
client sends one write per request (headers and pre-encoded JSON body) and parses
only the status line, ``Content-Length``/``Transfer-Encoding`` and ``Connection``.

It takes everything from the official client's ``Configuration`` (host, TLS
files, hostname checks, bearer token with its refresh hook), so the writes go to
the same server with the same identity. Configurations it does not handle (an
HTTP proxy) are reported by :func:`supports` and stay on the official client.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import ssl
import threading
import weakref
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes.client.rest import ApiException

IDLE_CONNECTIONS = 64
"""Most idle keep-alive connections kept. kube-scheduler binds concurrently (one goroutine
per pod), so a burst has as many binds in flight as the server has threads: with fewer
kept, each burst opened new connections (a TLS handshake each) on the bind path."""


def pooled(configuration: Any) -> Any:
    """The official client's ``ApiClient`` over ``configuration``, its connection pool sized
    as the lean client's (:data:`IDLE_CONNECTIONS`). The default, ``cpu_count() * 5``, is 10
    on a 2-core host: below 16 binds in flight plus the watches each holding one, so every
    burst opened connections (a TLS handshake each) and dropped them ("Connection pool is
    full, discarding connection"). The pool is made with the ``ApiClient``, hence here."""
    configuration.connection_pool_maxsize = IDLE_CONNECTIONS
    return client.ApiClient(configuration)


def supports(configuration: Any) -> bool:
    """Whether :class:`LeanPoster` can speak for this client configuration."""
    parts = urlsplit(str(configuration.host or ""))
    return parts.scheme in ("http", "https") and bool(parts.hostname) \
        and not getattr(configuration, "proxy", None)


class _Connection:
    """One socket with a buffered reader; ``reusable`` is False once the server says close."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.reusable = True

    def stale(self) -> bool:
        """An idle keep-alive socket that is readable was closed (or sent junk): not reusable."""
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        """Close the reader and the socket."""
        self.reader.close()
        self.sock.close()


class LeanPoster:
    """Requests with JSON bytes to the API server over pooled keep-alive connections."""

    def __init__(self, configuration: Any, user_agent: str, timeout_seconds: float = 10.0):
        if not supports(configuration):
            raise ValueError(f"unsupported API server configuration: {configuration.host!r}")
        parts = urlsplit(configuration.host)
        self._config = configuration
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        self._fixed = (f"Host: {host_header}\r\nUser-Agent: {user_agent}\r\n"
                       "Accept: application/json\r\nContent-Type: application/json\r\n")
        self._timeout = timeout_seconds
        self._ssl = self._ssl_context() if self._tls else None
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        # Sockets still idle when the poster is dropped are closed, not left to the GC.
        weakref.finalize(self, _close_all, self._idle)

    def _ssl_context(self) -> ssl.SSLContext:
        cfg = self._config
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif cfg.assert_hostname is False:
            ctx.check_hostname = False
        return ctx

    def _connect(self) -> _Connection:
        sock = socket.create_connection((self._host, self._port), timeout=self._timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl is not None:
            # The name checked against the certificate (and sent as SNI), as urllib3 would.
            asserted = self._config.assert_hostname
            name = (getattr(self._config, "tls_server_name", None)
                    or (asserted if isinstance(asserted, str) and asserted else self._host))
            sock = self._ssl.wrap_socket(sock, server_hostname=name)
        return _Connection(sock)

    def _take(self) -> _Connection:
        while True:
            with self._lock:  # the pop only: a select() under it would hold the lock without
                conn = self._idle.pop() if self._idle else None  # the GIL (a convoy)
            if conn is None:
                return self._connect()
            if not conn.stale():
                return conn
            conn.close()

    def _give(self, conn: _Connection) -> None:
        with self._lock:
            if conn.reusable and len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def _auth(self) -> str:
        # Per request: the token's refresh hook (in-cluster projected tokens) runs here.
        return "".join(f"{a['key']}: {a['value']}\r\n"
                       for a in self._config.auth_settings().values()
                       if a.get("in") == "header" and a.get("value"))

    def post(self, path: str, body: bytes) -> bytes:
        """POST ``body`` to ``path``; the answer's body, or ApiException on a non-2xx status."""
        return self.request("POST", path, body)

    def request(self, method: str, path: str, body: bytes = b"") -> bytes:
        """``method`` ``path`` with ``body``; the answer's body, or ApiException (non-2xx)."""
        head = (f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._fixed}{self._auth()}"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
        conn = self._take()
        try:
            conn.sock.sendall(head + body)
            status, reason, headers, data = _read_response(conn)
        except BaseException:
            conn.close()  # a half-read answer would poison the next request on this socket
            raise
        self._give(conn)
        if not 200 <= status < 300:
            exc = ApiException(status=status, reason=reason)
            exc.body, exc.headers = data.decode("utf-8", "replace"), headers
            raise exc
        return data

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            _close_all(self._idle)


def _close_all(idle: list[_Connection]) -> None:
    while idle:
        idle.pop().close()


def _read_response(conn: _Connection) -> tuple[int, str, dict[str, str], bytes]:
    """Status, reason, headers (lower-case names) and body of one answer."""
    line = conn.reader.readline(65537)
    parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ConnectionError(f"bad status line from the API server: {line[:80]!r}")
    status, reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
    headers: dict[str, str] = {}
    while True:
        raw = conn.reader.readline(65537)
        if raw in (b"\r\n", b"\n"):
            break
        if not raw:
            raise ConnectionError("the API server closed the connection mid-answer")
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("connection", "").lower() == "close" or parts[0] == "HTTP/1.0":
        conn.reusable = False
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, reason, headers, _read_chunked(conn)
    if "content-length" in headers:
        length = int(headers["content-length"])
        data = conn.reader.read(length)
        if len(data) < length:
            raise ConnectionError("the API server closed the connection mid-answer")
    elif status in (204, 304):
        data = b""
    else:  # no length: the body runs to the end of the connection
        data, conn.reusable = conn.reader.read(), False
    return status, reason, headers, data


def _read_chunked(conn: _Connection) -> bytes:
    chunks = []
    while True:
        size = int(conn.reader.readline(1024).split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while conn.reader.readline(65537) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        chunks.append(conn.reader.read(size))
        conn.reader.readline(3)  # the CRLF after each chunk


def api_error(exc: ApiException) -> str:
    """A one-line reason for an API error: status, reason and the Status object's message
    (the exception's own text carries every response header)."""
    message = ""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        message = str(json.loads(exc.body or "{}").get("message") or "")
    reason = f"{exc.status} {exc.reason or ''}".strip()
    return f"{reason}: {message[:300]}" if message else reason
