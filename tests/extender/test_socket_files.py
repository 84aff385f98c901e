"""cheroot's socket files on C io (``extender.transport.socket_files``)."""

from __future__ import annotations

import socket

import pytest

from extender.transport.socket_files import SocketReader, SocketWriter, socket_file


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.settimeout(2)
    yield a, b
    a.close()
    b.close()


def test_has_data_reports_buffered_bytes_and_never_reads_the_socket(pair) -> None:
    ours, peer = pair
    reader = socket_file(ours, "rb")
    assert isinstance(reader, SocketReader)
    peer.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reader.has_data() is False  # bytes wait in the socket, not in the reader
    assert reader.readline() == b"GET / HTTP/1.1\r\n"
    assert reader.has_data() is True  # the rest of the head came in with the first read
    assert reader.readline() == b"Host: x\r\n"
    assert reader.readline() == b"\r\n"
    assert reader.has_data() is False


def test_reads_are_counted_and_a_silent_peer_times_out(pair) -> None:
    ours, peer = pair
    reader = socket_file(ours, "rb")
    peer.sendall(b"abcdef")
    assert reader.read(4) == b"abcd"
    assert reader.bytes_read == 4
    assert reader.read(2) == b"ef"
    ours.settimeout(0.05)
    with pytest.raises(TimeoutError):
        reader.read(1)


def test_each_write_is_sent_at_once(pair) -> None:
    ours, peer = pair
    writer = socket_file(ours, "wb")
    assert isinstance(writer, SocketWriter)
    assert writer.write(b"HTTP/1.1 200 OK\r\n\r\n") == 19
    peer.settimeout(2)
    assert peer.recv(100) == b"HTTP/1.1 200 OK\r\n\r\n"
    assert writer.bytes_written == 19
    with pytest.raises(TypeError):
        writer.write("text")  # type: ignore[arg-type]


def test_a_head_that_announces_a_body_goes_out_with_it(pair) -> None:
    ours, peer = pair
    peer.settimeout(0.2)
    writer = socket_file(ours, "wb")
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
    writer.write(head)
    with pytest.raises(TimeoutError):
        peer.recv(100)  # held for its body
    writer.write(b"{}")
    assert peer.recv(100) == head + b"{}"
    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # no body announced: sent at once
    assert peer.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(head)  # a HEAD request's answer: its body never comes
    writer.flush()
    assert peer.recv(100) == head
    assert writer.bytes_written == 2 * len(head) + 2 + 25


def test_every_answer_of_the_server_arrives(tmp_path) -> None:
    # Through the extender's server: a GET, a HEAD and an error answer, each complete.
    import http.client

    from extender.config.sections import ServerConfig
    from extender.transport.server import start_background

    def app(environ, start_response):
        body = b'{"ok": true}'
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])
        return [body]
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
