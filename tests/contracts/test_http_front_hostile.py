"""Hostile bytes to the extender's server with the HTTP front (``contracts.httpfront``) and
without it: every attack must end the same way both times (the same answers byte for byte,
``Date`` aside, and the same close), so the front never takes a request cheroot would read
otherwise (request smuggling, a lost or merged pipelined request), never answers a request
cheroot refuses, and never lets a caller without the scheduler's certificate through."""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from extender_builders import node
from manifests_helpers import MANIFESTS

from contracts.httpserve import MAX_HEAD_BYTES
from extender.cluster.sim import SimSource
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.scheduler_auth import ask_for_client_certificates, scheduler_only
from extender.transport.server import RunningServer, start_background
from extender.wiring import create_app

DEADLINE = 0.5
"""The servers' request read deadline (seconds): an incomplete request is dropped after it."""
_DATE = re.compile(rb"\r\nDate: [^\r]*")
POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"}, "spec": {}}
FILTER = json.dumps({"Pod": POD, "NodeNames": ["n1"]}).encode()
N = len(FILTER)


def post(path: bytes = b"/filter", body: bytes = FILTER, headers: tuple[bytes, ...] = (),
         length: bool = True, version: bytes = b"HTTP/1.1", method: bytes = b"POST") -> bytes:
    head = [b" ".join((method, path, version)), b"Host: x", b"Content-Type: application/json"]
    head += [b"Content-Length: %d" % len(body)] if length else []
    return b"\r\n".join([*head, *headers]) + b"\r\n\r\n" + body


def without_length(*headers: bytes, body: bytes = FILTER) -> bytes:
    return post(headers=headers, length=False, body=body)


ATTACKS = {
    # Smuggling: the body's length said twice, or in two ways.
    "CL and TE": post(headers=(b"Transfer-Encoding: chunked",)),
    "TE odd case": post(headers=(b"transfer-encoding: ChUnKeD",)),
    "TE tab": post(headers=(b"Transfer-Encoding:\tchunked ",)),
    "TE space before colon": post(headers=(b"Transfer-Encoding : chunked",)),
    "TE alone": without_length(b"Transfer-Encoding: chunked",
                               body=b"%x\r\n%s\r\n0\r\n\r\n" % (N, FILTER)),
    "TE underscore": post(headers=(b"Transfer_Encoding: chunked",)),
    "two CL equal": post(headers=(b"Content-Length: %d" % N,)),
    "two CL different": post(headers=(b"Content-Length: 3",)),
    "CL underscore": without_length(b"Content_Length: %d" % N),
    "CL underscore and CL": post(headers=(b"Content_Length: 3",)),
    "CL plus": without_length(b"Content-Length: +%d" % N),
    "CL minus": without_length(b"Content-Length: -%d" % N),
    "CL space inside": without_length(b"Content-Length: 1 %d" % N),
    "CL spaces around": without_length(b"Content-Length:   %d  " % N),
    "CL leading zeros": without_length(b"Content-Length: 000%d" % N),
    "CL 18 digits": without_length(b"Content-Length: %018d" % N),
    "CL huge": without_length(b"Content-Length: 99999999999999999999"),
    "CL hex": without_length(b"Content-Length: 0x10"),
    "CL empty": without_length(b"Content-Length: "),
    "CL list": without_length(b"Content-Length: %d, %d" % (N, N)),
    "CL non-ASCII digits": without_length("Content-Length: ١٢".encode()),
    "CL missing": without_length(),
    "CL zero": post(body=b""),
    # Header lines.
    "obs-fold": post(headers=(b"X-A: 1", b" folded")),
    "obs-fold CL": post(headers=(b" 3",)),
    "obs-fold first": b"POST /filter HTTP/1.1\r\n X: y\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    "tab before colon": post(headers=(b"X-A\t: 1",)),
    "space in name": post(headers=(b"X A: 1",)),
    "empty name": post(headers=(b": a",)),
    "no colon": post(headers=(b"X-A a",)),
    "NUL in value": post(headers=(b"X-A: a\x00b",)),
    "NUL in name": post(headers=(b"X\x00A: b",)),
    "NUL in path": post(path=b"/filter\x00"),
    "non-ASCII value": post(headers=("X-A: é☃".encode(),)),
    "non-ASCII name": post(headers=("Xé: a".encode(),)),
    "bare CR in value": post(headers=(b"X-A: a\rb",)),
    "bare LF": post(headers=(b"X-A: 1\nX-B: 2",)),
    "bare LF ends head": post().replace(b"\r\n\r\n", b"\n\r\n"),
    "underscore twins": post(headers=(b"X_Forwarded_For: 1.2.3.4", b"X-Forwarded-For: 5.6.7.8")),
    "Content_Type": post(headers=(b"Content_Type: text/plain",)),
    "long header line": post(headers=(b"X-A: " + b"a" * 70_000,)),
    "long header line under the limit": post(headers=(b"X-A: " + b"a" * 60_000,)),
    "many headers": post(headers=tuple(b"X-%d: a" % i for i in range(3000))),
    # Request line and target.
    "absolute-form": post(path=b"http://x/filter"),
    "query": post(path=b"/filter?x"),
    "double slash": post(path=b"//filter"),
    "trailing slash": post(path=b"/filter/"),
    "percent-encoded": post(path=b"/%66ilter"),
    "percent-encoded slash": post(path=b"%2Ffilter"),
    "upper case": post(path=b"/FILTER"),
    "traversal": post(path=b"/x/../filter"),
    "dot segment": post(path=b"/./filter"),
    "semicolon": post(path=b"/filter;a"),
    "fragment": post(path=b"/filter#a"),
    "HTTP/1.0": post(version=b"HTTP/1.0"),
    "HTTP/1.0 keep-alive": post(version=b"HTTP/1.0", headers=(b"Connection: Keep-Alive",)),
    "HTTP/1.2": post(version=b"HTTP/1.2"),
    "http/1.1 lower": post(version=b"http/1.1"),
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "method lower": post(method=b"post"),
    "HEAD": post(method=b"HEAD"),
    "leading CRLF": b"\r\n" + post(),
    "leading space": b" " + post(),
    "two spaces": post(path=b" /filter"),
    "tab in line": post(path=b"/filter\tHTTP/1.1 x"),
    # Host, Connection, Expect, Authorization.
    "no Host": post().replace(b"Host: x\r\n", b""),
    "two Hosts": post(headers=(b"Host: y",)),
    "two Hosts odd case": post(headers=(b"hOsT: y",)),
    "Connection Close": post(headers=(b"Connection: Close",)),
    "Connection list": post(headers=(b"Connection: keep-alive, close",)),
    "two Connection close": post(headers=(b"Connection: close", b"Connection: close")),
    "Expect 100-continue": post(headers=(b"Expect: 100-continue",)),
    "Expect other": post(headers=(b"Expect: foo",)),
    "Authorization twice": post(headers=(b"Authorization: Bearer a", b"Authorization: Bearer b")),
    "Authorization odd case": post(headers=(b"aUtHoRiZaTiOn:   Bearer   a  ",)),
    # Bodies, and what follows them on the connection.
    "body not JSON": post(body=b"{x"),
    "body NaN": post(body=b'{"Pod": NaN}'),
    "body over the limit": post(body=b"x" * 5000),
    "CL short of the body": post(headers=(b"Content-Length: %d" % (N - 5),), length=False),
    "pipelined verb": post() + post(path=b"/prioritize"),
    "pipelined GET": post() + b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n",
    "pipelined smuggled by CL": post(body=FILTER + post(path=b"/bind", body=b"{}")),
    "trailing CRLF": post() + b"\r\n",
}
"""Each sent alone on a fresh connection, which the client then half-closes."""


def _server(front: bool, tls: tuple[str, str, str] | None = None) -> RunningServer:
    server: dict[str, Any] = {"host": "127.0.0.1", "max_body_bytes": 4096, "threads": 4,
                              "request_read_timeout_seconds": DEADLINE}
    if tls:
        server.update(tls_cert_file=tls[0], tls_key_file=tls[1], tls_client_ca_file=tls[2])
    cfg = build_config({"server": server})
    app = create_app(ConfigHolder(cfg), SimSource([node("n1")]))
    if tls:
        app = scheduler_only(app, cfg.server.scheduler_client_names)
    running = start_background(app, cfg.server, port=0)
    if tls:
        ask_for_client_certificates(running.server.ssl_adapter, tls[2])
    if not front:
        running.server.ConnectionClass.front_paths = frozenset()
    return running


@contextmanager
def _pair(tls: tuple[str, str, str] | None = None) -> Iterator[tuple[RunningServer, ...]]:
    front, plain = _server(True, tls), _server(False, tls)
    try:
        yield front, plain
    finally:
        front.stop()
        plain.stop()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[RunningServer, ...]]:
    with _pair() as pair:
        yield pair


def transcript(port: int, *parts: bytes, wrap: Callable[[Any], Any] | None = None,
               pause: float = 0.0, half_close: bool = True, wait: float = 5.0,
               ) -> tuple[str, bytes]:
    """Send ``parts`` (``pause`` seconds apart), half-close unless told not to, and read
    until the server closes: how it ended (``closed``, ``reset``, ``timeout``) and every
    byte it answered, ``Date`` taken out."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=wait)
    if wrap is not None:
        sock = wrap(sock)
    got, how = b"", "closed"
    with sock:
        for i, part in enumerate(parts):
            if i and pause:
                time.sleep(pause)
            sock.sendall(part)
        if half_close and wrap is None:
            with suppress(OSError):  # the server may have closed first
                sock.shutdown(socket.SHUT_WR)
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except TimeoutError:
            how = "timeout"
        except (ConnectionResetError, ssl.SSLError):
            how = "reset"
    return how, _DATE.sub(b"", got)


def statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_every_attack_ends_as_without_the_front(servers: Any, name: str) -> None:
    front, plain = servers
    mine, theirs = transcript(front.port, ATTACKS[name]), transcript(plain.port, ATTACKS[name])
    assert mine == theirs
    assert mine[0] == "closed" and statuses(mine[1])  # answered, then closed on our EOF


def test_a_header_name_with_an_underscore_is_not_a_content_length(servers: Any) -> None:
    # cheroot frames the body by ``Content-Length`` as written (none here: no body), while
    # its WSGI environ spells ``_`` and ``-`` alike; the front took the body (200).
    front, _ = servers
    how, answer = transcript(front.port, ATTACKS["CL underscore"])
    assert statuses(answer) == [b"400", b"400"]  # an empty body, then the body as a request


def test_pipelined_requests_are_answered_in_turn_never_merged(servers: Any) -> None:
    front, _ = servers
    _, answer = transcript(front.port, ATTACKS["pipelined verb"])
    first, second = answer.split(b"HTTP/1.1 ")[1:]
    assert b'"NodeNames":["n1"]' in first and b'[{"Host":"n1"' in second
    _, answer = transcript(front.port, ATTACKS["pipelined smuggled by CL"])
    assert statuses(answer) == [b"400"]  # one body (a filter and a bind: not JSON), no bind


def test_a_body_that_arrives_later_is_waited_for_in_pieces(servers: Any) -> None:
    front, plain = servers
    parts = (post()[:-N], FILTER[:7], FILTER[7:20], FILTER[20:])
    mine = transcript(front.port, *parts, pause=0.1)
    assert mine == transcript(plain.port, *parts, pause=0.1)
    assert statuses(mine[1]) == [b"200"]


def seconds_until_dropped(port: int, partial: bytes, limit: float,
                          ) -> tuple[float | None, bytes]:
    """Send ``partial``, then one more byte every 0.2 s: when the server closed the
    connection (None: not within ``limit`` seconds), and what it answered before."""
    started, got = time.monotonic(), b""
    with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
        sock.sendall(partial)
        while time.monotonic() - started < limit:
            try:
                sock.sendall(b"a")
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return time.monotonic() - started, got
            got += chunk
    return None, got


@pytest.mark.parametrize("partial", [
    post()[:-N], post()[:-50], post()[:30], post(headers=(b"X-A: a",))[:-N - 4],
    without_length(b"Content-Length: %012d" % N)[:-N],
    without_length(b"Content-Length: %018d" % N)[:-N],
], ids=["no body", "part of the body", "part of the head", "head not ended",
        "CL 12 digits", "CL 18 digits"])
def test_a_request_trickled_past_the_deadline_is_dropped(servers: Any, partial: bytes) -> None:
    # The gathering server holds no worker for it, and the front never sees it. A length
    # of 13 to 18 digits (zeros first) was not gathered: a worker read its body from the
    # socket, each byte within cheroot's 10 s timeout, for as long as the bytes came.
    for running in servers:
        dropped, answer = seconds_until_dropped(running.port, partial, DEADLINE + 3)
        assert dropped is not None and dropped >= DEADLINE - 0.1 and answer == b"", dropped


@pytest.mark.parametrize("then", [post()[:40], post()[:-N], b"\r\n"],
                         ids=["part of a head", "no body", "a CRLF"])
def test_a_pipelined_request_trickled_past_the_deadline_is_dropped(servers: Any,
                                                                   then: bytes) -> None:
    # The first request is answered; the second, read ahead with it, waits in the
    # selector like any other: a worker read its rest from the socket, each byte within
    # cheroot's 10 s timeout, for as long as the bytes came.
    for running in servers:
        dropped, answer = seconds_until_dropped(running.port, post() + then, DEADLINE + 3)
        assert dropped is not None and statuses(answer) == [b"200"], dropped


def test_a_head_past_the_gathering_limit_is_refused_at_once(servers: Any) -> None:
    # Handed to cheroot unfinished (contracts.httpserve.MAX_HEAD_BYTES): a worker read
    # the rest of it from the socket, each byte within cheroot's 10 s timeout.
    for running in servers:
        how, answer = transcript(running.port, b"POST /filter HTTP/1.1\r\nX-A: " + b"a" * 70_000,
                                 half_close=False, wait=3)
        assert how == "closed" and statuses(answer) == [b"413"]


def test_head_size_limit_as_cheroots(servers: Any) -> None:
    # With cheroot's header size limit set, heads at and around it: cheroot counts the
    # head's end (CRLF CRLF) too, so a head 1..4 bytes over it is cheroot's 413.
    front, plain = servers
    request = post()
    head_end = request.index(b"\r\n\r\n")
    seen = set()
    try:
        for limit in range(head_end - 2, head_end + 6):
            for running in servers:
                running.server.max_request_header_size = limit
            mine, theirs = transcript(front.port, request), transcript(plain.port, request)
            assert mine == theirs, limit
            seen.update(statuses(mine[1]))
    finally:
        for running in servers:
            running.server.max_request_header_size = MAX_HEAD_BYTES
    assert seen == {b"200", b"413"}


def test_body_size_limit_as_cheroots(servers: Any) -> None:
    # cheroot's own body limit, where set, below the hardened server's: cheroot's 413.
    front, plain = servers
    seen = set()
    try:
        for limit in (N - 1, N, N + 1):
            for running in servers:
                running.server.max_request_body_size = limit
            mine, theirs = transcript(front.port, post()), transcript(plain.port, post())
            assert mine == theirs, limit
            seen.update(statuses(mine[1]))
    finally:
        for running in servers:
            running.server.max_request_body_size = 0
    assert seen == {b"200", b"413"}


def test_keep_alive_exhaustion_as_cheroots(servers: Any) -> None:
    # With room for one kept-alive connection, a second client is told to close.
    answers = []
    try:
        for running in servers:
            running.server.keep_alive_conn_limit = 1
            with socket.create_connection(("127.0.0.1", running.port), timeout=5) as held:
                held.sendall(post())
                assert held.recv(65536).startswith(b"HTTP/1.1 200")
                for _ in range(100):  # until the server has taken it back as kept alive
                    if not running.server.can_add_keepalive_connection:
                        break
                    time.sleep(0.02)
                answers.append(transcript(running.port, post()))
    finally:
        for running in servers:
            running.server.keep_alive_conn_limit = 512
    assert answers[0] == answers[1]
    assert b"\r\nConnection: close\r\n" in answers[0][1]


def _certificates(tmp: Path) -> Path:
    subprocess.run(["sh", str(MANIFESTS / "tls/generate-certs.sh"), str(tmp)],
                   check=True, capture_output=True, timeout=60)
    return tmp


AUTH_VARIANTS = {
    "none": (),
    "bearer": (b"Authorization: Bearer x",),
    "bearer odd case": (b"authorization:  bEARER   x ",),
    "twice": (b"Authorization: Bearer x", b"Authorization: Bearer y"),
    "basic": (b"Authorization: Basic dGFuZGVtOnNjaGVkdWxlcg==",),
    "client-cert headers": (b"SSL-Client-Verify: SUCCESS", b"SSL_CLIENT_S_DN_CN: tandem-scheduler",
                            b"X-SSL-Client-Verify: SUCCESS"),
}


def test_without_the_schedulers_certificate_every_call_is_forbidden(tmp_path: Path) -> None:
    tmp = _certificates(tmp_path)
    files = (str(tmp / "tls.crt"), str(tmp / "tls.key"), str(tmp / "ca.crt"))

    def wrapper(cert: tuple[str, str] | None) -> Callable[[Any], Any]:
        ctx = ssl.create_default_context(cafile=files[2])
        if cert:
            ctx.load_cert_chain(*cert)
        return lambda s: ctx.wrap_socket(s, server_hostname="127.0.0.1")

    no_cert = wrapper(None)
    scheduler = wrapper((str(tmp / "scheduler.crt"), str(tmp / "scheduler.key")))
    with _pair(files) as (front, plain):
        for name, headers in AUTH_VARIANTS.items():
            for path in (b"/filter", b"/bind", b"/%66ilter"):
                request = post(path=path, headers=(*headers, b"Connection: close"))
                mine = transcript(front.port, request, wrap=no_cert)
                assert mine == transcript(plain.port, request, wrap=no_cert), (name, path)
                # 403, or 400 where cheroot refuses the head (a repeated Authorization)
                assert statuses(mine[1]) == [b"400" if name == "twice" else b"403"], name
        # Pipelined over TLS: the second request, read ahead in the TLS files, answered too.
        allowed = post() + post(path=b"/prioritize", headers=(b"Connection: close",))
        mine = transcript(front.port, allowed, wrap=scheduler)
        assert mine == transcript(plain.port, allowed, wrap=scheduler)
        assert statuses(mine[1]) == [b"200", b"200"] and b'[{"Host":"n1"' in mine[1]
