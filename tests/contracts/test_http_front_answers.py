"""The extender's server on ``contracts.httpfront``: plain POSTs to the scheduling verbs are
answered before cheroot (and before Flask), byte for byte as cheroot answers them; every
other request is cheroot's, as before."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from extender_builders import node
from flask import Flask

from extender.cluster.sim import SimSource
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.config.sections import ServerConfig
from extender.transport.server import RunningServer, start_background
from extender.wiring import create_app

_DATE = re.compile(rb"\r\nDate: [^\r]*")
POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"}, "spec": {}}
FILTER = json.dumps({"Pod": POD, "NodeNames": ["n1"]}).encode()


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json",
            f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


REQUESTS = {
    "filter": _post("/filter", FILTER),
    "prioritize": _post("/prioritize", FILTER),
    "bind unknown pod": _post("/bind", json.dumps({"PodName": "nope", "PodNamespace": "default",
                                                   "PodUID": "u9", "Node": "n1"}).encode()),
    "not json": _post("/filter", b"{not json"),
    "not ExtenderArgs": _post("/prioritize", b"[1, 2]"),
    "preempt": _post("/preempt", json.dumps({"Pod": POD, "NodeNameToMetaVictims": {}}).encode()),
    "connection close": _post("/filter", FILTER, "Connection: close"),
    "oversize declared": _post("/filter", b"", "X-Pad: 1").replace(
        b"Content-Length: 0", b"Content-Length: 999999"),
    "bad length": _post("/filter", FILTER).replace(b"Content-Length: ", b"Content-Length: +"),
    "repeated host": _post("/filter", FILTER, "Host: y"),
    "folded header": _post("/filter", FILTER, "X-A: 1", " more"),
    "bare LF": _post("/filter", FILTER, "X-A: 1\nX-B: 2"),
    "get on a verb": b"GET /filter HTTP/1.1\r\nHost: x\r\n\r\n",
    "query": _post("/filter?x=1", FILTER),
    "http/1.0": _post("/filter", FILTER).replace(b"HTTP/1.1", b"HTTP/1.0"),
    "unknown path": _post("/nowhere", b"{}"),
    "livez": b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n",
}
"""Each sent alone on a fresh connection."""


def _server(front: bool, tls: tuple[str, str] | None = None, max_body: int = 4096,
            ) -> tuple[RunningServer, Flask, list[int]]:
    server: dict[str, Any] = {"host": "127.0.0.1", "max_body_bytes": max_body}
    if tls:
        server.update(tls_cert_file=tls[0], tls_key_file=tls[1])
    cfg = build_config({"server": server})
    app = create_app(ConfigHolder(cfg), SimSource([node("n1")]))
    running = start_background(app, cfg.server, port=0)
    conn = running.server.ConnectionClass
    if not front:
        conn.front_paths = frozenset()
    parsed = [0]
    request_class = conn.RequestHandlerClass
    original = request_class.parse_request

    def counted(self: Any) -> Any:
        parsed[0] += 1
        return original(self)
    request_class.parse_request = counted  # each server has a class of its own
    return running, app, parsed


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[tuple[RunningServer, Flask, list[int]], ...]]:
    front, plain = _server(True), _server(False)
    yield front, plain
    front[0].stop()
    plain[0].stop()


def _answer_end(got: bytes, start: int) -> int | None:
    """Where the answer starting at ``start`` ends (its Content-Length, its last chunk);
    None while incomplete, or when only the close can end it."""
    end = got.find(b"\r\n\r\n", start)
    if end < 0:
        return None
    head = got[start:end].lower()
    length = re.search(rb"\r\ncontent-length: *([0-9]+)", head)
    if length:
        stop = end + 4 + int(length.group(1))
        return stop if len(got) >= stop else None
    last = got.find(b"\r\n0\r\n\r\n", end) if b"transfer-encoding: chunked" in head else -1
    return None if last < 0 else last + 7


def _exchange(port: int, data: bytes, wrap: Any = None, answers: int = 1) -> bytes:
    """``data`` on a fresh connection; the server's next ``answers`` answers (each whole,
    or up to the close), ``Date`` taken out."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if wrap is not None:
        sock = wrap(sock)
    with sock:
        sock.sendall(data)
        got, start = b"", 0
        for _ in range(answers):
            while (stop := _answer_end(got, start)) is None:
                chunk = sock.recv(65536)
                if not chunk:
                    return _DATE.sub(b"", got)
                got += chunk
            start = stop
    return _DATE.sub(b"", got)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_answers_are_cheroots_byte_for_byte(servers: Any, name: str) -> None:
    (front, _, _), (plain, _, _) = servers
    mine, theirs = _exchange(front.port, REQUESTS[name]), _exchange(plain.port, REQUESTS[name])
    assert mine == theirs
    assert mine.startswith(b"HTTP/1.1 ")


def test_only_plain_verb_posts_skip_cheroot_and_flask(servers: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (front, app, parsed), _ = servers
    contexts = []
    original = Flask.request_context
    monkeypatch.setattr(Flask, "request_context",
                        lambda self, environ: contexts.append(environ["PATH_INFO"])
                        or original(self, environ))
    before = parsed[0]
    plain = {"filter": 200, "prioritize": 200, "bind unknown pod": 200, "not json": 400,
             "preempt": 200, "connection close": 200}
    for name, status in plain.items():
        assert _exchange(front.port, REQUESTS[name]).startswith(b"HTTP/1.1 %d " % status)
    assert parsed[0] == before and contexts == []  # neither cheroot's parser nor Flask
    for name in ("get on a verb", "query", "http/1.0", "repeated host"):
        _exchange(front.port, REQUESTS[name])
    assert parsed[0] == before + 4  # cheroot read each of these
    assert contexts == ["/filter"]  # the GET, answered by Flask (405); the POSTs were not


def test_keep_alive_pipelining_and_close(servers: Any) -> None:
    (front, _, parsed), _ = servers
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=5)
    for _ in range(3):  # one connection, kept alive across front answers
        conn.request("POST", "/filter", body=FILTER, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        assert answer.status == 200 and b"NodeNames" in answer.read()
    conn.close()
    # Two requests in one send: cheroot reads them (the front takes one request alone).
    got = _exchange(front.port, REQUESTS["filter"] + REQUESTS["prioritize"], answers=2)
    assert got.count(b"HTTP/1.1 200 OK") == 2
    got = _exchange(front.port, REQUESTS["connection close"])
    assert b"\r\nConnection: close\r\n" in got


def _certificate(tmp: Path) -> tuple[str, str]:
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def test_tls_answers_through_the_front(tmp_path: Path) -> None:
    tls = _certificate(tmp_path)
    ctx = ssl.create_default_context(cafile=tls[0])
    wrap = lambda s: ctx.wrap_socket(s, server_hostname="127.0.0.1")  # noqa: E731
    front, _, parsed = _server(True, tls)
    plain, _, _ = _server(False, tls)
    try:
        for name in ("filter", "not json", "get on a verb"):
            mine = _exchange(front.port, REQUESTS[name], wrap)
            assert mine == _exchange(plain.port, REQUESTS[name], wrap)
            assert mine.startswith(b"HTTP/1.1 ")
        assert parsed[0] == 1  # only the GET went through cheroot's parser
    finally:
        front.stop()
        plain.stop()


def test_every_answer_of_the_server_arrives() -> None:
    # A GET, a HEAD and cheroot's own error answer, each complete, on one connection.
    def app(environ, start_response):
        body = b'{"ok": true}'
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])
        # No body to a HEAD (as Flask): cheroot would send one, written after the head,
        # and the client would read it as the next answer's status line.
        return [] if environ["REQUEST_METHOD"] == "HEAD" else [body]
    server = start_background(app, ServerConfig(host="127.0.0.1", port=0))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        for method, want in (("GET", b'{"ok": true}'), ("HEAD", b""), ("GET", b'{"ok": true}')):
            conn.request(method, "/x")
            answer = conn.getresponse()
            assert (answer.status, answer.read()) == (200, want)
        conn.request("POST", "/x", body=b"x", headers={"Content-Length": "-5"})
        answer = conn.getresponse()
        assert answer.status == 400 and b"Content-Length" in answer.read()
    finally:
        server.stop()


def test_an_app_without_content_length_is_chunked_as_by_cheroot() -> None:
    def app(environ, start_response):
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"ab", b"", b"cde"]
    answers = []
    for front in (True, False):
        server = start_background(app, ServerConfig(host="127.0.0.1", port=0))
        if not front:
            server.server.ConnectionClass.front_paths = frozenset()
        try:
            answers.append(_exchange(server.port, _post("/bind", b"{}")))
        finally:
            server.stop()
    assert answers[0] == answers[1]
    assert b"Transfer-Encoding: chunked" in answers[0] and answers[0].endswith(
        b"2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n")
