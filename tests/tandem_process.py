"""A real ``tandem`` process for tests (no tests here): started with its stderr (the JSON log)
read line by line, waited on for a log line, stopped with SIGTERM within a bound."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

TANDEM = Path(sys.executable).with_name("tandem")


def free_port() -> int:
    """A loopback port nothing listens on (a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig at ``path`` for the API server at ``url`` (a token, no TLS)."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
    return path


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a running process, from /proc (None without it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TandemProcess:
    """``tandem ARGS`` with ``env`` over this process's environment; ``lines``: its stderr."""

    def __init__(self, args: list[str], env: Mapping[str, str] | None = None):
        if not TANDEM.is_file():
            pytest.skip("the tandem console script is not installed beside this Python")
        self.popen = subprocess.Popen(
            [str(TANDEM), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.lines: list[str] = []
        self.exit_cpu_seconds: float | None = None
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    @property
    def text(self) -> str:
        """Everything it wrote to stderr so far."""
        with self._cond:
            return "".join(self.lines)

    def wait_for(self, msg: str, seconds: float = 60.0) -> None:
        """Until a JSON log line with this ``msg`` appears (AssertionError after ``seconds``)."""
        def seen() -> bool:
            return any(line.startswith("{") and json.loads(line).get("msg") == msg
                       for line in self.lines)
        with self._cond:
            if not self._cond.wait_for(seen, timeout=seconds):
                raise AssertionError(f"no {msg!r} log line; stderr: {''.join(self.lines)}")

    def terminate(self, seconds: float) -> tuple[int, float]:
        """SIGTERM, then (exit code, seconds it took to exit); AssertionError when it is
        still running after ``seconds`` (it is then killed). ``exit_cpu_seconds``: the CPU
        time it spent from SIGTERM to its exit (None where /proc is not there), which,
        unlike the wall time, a loaded machine's run queue does not stretch."""
        before = _cpu_seconds(self.popen.pid)
        self.popen.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        while True:  # os.wait4, not Popen.wait: the child's CPU time comes with its status
            pid, status, usage = os.wait4(self.popen.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - sent > seconds:
                self.close()
                raise AssertionError(f"still running {seconds} s after SIGTERM; "
                                     f"stderr: {self.text}")
            time.sleep(0.01)
        took = time.monotonic() - sent
        code = self.popen.returncode = os.waitstatus_to_exitcode(status)
        self.exit_cpu_seconds = None if before is None else \
            usage.ru_utime + usage.ru_stime - before
        self._reader.join(timeout=5)  # the last lines
        return code, took

    def close(self) -> None:
        """Kill it if it still runs; close its pipe."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=5)
        self._reader.join(timeout=5)
        if self.popen.stderr is not None:
            self.popen.stderr.close()
