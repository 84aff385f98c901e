"""A request that declares a body over the limit gets 413 at once, before any body is
sent or read, on all three servers (one rule: ``contracts.httpserve``)."""

from __future__ import annotations

import json
import socket
import time

import pytest
from extender_builders import node
from test_http_hardening import serve_inference

from agent.session.http import ProxyConfig, ProxyServer
from agent.session.proxy import SessionLink
from contracts.httpserve import BadContentLength, BodyTooLarge, read_body
from extender.cluster.sim import SimSource
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.transport.server import start_background
from extender.wiring import create_app
from lab.fakes.session_upstream import SLO, Loopback, Upstream

DEADLINE = 10.0
"""Each server's read deadline: the old code held such a request this long."""


def declare_only(port: int, path: str, length: int, auth: bytes = b"") -> tuple[int, dict, float]:
    """Send a head declaring ``length`` bytes and no body; status, JSON body, seconds taken."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + auth +
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection without an answer"
            answer += chunk
        head, _, rest = answer.partition(b"\r\n\r\n")
        size = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")))
        while len(rest) < size:
            rest += sock.recv(65536)
        assert b"connection: close" in head.lower()  # the unread body cannot be trusted
    return int(head.split(b" ")[1]), json.loads(rest), time.monotonic() - started


@pytest.fixture(scope="module")
def extender_port():
    cfg = build_config({"server": {"host": "127.0.0.1", "threads": 2,
                                   "request_read_timeout_seconds": DEADLINE}})
    running = start_background(create_app(ConfigHolder(cfg), SimSource([node("n1")]),
                                          environ={"TANDEM_AGENT_TOKEN": "t"}),
                               cfg.server, port=0)
    yield running.port
    running.stop()


@pytest.fixture(scope="module")
def upstream():
    up = Upstream()
    yield up
    up.runtime.stop()


@pytest.mark.parametrize("path", ["/filter", "/v1/agents/report"])
def test_the_extender_answers_413_from_the_head(extender_port: int, path: str) -> None:
    """Before: a 5 MiB Content-Length with no body was held until the read deadline."""
    status, body, seconds = declare_only(extender_port, path, 5 << 20)
    assert status == 413 and "larger than 4194304 bytes" in body["Error"]
    assert seconds < 2.0


def test_the_inference_server_answers_413_from_the_head(upstream) -> None:
    server, thread = serve_inference(upstream.app, deadline=DEADLINE)  # limit 1 MiB
    try:
        status, body, seconds = declare_only(int(server.bind_addr[1]),
                                             "/v1/sessions/x/infer", 100 << 20)
    finally:
        server.stop()
        thread.join(timeout=10)
    assert status == 413 and body["error"] == "PayloadTooLarge" and seconds < 2.0


def test_the_session_proxy_answers_413_from_the_head(upstream) -> None:
    backend = Loopback(upstream)
    proxy = ProxyServer(SessionLink(backend.url, SLO), ProxyConfig(
        listen_host="127.0.0.1", listen_port=0, http_threads=2, shutdown_delay_seconds=0,
        check_interval_seconds=0.05, read_deadline_seconds=DEADLINE, deregister=False,
        max_body_bytes=1 << 20))
    proxy.start()
    try:
        status, body, seconds = declare_only(proxy.port, "/infer", 5 << 20)
    finally:
        proxy.shutdown()
        backend.stop()
    assert status == 413 and body["error"] == "PayloadTooLarge" and seconds < 2.0


class _Stream:
    def __init__(self, data: bytes):
        self.data, self.reads = data, 0

    def read(self, n: int = -1) -> bytes:
        self.reads += 1
        out, self.data = (self.data, b"") if n < 0 else (self.data[:n], self.data[n:])
        return out


def test_the_one_reader_refuses_before_reading_and_bounds_chunked_bodies() -> None:
    declared = _Stream(b"x" * 10)
    with pytest.raises(BodyTooLarge):
        read_body({"CONTENT_LENGTH": "11", "wsgi.input": declared}, 10)
    assert declared.reads == 0
    assert read_body({"CONTENT_LENGTH": "3", "wsgi.input": _Stream(b"abc")}, 10) == b"abc"
    with pytest.raises(BodyTooLarge):
        read_body({"wsgi.input": _Stream(b"x" * 11), "wsgi.input_terminated": True}, 10)
    assert read_body({"wsgi.input": _Stream(b"x" * 10), "wsgi.input_terminated": True},
                     10) == b"x" * 10
    assert read_body({"wsgi.input": _Stream(b"x")}, 10) == b""  # no length, not chunked
    with pytest.raises(BadContentLength):
        read_body({"CONTENT_LENGTH": "-5", "wsgi.input": _Stream(b"")}, 10)
