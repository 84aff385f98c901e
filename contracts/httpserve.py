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
- **TLS handshakes off the accept loop.** cheroot's builtin adapter completes
  the handshake in the thread that accepts connections, so a client that
  connects and stays silent stalls every accept for the socket timeout. The
  adapter here defers the handshake; the non-blocking reads above drive it.
"""

from __future__ import annotations

import re
import socket
import ssl
import time
from typing import Any

from cheroot.makefile import MakeFile
from cheroot.server import HTTPConnection
from cheroot.ssl.builtin import BuiltinSSLAdapter

DEFAULT_READ_DEADLINE_SECONDS = 10.0
MAX_HEAD_BYTES = 64 * 1024
"""A request head longer than this is handed to cheroot at once (which refuses it)."""
_HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]{1,12})[ \t]*\r\n", re.IGNORECASE)
_EXPECT_CONTINUE = re.compile(rb"\r\nexpect:[ \t]*100-continue[ \t]*\r\n", re.IGNORECASE)
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


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
        self._eof = False

    def communicate(self) -> bool:
        """Serve one request once it is all here; until then, back to the selector."""
        if not self.rfile.has_data() and not self._gather():
            if self._eof:
                return False
            started = self._first_byte_at
            return started is None or \
                time.monotonic() - started < self.read_deadline_seconds
        self._first_byte_at = None
        return bool(super().communicate())

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
        wanted = min(int(match.group(1)), self.body_limit) if match else 0
        return len(data) >= end + len(_HEAD_END) + wanted


class DeferredHandshakeAdapter(BuiltinSSLAdapter):
    """TLS whose handshake happens in the connection's reads, not in the accept loop."""

    def wrap(self, sock: socket.socket) -> tuple[Any, dict[str, str]]:
        """Wrap without the handshake; WSGI gets the scheme (no cipher details)."""
        wrapped = self.context.wrap_socket(sock, do_handshake_on_connect=False,
                                           server_side=True)
        return wrapped, {"wsgi.url_scheme": "https", "HTTPS": "on"}


def harden(server: Any, read_deadline_seconds: float = DEFAULT_READ_DEADLINE_SECONDS,
           body_limit: int = 4 << 20) -> Any:
    """Make ``server`` (a cheroot ``wsgi.Server``) gather requests before using a worker."""
    server.ConnectionClass = type("TandemConnection", (GatheringConnection,), {
        "read_deadline_seconds": read_deadline_seconds, "body_limit": body_limit})
    return server


def tls_adapter(cert_file: str, key_file: str) -> DeferredHandshakeAdapter:
    """The TLS adapter for a hardened server."""
    return DeferredHandshakeAdapter(cert_file, key_file)
