"""The inference server's connection files (``front.py``): cheroot reads gathered bytes and
then the socket, and writes whole answers, with the HTTP behaviour it had."""

from __future__ import annotations

import dataclasses
import io
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from flask import Flask
from server_helpers import running_tiny_runtime

from agent.inference.http.app import create_app
from agent.inference.http.serve import ServeOptions, http_server
from contracts.httpfront import GatheredReader, SocketWriter


class Source:
    """A connection's gathered bytes, then a socket that returns ``chunks`` in turn."""

    def __init__(self, gathered: bytes, chunks: list[bytes]):
        self.gathered = bytearray(gathered)
        self._chunks = list(chunks)

    def recv(self, _n: int) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""


def test_reader_lines_and_reads_across_gathered_and_socket() -> None:
    r = GatheredReader(Source(b"GET / HTTP/1.1\r\nHost: x\r\n", [b"\r\nbo", b"dy", b"rest"]))
    assert r.readline() == b"GET / HTTP/1.1\r\n"
    assert r.readline(4) == b"Host"  # at most ``size``
    assert r.readline() == b": x\r\n"
    assert not r.has_data()
    assert r.readline() == b"\r\n"  # from the socket
    assert r.has_data()  # "bo" read ahead
    assert r.read(4) == b"body"  # waits for the rest
    assert r.read() == b"rest"  # until EOF
    assert r.read(3) == b"" and r.readline() == b""


def test_reader_partial_line_at_eof() -> None:
    r = GatheredReader(Source(b"abc", []))
    assert r.readline(10) == b"abc" and r.readline() == b""


def test_writer_sends_each_write_whole() -> None:
    a, b = socket.socketpair()
    with a, b:
        w = SocketWriter(a)
        assert w.write(b"x" * 100_000) == 100_000
        got = b""
        while len(got) < 100_000:
            got += b.recv(1 << 16)
        assert got == b"x" * 100_000 and w.bytes_written == 100_000


@pytest.fixture(scope="module")
def app() -> Iterator[Flask]:
    for rt in running_tiny_runtime():
        yield create_app(rt, max_body_bytes=1 << 20)


@pytest.fixture(scope="module")
def port(app: Flask) -> Iterator[int]:
    fields = {f.name: None for f in dataclasses.fields(ServeOptions)}
    options = ServeOptions(**{**fields, "host": "127.0.0.1", "port": 0, "http_threads": 2,
                              "max_body_bytes": 1 << 20, "read_deadline_seconds": 5.0})
    server = http_server(app, options)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield int(server.bind_addr[1])
    server.stop()
    thread.join(timeout=10)


def _answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """``count`` answers read off one connection (status, body)."""
    data, out = b"", []
    while len(out) < count:
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, data = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(data) < length:
            data += sock.recv(65536)
        out.append((int(head.split(b" ")[1]), data[:length]))
        data = data[length:]
    return out


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def test_server_uses_direct_files(app: Flask) -> None:
    fields = {f.name: None for f in dataclasses.fields(ServeOptions)}
    options = ServeOptions(**{**fields, "host": "127.0.0.1", "port": 0, "http_threads": 1,
                              "max_body_bytes": 1 << 20})
    conn = http_server(app, options).ConnectionClass
    a, b = socket.socketpair()
    with a, b:
        made = conn(type("S", (), {"peercreds_enabled": False, "peercreds_resolve_enabled": False,
                                   "timeout": 1.0, "max_request_header_size": 0})(), a)
        assert isinstance(made.rfile, GatheredReader) and isinstance(made.wfile, SocketWriter)


def test_pipelined_keep_alive_chunked_and_large_bodies(port: int) -> None:
    """Two requests in one send on a kept-alive connection, a chunked body, then a
    512 kB ``.npy`` body: each answered as before."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        session = b'{"name": "s", "model": "tiny", "slo_ms": 5000, "rate_rps": 10}'
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n%s" % (len(session), session))
        (live, _), (created, _) = _answers(sock, 2)
        assert live == 200 and created == 201
        chunked = b'{"name": "t", "model": "tiny", "slo_ms": 5000, "rate_rps": 10}'
        sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                     % (len(chunked), chunked))
        ((status, body),) = _answers(sock, 1)
        assert status == 201, body
        x = np.arange(1 << 17, dtype=np.float32).reshape(1, -1)
        big = _npy(x)
        sock.sendall(b"POST /v1/sessions/s/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/x-npy\r\nContent-Length: %d\r\n\r\n" % len(big))
        sock.sendall(big)
        ((status, body),) = _answers(sock, 1)
        assert status == 200 and np.array_equal(np.load(io.BytesIO(body)), x)
