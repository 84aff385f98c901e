"""The HTTP front of tandem's cheroot servers (the extender's and the inference server's),
after ``contracts.httpserve.harden`` has gathered each request before a worker takes it.

- **Connection files** (``DirectFiles``): cheroot reads a request and writes its answer
  through these instead of its own, which are Python's pure-Python ``_pyio`` buffered
  files. The request is already here, so reading it is slicing bytes in memory: a line is
  one ``find``, not ``_pyio``'s readline, peek and read-ahead in Python (several calls a
  line, seven lines a request). A write is one ``sendall``. At the SLO trio's rates the
  ``_pyio`` files were about a fifth of the inference server's CPU per request
  (``benchmarks/serving_path_cpu.py``). TLS connections keep their adapter's files.
- **Answered before cheroot** (``front_paths``): a plain gathered ``POST`` to one of a
  server's hot paths (the extender's scheduling verbs) is parsed with one split and
  answered with one write, skipping cheroot's request parsing, WSGI gateway and header
  writing, which cost about a quarter of a bind's CPU in a burst
  (``benchmarks/burst_cpu.py``). The WSGI app sees the environ cheroot would build and
  the client the same answer (the ``Date`` aside); anything not plain (another method or
  path, a query, HTTP/1.0, a repeated header or one named with ``_``, ``Transfer-Encoding``,
  ``Expect``, a head or body over cheroot's own limits, a body not yet all here or
  followed by a pipelined request) goes to cheroot as before, so its checks and error
  answers stay the only ones (``tests/contracts/test_http_front_hostile.py``).
"""

from __future__ import annotations

import io
import logging
import sys
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate
from typing import Any

from cheroot import errors
from cheroot.makefile import MakeFile
from cheroot.server import HTTPConnection

# The hardened server's own patterns: a request the front takes passes cheroot's checks.
from contracts.httpserve import _DIGITS, _HEAD_END, _TOKEN, ARRIVED

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

    def read1(self, size: int = -1) -> bytes:
        """What was read ahead, at most ``size`` bytes (``_pyio``'s ``read1`` on buffered
        bytes): the gathering connection takes it back (``httpserve``)."""
        return self._take(len(self._buf) if size < 0 else min(size, len(self._buf)))

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


def front_paths(server: Any, paths: Iterable[str]) -> Any:
    """``server`` (a hardened cheroot server, ``direct_files`` or not) answering a plain
    ``POST`` to one of ``paths`` itself, before cheroot parses it (module docstring).

    The mixin goes between the hardened connection and cheroot's: the hardened
    ``communicate`` gathers the request, then calls ``super().communicate()``, which is
    then :meth:`FrontConnection.communicate`."""
    base = server.ConnectionClass
    server.ConnectionClass = type(f"Front{base.__name__}", (base, FrontConnection), {
        "front_paths": frozenset(p.encode("latin-1") for p in paths)})
    return server


_NOT_PLAIN = frozenset({"HTTP_TRANSFER_ENCODING", "HTTP_EXPECT"})
"""Headers that send a request to cheroot (chunked bodies, 100-continue)."""


class FrontConnection(HTTPConnection):
    """A cheroot connection answering plain POSTs to ``front_paths`` without cheroot's
    request machinery; everything else is cheroot's ``communicate``."""

    front_paths: frozenset[bytes] = frozenset()

    def communicate(self) -> bool:
        """One request: answered here when plain (``_plain``), else by cheroot."""
        gathered = getattr(getattr(self, "_buffered", None), "gathered", None)
        if gathered is None or self.rfile.has_data() \
                or not isinstance(self.server.bind_addr, tuple):
            return bool(super().communicate())
        request = self._plain(gathered)
        if request is None:
            return bool(super().communicate())
        gathered.clear()
        return self._answer(*request)

    def _plain(self, data: bytearray) -> tuple[dict[str, Any], bytes] | None:
        """The environ cheroot's WSGI 1.0 gateway would build, and the body; None when
        the request is not plain (cheroot then reads it)."""
        end = data.find(_HEAD_END)
        if end < 0 or not data.startswith(b"POST /"):
            return None
        head = bytes(data[:end])
        lines = head.split(b"\r\n")
        if head.count(b"\n") != len(lines) - 1 or head.count(b"\r") != len(lines) - 1 \
                or 0 < (self.server.max_request_header_size or 0) < end + len(_HEAD_END):
            return None  # a bare CR or LF, or a head (its end counted) over cheroot's limit
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[1] not in self.front_paths or parts[2] != b"HTTP/1.1":
            return None
        env = self._environ(parts[1].decode("latin-1"))
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name) or b"_" in name:
                # A folded or malformed line (cheroot's 400), or a "_" in the name: cheroot
                # frames the body by the names as sent (Content_Length is no length) but
                # its environ spells "_" as "-", so only its own reading is consistent.
                return None
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            if key in env or key in _NOT_PLAIN:
                return None  # repeated (cheroot folds or refuses), or not plain
            env[key] = value.strip().decode("latin-1")
        length = env.pop("HTTP_CONTENT_LENGTH", None)
        if length is None or not _DIGITS.fullmatch(length.encode()) \
                or int(length) > self.body_limit_bytes() \
                or len(data) != end + len(_HEAD_END) + int(length):
            return None
        env["CONTENT_LENGTH"] = length
        if "HTTP_CONTENT_TYPE" in env:
            env["CONTENT_TYPE"] = env.pop("HTTP_CONTENT_TYPE")
        return env, bytes(data[end + len(_HEAD_END):])

    def body_limit_bytes(self) -> int:
        """The largest body answered here (the hardened connection's limit and cheroot's
        own, where set: over either, cheroot answers 413 from the head)."""
        limits = [int(x) for x in (getattr(self, "body_limit", 0),
                                   self.server.max_request_body_size) if x]
        return min(limits, default=1 << 62)

    def _environ(self, path: str) -> dict[str, Any]:
        server = self.server
        env = {
            "ACTUAL_SERVER_PROTOCOL": server.protocol, "PATH_INFO": path,
            "QUERY_STRING": "", "REMOTE_ADDR": self.remote_addr or "",
            "REMOTE_PORT": str(self.remote_port or ""), "REQUEST_METHOD": "POST",
            "REQUEST_URI": path, "SCRIPT_NAME": "", "SERVER_NAME": server.server_name,
            "SERVER_PROTOCOL": "HTTP/1.1", "SERVER_SOFTWARE": server.software,
            "wsgi.errors": sys.stderr, "wsgi.input": None, "wsgi.input_terminated": False,
            "wsgi.multiprocess": False, "wsgi.multithread": True, "wsgi.run_once": False,
            "wsgi.url_scheme": "https" if server.ssl_adapter is not None else "http",
            "wsgi.version": (1, 0), "SERVER_PORT": str(server.bind_addr[1]),
            ARRIVED: getattr(self, "arrived_at", None) or time.monotonic()}
        return env

    def _answer(self, env: dict[str, Any], body: bytes) -> bool:
        """Run the app and write its answer in one write; True to keep the connection."""
        if self.ssl_env:
            env.update(self.ssl_env)
        env["wsgi.input"] = io.BytesIO(body)
        if self.server.stats["Enabled"]:
            self.requests_seen += 1
        close = env.get("HTTP_CONNECTION") == "close"
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], None]:
            if started and not exc_info:
                raise RuntimeError("WSGI start_response called a second time with no "
                                   "exc_info.")
            started[:] = [status, headers]
            return chunks.append

        chunks: list[bytes] = []
        try:
            response = self.server.wsgi_app(env, start_response)
            try:
                chunks.extend(c for c in response if c)
            finally:
                if hasattr(response, "close"):
                    response.close()
            status, headers = started
            wire, close = _wire(self.server, status, headers, chunks, close)
            self.wfile.write(wire)
            self.wfile.flush()
        except OSError as exc:  # the client went away: as cheroot, drop the connection
            if exc.errno not in errors.socket_errors_to_ignore:
                self.server.error_log(f"socket.error {exc.errno!r}", level=logging.WARNING,
                                      traceback=True)
            return False
        except Exception as exc:  # noqa: BLE001 - as cheroot: logged, a 500, closed
            self.server.error_log(repr(exc), level=logging.ERROR, traceback=True)
            self._internal_error()
            return False
        return not close

    def _internal_error(self) -> None:
        req = self.RequestHandlerClass(self.server, self)
        req.simple_response("500 Internal Server Error")


def _wire(server: Any, status: str, headers: list[tuple[str, str]], chunks: list[bytes],
          close: bool) -> tuple[bytes, bool]:
    """The answer's bytes as cheroot's ``send_headers`` and writes make them (one
    ``Date`` a second), and whether the connection closes after it."""
    names = {name.lower() for name, _ in headers}
    head = [f"{server.protocol} {status}\r\n"]
    head += [f"{name}: {value}\r\n" for name, value in headers]
    chunked = "content-length" not in names and int(status[:3]) not in (204, 205, 304) \
        and int(status[:3]) >= 200
    if chunked:
        head.append("Transfer-Encoding: chunked\r\n")
        chunks = [b"%x\r\n%s\r\n" % (len(c), c) for c in chunks] + [b"0\r\n\r\n"]
    close = close or status.startswith("413") or not server.can_add_keepalive_connection
    if close and "connection" not in names:
        head.append("Connection: close\r\n")
    if "date" not in names:
        head.append(f"Date: {_date()}\r\n")
    if "server" not in names:
        head.append(f"Server: {server.server_name}\r\n")
    head.append("\r\n")
    return "".join(head).encode("latin-1") + b"".join(chunks), close


_DATE: list[Any] = [None, ""]


def _date() -> str:
    """``email.utils.formatdate(usegmt=True)``, made once a second."""
    now = int(time.time())
    if _DATE[0] != now:
        _DATE[:] = [now, formatdate(now, usegmt=True)]
    return str(_DATE[1])
