"""The lean API client against a scripted HTTP server: framing, keep-alive, errors, auth."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.cluster.kube_http import LeanPoster, supports

HANG_UP = b"<hang up>"
"""Ends a scripted answer: send the rest, then close without saying so (idle timeout)."""


class ScriptedServer:
    """Answers each request with the next scripted raw response; records requests."""

    def __init__(self, answers: list[bytes], tls: ssl.SSLContext | None = None):
        self.answers = list(answers)
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.tls = tls
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed by the test
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except ssl.SSLError:
                    conn.close()  # the client refused our certificate
                    continue
            with conn, conn.makefile("rb") as reader:
                while self.answers:
                    head = b""
                    while (line := reader.readline()) not in (b"\r\n", b""):
                        head += line
                    if not head:
                        break  # the client closed this connection
                    length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                                   if h.lower().startswith(b"content-length")), 0)
                    self.requests.append((head, reader.read(length)))
                    answer = self.answers.pop(0)
                    conn.sendall(answer.removesuffix(HANG_UP))
                    if b"Connection: close" in answer or answer.endswith(HANG_UP):
                        break

    def close(self) -> None:
        self.sock.close()


def ok(body: bytes = b'{"kind":"Status"}', extra: str = "") -> bytes:
    return (f"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def poster(server: ScriptedServer, path: str = "", **settings) -> LeanPoster:
    cfg = client.Configuration(host=f"http://127.0.0.1:{server.port}{path}")
    for name, value in settings.items():
        setattr(cfg, name, value)
    return LeanPoster(cfg, "tandem-test")


def test_keep_alive_reuses_one_connection_and_sends_the_body():
    server = ScriptedServer([ok(), ok(b'{"a":1}')])
    lean = poster(server, "/prefix", api_key={"authorization": "Bearer t0k"})
    assert lean.post("/api/v1/x", b'{"n":1}') == b'{"kind":"Status"}'
    assert lean.post("/api/v1/y", b'{"n":2}') == b'{"a":1}'
    assert server.connections == 1
    head, body = server.requests[0]
    assert head.startswith(b"POST /prefix/api/v1/x HTTP/1.1\r\n") and body == b'{"n":1}'
    assert b"authorization: Bearer t0k\r\n" in head and b"Content-Type: application/json" in head
    lean.close()
    server.close()


def test_chunked_answer_and_connection_close():
    chunked = (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               b"4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n")
    server = ScriptedServer([chunked, ok()])
    lean = poster(server)
    assert lean.post("/x", b"{}") == b'{"a":1}'
    assert lean.post("/x", b"{}") == b'{"kind":"Status"}'
    assert server.connections == 2  # the server said close: the socket was not reused
    server.close()


def test_stale_keep_alive_connection_is_replaced():
    server = ScriptedServer([ok() + HANG_UP, ok()])
    lean = poster(server)
    lean.post("/x", b"{}")
    for _ in range(100):  # until the hang-up has reached our socket
        if lean._idle[0].stale():
            break
        time.sleep(0.01)
    assert lean.post("/x", b"{}") == b'{"kind":"Status"}' and server.connections == 2
    server.close()


def test_error_status_is_an_api_exception_with_the_body():
    body = b'{"kind":"Status","reason":"Conflict","message":"already assigned"}'
    server = ScriptedServer([(b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n"
                              % len(body)) + body, ok()])
    lean = poster(server)
    with pytest.raises(ApiException) as exc:
        lean.post("/x", b"{}")
    assert exc.value.status == 409 and "already assigned" in str(exc.value)
    assert lean.post("/x", b"{}") == b'{"kind":"Status"}'  # the connection stays usable
    assert server.connections == 1
    server.close()


def test_truncated_answer_is_an_error_and_the_socket_is_dropped():
    server = ScriptedServer([b"HTTP/1.1 201 Created\r\nContent-Length: 50\r\n"
                             b"Connection: close\r\n\r\n{}"])
    lean = poster(server)
    with pytest.raises(ConnectionError, match="mid-answer"):
        lean.post("/x", b"{}")
    assert lean._idle == []
    server.close()


def test_proxy_configurations_stay_on_the_official_client():
    cfg = client.Configuration(host="https://10.0.0.1:6443")
    assert supports(cfg)
    cfg.proxy = "http://proxy:3128"
    assert not supports(cfg)
    with pytest.raises(ValueError, match="unsupported"):
        LeanPoster(cfg, "x")


@pytest.fixture
def certificate(tmp_path):
    """A throwaway self-signed certificate for 127.0.0.1: (cert, key) paths."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def test_https_verifies_the_server_against_the_configured_ca(certificate):
    cert, key = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = ScriptedServer([ok()], tls)
    cfg = client.Configuration(host=f"https://127.0.0.1:{server.port}")
    with pytest.raises(ssl.SSLCertVerificationError):
        LeanPoster(cfg, "tandem-test").post("/x", b"{}")  # not signed by a CA we trust
    cfg.ssl_ca_cert = str(cert)
    assert LeanPoster(cfg, "tandem-test").post("/x", b"{}") == b'{"kind":"Status"}'
    server.close()
