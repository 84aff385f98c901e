"""A bounded slow-loris on loopback, for tests and the slow-client benchmark."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class SlowClients:
    """``count`` connections that each send a request head one byte every ``interval``
    seconds, for at most ``seconds`` (loopback only; every socket closed at the end)."""

    HEAD = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
           b"Content-Length: 2\r\n\r\n{}"

    def __init__(self, port: int, count: int, interval: float, seconds: float,
                 tls: bool = False, silent: bool = False):
        assert count <= 256 and seconds <= 60, "bounded by design"
        self.port, self.count, self.interval, self.seconds = port, count, interval, seconds
        self.tls, self.silent = tls, silent
        self.dropped = 0
        """Connections the server closed before we were done (each is opened again)."""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._opened = threading.Semaphore(0)
        """Released once per connection when it first opened and sent its first byte."""

    def _one(self) -> None:
        end = time.monotonic() + self.seconds
        begun = False
        while not self._stop.is_set() and time.monotonic() < end:
            try:  # a dropped connection is opened again, as an attacker would
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                self._stop.wait(self.interval)
                continue
            try:
                for i in range(len(self.HEAD)):
                    if self._stop.is_set() or time.monotonic() > end:
                        return
                    if not self.silent:
                        sock.sendall(self.HEAD[i:i + 1])
                    if i == 0 and not begun:
                        begun = True
                        self._opened.release()
                    if self._stop.wait(self.interval):
                        return
                return  # the whole head went through (never, at these intervals)
            except OSError:
                with self._lock:
                    self.dropped += 1
            finally:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> SlowClients:
        for _ in range(self.count):
            t = threading.Thread(target=self._one, daemon=True)
            t.start()
            self._threads.append(t)
        # Every connection is open and has begun (waited for, not assumed after a fixed
        # sleep: on a busy machine the threads may start late), within a bound.
        deadline = time.monotonic() + 10
        for _ in range(self.count):
            if not self._opened.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)


def seconds_until_dropped(port: int, limit: float = 5.0) -> float | None:
    """Send a request head one byte at a time, never finishing it: the seconds until the
    server closed the connection (None: still open after ``limit`` seconds)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=0.1)
    try:
        sock.sendall(b"GET /livez HTTP/1.1\r\n")
        start = time.monotonic()
        while time.monotonic() - start < limit:
            try:
                sock.sendall(b"X")
                if sock.recv(1) == b"":
                    return time.monotonic() - start
            except TimeoutError:
                continue  # still open: the server has nothing to say yet
            except OSError:
                return time.monotonic() - start
        return None
    finally:
        sock.close()
