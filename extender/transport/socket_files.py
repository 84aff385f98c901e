"""cheroot's socket files on C ``io``: the request read and the answer written with less CPU.

cheroot reads every request through ``_pyio`` (the pure-Python ``io``: its module says
"prefer slower Python-based io module") and writes every answer through a
``_pyio.BufferedWriter``. Profiled on the extender's verbs, those layers cost about as
much as the rest of cheroot's request handling; the scheduler sends three requests per
pod. Here the reader is the C ``io.BufferedReader`` over the same ``socket.SocketIO``
(what ``socket.makefile`` builds), and the writer sends each write at once with
``sendall`` (cheroot's writer flushes every write too), but an answer's head with its
body: cheroot writes them apart, two sends and two segments for the client to read.
What cheroot and the hardened connection (``contracts.httpserve``) read of them is
kept: ``bytes_read``, ``bytes_written`` and ``has_data()``, which tells whether the
reader holds buffered bytes without reading the socket (the hardened connection then
gathers the rest of the request in the selector, not in a worker).
"""

from __future__ import annotations

import errno
import io
import re
import socket
from typing import Any


class _Quiet:
    """A socket whose reads find nothing while ``quiet`` (the reader's buffer is probed)."""

    def __init__(self, sock: Any):
        self._sock = sock
        self.quiet = False

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """The socket's ``recv_into``; EAGAIN while quiet (``SocketIO`` returns None)."""
        if self.quiet:
            raise BlockingIOError(errno.EAGAIN, "probing the buffer only")
        return self._sock.recv_into(buffer, nbytes, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class SocketReader(io.BufferedReader):
    """cheroot's ``StreamReader`` on C ``io``."""

    def __init__(self, sock: Any, mode: str = "rb", bufsize: int = io.DEFAULT_BUFFER_SIZE):
        self._quiet = _Quiet(sock)
        super().__init__(socket.SocketIO(self._quiet, mode), bufsize)  # type: ignore[arg-type]
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        """Read (and count) up to ``size`` bytes."""
        data = super().read(size)
        self.bytes_read += len(data)
        return data

    def has_data(self) -> bool:
        """True when bytes are buffered; never reads the socket."""
        self._quiet.quiet = True
        try:
            return bool(self.peek(1))
        finally:
            self._quiet.quiet = False


_BODY_FOLLOWS = re.compile(rb"\r\ncontent-length:[ \t]*0*[1-9]", re.IGNORECASE)
"""An answer's head that announces a body: cheroot writes the body next."""


class SocketWriter:
    """cheroot's ``StreamWriter``: each write sent whole at once, except an answer's head
    that announces a body, which goes out with the body (one send, one segment to the
    client instead of two); :meth:`flush` sends a head still held (a HEAD request's)."""

    def __init__(self, sock: Any, mode: str = "wb", bufsize: int = io.DEFAULT_BUFFER_SIZE):
        self._sock = sock
        self._held = b""
        self.bytes_written = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        """Send ``data`` (str is refused, as by cheroot's writer)."""
        if isinstance(data, str):
            raise TypeError("can't write str to binary stream")
        size = len(data)
        self.bytes_written += size
        if self._held:
            data, self._held = self._held + data, b""
        elif data.startswith(b"HTTP/1.") and data.endswith(b"\r\n\r\n") \
                and _BODY_FOLLOWS.search(data):
            self._held = bytes(data)
            return size
        self._sock.sendall(data)
        return size

    def flush(self) -> None:
        """Send a head still held."""
        if self._held:
            held, self._held = self._held, b""
            self._sock.sendall(held)

    def close(self) -> None:
        """The socket is the connection's to close."""
        self.closed = True


def socket_file(sock: Any, mode: str = "r", bufsize: int = io.DEFAULT_BUFFER_SIZE) -> Any:
    """cheroot's ``MakeFile`` signature: a reader for ``r`` modes, else a writer."""
    return SocketReader(sock, mode, bufsize) if "r" in mode else SocketWriter(sock, mode, bufsize)


def on_c_io(connection_class: type) -> type:
    """``connection_class`` (cheroot's ``HTTPConnection`` or the hardened one) building its
    socket files with :func:`socket_file`, also under TLS (the adapter's files are cheroot's
    Python ones as well); each request's answer is flushed when it is complete."""
    request_class = connection_class.RequestHandlerClass

    def respond(self: Any) -> None:
        try:
            request_class.respond(self)
        finally:
            self.conn.wfile.flush()

    def __init__(self: Any, server: Any, sock: Any, makefile: Any = None) -> None:
        connection_class.__init__(self, server, sock, socket_file)

    return type(f"CIo{connection_class.__name__}", (connection_class,), {
        "__init__": __init__, "RequestHandlerClass": type(
            f"CIo{request_class.__name__}", (request_class,), {"respond": respond})})
