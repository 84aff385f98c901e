"""Malformed headers get a 400 with a reason, and slow clients cannot freeze the session
proxy: the same hardened cheroot (``contracts.httpserve``) on all three servers."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time

import httpx
import pytest
from extender_builders import TOKEN, node
from slow_loris import SlowClients, seconds_until_dropped

from agent.inference.http.serve import ServeOptions, http_server
from agent.session.http import ProxyConfig, ProxyServer
from agent.session.proxy import SessionLink
from extender.cluster.sim import SimSource
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.transport.server import start_background
from extender.wiring import create_app
from lab.fakes.session_upstream import SLO, Loopback, Upstream

BODY = b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": []}'
MALFORMED = {
    "negative-length": (b"Content-Length: -5\r\n", "non-negative integer"),
    "signed-length": (b"Content-Length: +%d\r\n" % len(BODY), "non-negative integer"),
    "text-length": (b"Content-Length: abc\r\n", "non-negative integer"),
    "19-digit-length": (b"Content-Length: 1000000000000000000\r\n", "non-negative integer"),
    "conflicting-lengths": (b"Content-Length: %d\r\nContent-Length: 3\r\n" % len(BODY),
                            "conflicting Content-Length"),
    "length-and-chunked": (b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(BODY),
                           "Transfer-Encoding"),
    "two-hosts": (b"Host: y\r\nContent-Length: %d\r\n" % len(BODY), "more than one Host"),
    "two-authorizations": (b"Authorization: Bearer a\r\nAuthorization: Bearer b\r\n"
                           b"Content-Length: %d\r\n" % len(BODY), "more than one Authorization"),
    "space-in-name": (b"Content-Length : %d\r\n" % len(BODY), "malformed header name"),
    "no-colon": (b"Content-Length %d\r\n" % len(BODY), "Illegal header line"),
}


def raw_request(port: int, path: str, headers: bytes, body: bytes = BODY) -> tuple[int, dict]:
    """Send one hand-written request; the status and the JSON body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n" + headers + b"\r\n" + body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        head, _, rest = answer.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(rest) < length:
            rest += sock.recv(65536)
    assert b"content-type: application/json" in head.lower()
    return int(head.split(b" ")[1]), json.loads(rest)


@pytest.fixture(scope="module")
def extender_port():
    cfg = build_config({"server": {"host": "127.0.0.1", "threads": 2}})
    running = start_background(create_app(ConfigHolder(cfg), SimSource([node("n1")])),
                               cfg.server, port=0)
    yield running.port
    running.stop()


def serve_inference(app, threads: int = 2, deadline: float = 30.0):
    fields = {f.name: None for f in dataclasses.fields(ServeOptions)}
    options = ServeOptions(**{**fields, "host": "127.0.0.1", "port": 0, "http_threads": threads,
                              "max_body_bytes": 1 << 20, "read_deadline_seconds": deadline})
    server = http_server(app, options)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture(scope="module")
def upstream():
    up = Upstream()
    yield up
    up.runtime.stop()


@pytest.fixture(scope="module")
def inference_port(upstream):
    server, thread = serve_inference(upstream.app)
    yield int(server.bind_addr[1])
    server.stop()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def proxy(upstream):
    backend = Loopback(upstream)
    proxy = ProxyServer(SessionLink(backend.url, SLO), ProxyConfig(
        listen_host="127.0.0.1", listen_port=0, http_threads=2, shutdown_delay_seconds=0,
        check_interval_seconds=0.05, read_deadline_seconds=0.5, deregister=False))
    proxy.start()
    yield proxy
    proxy.shutdown()
    backend.stop()


@pytest.mark.parametrize("headers,reason", MALFORMED.values(), ids=MALFORMED.keys())
def test_extender_answers_malformed_headers_400_with_the_reason(extender_port, headers, reason):
    """Before: Content-Length -5 gave 'internal error: ValueError', a conflicting pair was
    read with the last value, and cheroot's own refusals were plain text."""
    status, body = raw_request(extender_port, "/filter", headers)
    assert status == 400 and reason in body["Error"]


@pytest.mark.parametrize("headers,reason", MALFORMED.values(), ids=MALFORMED.keys())
def test_inference_server_answers_malformed_headers_400(inference_port, headers, reason):
    status, body = raw_request(inference_port, "/v1/sessions", headers)
    assert status == 400 and reason in body["message"] and body["error"] == "BadRequest"


@pytest.mark.parametrize("headers,reason", MALFORMED.values(), ids=MALFORMED.keys())
def test_session_proxy_answers_malformed_headers_400(proxy, headers, reason):
    status, body = raw_request(proxy.port, "/infer", headers)
    assert status == 400 and reason in body["message"]


def test_agreeing_duplicate_lengths_and_wrong_schemes_keep_their_answers(extender_port):
    status, _ = raw_request(extender_port, "/filter",
                            b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(BODY),
                                                                               len(BODY)))
    assert status == 200  # RFC 9110 allows a repeated, identical length
    status, body = raw_request(extender_port, "/v1/agents/report",
                               f"Authorization: Basic {TOKEN}\r\nContent-Length: 2\r\n".encode(),
                               b"{}")
    assert status == 401 and body["Error"]  # an authentication failure, not a malformed one


@pytest.mark.parametrize("content_type,data,reason", [
    ("text/plain", b"x", "Content-Type must be"),
    ("application/x-npy", b"\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fortran_order': False, "
     b"'shape': (1099511627776, 4), }" + b" " * 53 + b"\n", ""),
    ("application/x-npy", b"not an npy file", ""),
], ids=["text", "npy-claims-2^40-rows", "npy-garbage"])
def test_inference_bad_content_type_or_npy_is_400(upstream, content_type, data, reason):
    client = upstream.app.test_client()
    client.post("/v1/sessions", json={"name": "h", "model": "tiny", "slo_ms": 2000,
                                      "rate_rps": 100})
    r = client.post("/v1/sessions/h/infer", data=data, content_type=content_type)
    assert r.status_code == 400 and reason in r.get_json()["message"]


def test_session_proxy_keeps_answering_while_32_slow_clients_hold_connections(proxy):
    """M1 on the session proxy: before, 2 workers and 2 slow clients froze it."""
    with SlowClients(proxy.port, count=32, interval=0.25, seconds=4):
        start = time.perf_counter()
        with httpx.Client(timeout=2.0) as client:
            for _ in range(20):
                assert client.get(f"http://127.0.0.1:{proxy.port}/livez").status_code == 200
        elapsed = time.perf_counter() - start
    assert elapsed < 2.0, elapsed


def test_session_proxy_drops_a_request_not_complete_within_its_deadline(proxy):
    closed_after = seconds_until_dropped(proxy.port)
    assert closed_after is not None and 0.4 < closed_after < 2.0, closed_after


def test_inference_server_read_deadline_comes_from_its_options(upstream):
    server, thread = serve_inference(upstream.app, deadline=0.5)
    try:
        assert server.ConnectionClass.read_deadline_seconds == 0.5
    finally:
        server.stop()
        thread.join(timeout=10)


def test_read_deadline_flags_are_validated():
    from agent.inference.http.serve import build_runtime

    fields = {f.name: None for f in dataclasses.fields(ServeOptions)}
    with pytest.raises(ValueError, match="read-deadline"):
        build_runtime(ServeOptions(**{**fields, "read_deadline_seconds": 0.0}))
    with pytest.raises(Exception, match="read deadline"):
        ProxyConfig(read_deadline_seconds=1000)


def test_cli_exposes_the_read_deadlines():
    from typer.testing import CliRunner

    from tandem.cli import app

    runner = CliRunner()
    for command in (["agent", "serve", "--help"], ["agent", "session", "--help"]):
        out = runner.invoke(app, command, env={"COLUMNS": "200"}).output
        assert "--read-deadline-seconds" in out, command

