"""The inference server's connection files: cheroot reads a request and writes its answer
through these instead of its own, which are Python's pure-Python ``_pyio`` buffered files.

A request reaches cheroot only once it is all here (``contracts.httpserve`` gathers it
first), so reading it is slicing bytes already in memory: a line is one ``find``, not
``_pyio``'s readline, peek and read-ahead in Python (several calls a line, seven lines a
request). A write is one ``sendall``. At the SLO trio's rates the ``_pyio`` files were
about a fifth of the server's CPU per request (``benchmarks/serving_path_cpu.py``).
TLS connections keep their adapter's files.
"""

from __future__ import annotations

from typing import Any

from cheroot.makefile import MakeFile

_RECV_BYTES = 1 << 16


class GatheredReader:
    """cheroot's read side of a connection: what was gathered before a worker took it
    (``source.gathered``), then the socket (blocking, with the server's timeout)."""

    def __init__(self, source: Any):
        self._source = source
        self._buf = bytearray()
        self.bytes_read = 0

    def has_data(self) -> bool:
        """Bytes read ahead and not yet consumed (a pipelined request's)."""
        return bool(self._buf)

    def _more(self) -> bool:
        gathered = getattr(self._source, "gathered", None)
        if gathered:
            self._buf += gathered
            gathered.clear()
            return True
        chunk = self._source.recv(_RECV_BYTES)
        self._buf += chunk
        return bool(chunk)

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self.bytes_read += len(data)
        return data

    def readline(self, size: int | None = -1) -> bytes:
        """Up to and including the next newline, at most ``size`` bytes; less at EOF."""
        limit = -1 if size is None else size
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end >= 0:
                n = end + 1
                break
            if 0 <= limit <= len(self._buf):
                n = limit
                break
            start = len(self._buf)
            if not self._more():
                n = len(self._buf)
                break
        return self._take(n if limit < 0 else min(n, limit))

    def read(self, size: int | None = -1) -> bytes:
        """``size`` bytes (all until EOF when negative); fewer only at EOF."""
        if size is None or size < 0:
            while self._more():
                pass
            return self._take(len(self._buf))
        while len(self._buf) < size and self._more():
            pass
        return self._take(min(size, len(self._buf)))

    def close(self) -> None:
        self._buf.clear()


class SocketWriter:
    """cheroot's write side of a connection: each write sent whole."""

    def __init__(self, sock: Any):
        self._sock = sock
        self.bytes_written = 0

    def write(self, data: bytes) -> int:
        self._sock.sendall(data)
        self.bytes_written += len(data)
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered."""

    def close(self) -> None:
        """The connection closes the socket."""


def _files(sock: Any, mode: str = "r", bufsize: int = 0) -> GatheredReader | SocketWriter:
    return GatheredReader(sock) if "r" in mode else SocketWriter(sock)


class DirectFiles:
    """A connection class mixin: ``GatheredReader`` and ``SocketWriter`` for plain TCP."""

    def __init__(self, server: Any, sock: Any, makefile: Any = MakeFile):
        super().__init__(server, sock, _files if makefile is MakeFile else makefile)  # type: ignore[call-arg]


def direct_files(server: Any) -> Any:
    """``server`` (a hardened cheroot server) with ``DirectFiles`` connections."""
    server.ConnectionClass = type(f"Direct{server.ConnectionClass.__name__}",
                                  (DirectFiles, server.ConnectionClass), {})
    return server
