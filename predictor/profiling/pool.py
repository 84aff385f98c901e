"""Worker processes of the cuda backend, spoken to in JSON lines (see :mod:`.worker`).

A reader thread per worker turns its stdout into a queue, so every wait has a
deadline: a worker that hangs is killed and reported as :class:`WorkerTimeout`,
one that dies as :class:`WorkerFailed` with the end of its stderr. The backend
then records the job as timeout/error and starts a fresh worker for the next run.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from predictor.profiling.errors import WorkerFailed, WorkerTimeout
from predictor.profiling.worker import PREFIX


def default_worker_argv(device: str = "cuda") -> list[str]:
    """The command line of a worker process (same interpreter as the parent)."""
    return [sys.executable, "-m", "predictor.profiling.worker", "--device", device]


class WorkerProcess:
    """One live worker process."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], hello_timeout_s: float):
        # Lives as long as the worker; close() closes it.
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            env=dict(env), text=True, bufsize=1,
        )  # fmt: skip
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="worker-reader", daemon=True)
        self._reader.start()
        try:
            hello = self.receive(hello_timeout_s)
            if hello.get("event") != "hello":
                raise WorkerFailed(f"worker said {hello!r} instead of hello", self.stderr_tail())
        except WorkerFailed:
            self.close()
            raise
        self.pid = int(hello["pid"])

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(PREFIX):
                try:
                    self._lines.put(json.loads(line[len(PREFIX) :]))
                except json.JSONDecodeError:
                    self._lines.put({"event": "error", "error": f"bad reply {line[:200]!r}"})
        self._lines.put(None)

    @property
    def alive(self) -> bool:
        """Whether the process is still running."""
        return self._proc.poll() is None

    def send(self, message: Mapping[str, Any]) -> None:
        """Write one message; WorkerFailed if the process is gone."""
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerFailed(f"worker {self._proc.pid} is gone: {exc}",
                               self.stderr_tail()) from exc  # fmt: skip

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """The next reply within ``timeout_s``; kills the worker on timeout."""
        try:
            msg = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise WorkerTimeout(f"worker {self._proc.pid} gave no answer in {timeout_s:.0f} s",
                                self.stderr_tail()) from None  # fmt: skip
        if msg is None:
            code = self._proc.wait()
            raise WorkerFailed(f"worker {self._proc.pid} exited with code {code}",
                               self.stderr_tail())  # fmt: skip
        return msg

    def stderr_tail(self, max_bytes: int = 4000) -> str:
        """The last bytes the worker wrote to stderr."""
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - max_bytes))
            return self._stderr.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        """Stop this worker at once."""
        if self.alive:
            self._proc.kill()
        self._proc.wait()

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.alive:
            try:
                self.send({"op": "exit"})
                self._proc.wait(timeout=timeout_s)
            except (WorkerFailed, subprocess.TimeoutExpired):
                pass
        self.kill()
        self._reader.join(timeout=5.0)
        for pipe in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        self._stderr.close()


class WorkerPool:
    """Up to ``size`` workers, started on demand and replaced when they die."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], hello_timeout_s: float):
        self.argv = list(argv)
        self.env = dict(env)
        self.hello_timeout_s = hello_timeout_s
        self._workers: list[WorkerProcess | None] = []

    def take(self, n: int) -> list[WorkerProcess]:
        """``n`` live workers (the first ``n`` slots, restarting dead ones)."""
        while len(self._workers) < n:
            self._workers.append(None)
        out = []
        for i in range(n):
            w = self._workers[i]
            if w is None or not w.alive:
                if w is not None:
                    w.close()
                w = WorkerProcess(self.argv, self.env, self.hello_timeout_s)
                self._workers[i] = w
            out.append(w)
        return out

    def close(self) -> None:
        """Stop every worker."""
        for w in self._workers:
            if w is not None:
                w.close()
        self._workers = []
