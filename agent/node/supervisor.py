"""Run one ``tandem agent serve --gpu I`` child per GPU of the node and keep it running.

The node agent (``tandem agent run --serve-gpus``) owns the per-GPU inference
servers as child processes, so one DaemonSet pod brings up a node's whole
serving stack and Kubernetes restarts it as a unit. Each GPU has a worker whose
states are::

    pending --start--> running --exit--> backoff --(delay over)--> pending
       ^                  |                                          |
       └──────────────────┴── stop(): SIGTERM, grace, SIGKILL ───> stopped

A child that exits is restarted after an exponential delay (``initial`` doubling
to ``max``); a child that stayed up for ``stable_after_seconds`` starts the next
delay from ``initial`` again, so a crash loop backs off while a rare crash is
repaired at once. ``stop()`` forwards SIGTERM to every child (the servers drain
and exit on it), waits one shared grace period, then kills what is left.

Processes come from an injected launcher and time from an injected monotonic
clock and sleep, so the state machine is tested without real children.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.errors import ConfigError

log = logging.getLogger(__name__)

_REAP_SECONDS = 2.0


class ChildProcess(Protocol):
    """The part of ``subprocess.Popen`` the supervisor uses."""

    pid: int

    def poll(self) -> int | None:
        """Exit status, or None while running."""

    def send_signal(self, sig: int) -> None:
        """Deliver a signal."""

    def kill(self) -> None:
        """SIGKILL."""


Launcher = Callable[[Sequence[str], Mapping[str, str]], ChildProcess]


def popen_launcher(argv: Sequence[str], env: Mapping[str, str]) -> ChildProcess:
    """Start a real child; it inherits stdout/stderr so its logs reach the container log."""
    return subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL)


def default_command_prefix() -> tuple[str, ...]:
    """How to invoke ``tandem``: the console script beside this Python, else ``python -c``."""
    script = Path(sys.executable).with_name("tandem")
    if script.is_file() and os.access(script, os.X_OK):
        return (str(script),)
    return (sys.executable, "-c", "from tandem.cli import main; main()")


@dataclass(frozen=True)
class SupervisorConfig:
    """How the per-GPU servers are started and restarted."""

    base_port: int = 8700
    """GPU i's server listens on base_port + i (the agent's session sync expects it)."""
    host: str = "127.0.0.1"
    """Listen address passed to each server; 0.0.0.0 in a pod that publishes hostPorts."""
    serve_args: tuple[str, ...] = ()
    """Extra ``tandem agent serve`` arguments (executor, model store, profiles)."""
    command_prefix: tuple[str, ...] = field(default_factory=default_command_prefix)
    initial_backoff_seconds: float = 1.0
    """first restart delay; 0.01..60"""
    max_backoff_seconds: float = 60.0
    """restart delay cap; >= initial"""
    stable_after_seconds: float = 30.0
    """a child that ran this long restarts its backoff from the initial delay"""
    stop_grace_seconds: float = 10.0
    """time between SIGTERM and SIGKILL on shutdown; kept below the pod's grace period"""
    admin_token_file: Path | None = None
    """passed to each server as ``--admin-token-file`` (the session endpoints' bearer token);
    without it a server reads ``$TANDEM_ADMIN_TOKEN``, which children inherit"""

    def __post_init__(self) -> None:
        if not 1 <= self.base_port <= 65535 - 64:
            raise ConfigError(f"serve base port {self.base_port}: expected 1..65471")
        if not 0.01 <= self.initial_backoff_seconds <= 60:
            raise ConfigError("initial_backoff_seconds: expected 0.01..60")
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ConfigError("max_backoff_seconds must be >= initial_backoff_seconds")
        if self.stop_grace_seconds < 0 or self.stable_after_seconds < 0:
            raise ConfigError("grace and stable periods must be >= 0")
        if not self.command_prefix:
            raise ConfigError("command_prefix is empty")
        owned = {"--gpu", "--port", "--host", "--admin-token-file"}
        clash = sorted(a.split("=", 1)[0] for a in self.serve_args if a.split("=", 1)[0] in owned)
        if clash:
            raise ConfigError(f"--serve-arg may not set {clash}: the supervisor sets them per GPU")

    def argv(self, gpu_index: int) -> tuple[str, ...]:
        """The command line of GPU ``gpu_index``'s server."""
        token = (f"--admin-token-file={self.admin_token_file}",) \
            if self.admin_token_file is not None else ()
        return (*self.command_prefix, "agent", "serve", f"--gpu={gpu_index}",
                f"--port={self.base_port + gpu_index}", f"--host={self.host}", *token,
                *self.serve_args)


@dataclass(frozen=True)
class WorkerStatus:
    """One GPU's server as the supervisor sees it (for logs and tests)."""

    gpu_index: int
    state: str  # "pending" | "running" | "backoff" | "stopped"
    pid: int | None
    starts: int
    last_exit_code: int | None
    next_start_in_seconds: float | None


@dataclass
class _Worker:
    gpu_index: int
    process: ChildProcess | None = None
    started_at: float = 0.0
    starts: int = 0
    failures_in_row: int = 0
    next_start_at: float = 0.0
    last_exit_code: int | None = None


class ServerSupervisor:
    """Starts, watches and stops the per-GPU inference servers of one node."""

    def __init__(self, config: SupervisorConfig, *, launcher: Launcher = popen_launcher,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._launch = launcher
        self._now = monotonic
        self._sleep = sleep
        env = dict(os.environ if environ is None else environ)
        # CUDA numbers GPUs fastest-first by default; NVML (and so the extender's
        # gpu-index) numbers them by PCI bus. The server's --gpu must mean the same GPU.
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self._env = env
        self._workers: dict[int, _Worker] = {}
        self._lock = threading.Lock()
        self._stopping = False

    def ensure(self, gpu_indices: Iterable[int]) -> None:
        """Supervise a server for each index (new ones start on the next ``poll``).

        GPUs that disappear from a sample keep their worker: a GPU that fell off
        the bus comes back under the same index, and its server restarts with backoff.
        """
        with self._lock:
            if self._stopping:
                return
            now = self._now()
            for index in gpu_indices:
                if index not in self._workers:
                    if not 0 <= index < 64:
                        log.warning("gpu index out of range, not served", extra={"gpu": index})
                        continue
                    self._workers[index] = _Worker(index, next_start_at=now)

    def poll(self) -> None:
        """Reap exited children, schedule their restarts, start what is due."""
        with self._lock:
            if self._stopping:
                return
            now = self._now()
            for worker in self._workers.values():
                if worker.process is not None:
                    code = worker.process.poll()
                    if code is None:
                        continue
                    self._on_exit(worker, code, now)
                if now >= worker.next_start_at:
                    self._start(worker, now)

    def _on_exit(self, worker: _Worker, code: int, now: float) -> None:
        ran = now - worker.started_at
        worker.process = None
        worker.last_exit_code = code
        worker.failures_in_row = (1 if ran >= self.config.stable_after_seconds
                                  else worker.failures_in_row + 1)
        delay = min(self.config.max_backoff_seconds,
                    self.config.initial_backoff_seconds * 2 ** (worker.failures_in_row - 1))
        worker.next_start_at = now + delay
        log.warning("inference server exited", extra={
            "gpu": worker.gpu_index, "exit_code": code, "ran_seconds": round(ran, 3),
            "restart_in_seconds": delay})

    def _start(self, worker: _Worker, now: float) -> None:
        argv = self.config.argv(worker.gpu_index)
        try:
            worker.process = self._launch(argv, self._env)
        except OSError as err:  # missing binary, fork failure: retry like a crash
            log.error("inference server did not start",
                      extra={"gpu": worker.gpu_index, "error": str(err)})
            worker.started_at = now
            self._on_exit(worker, -1, now)
            return
        worker.started_at = now
        worker.starts += 1
        log.info("inference server started", extra={
            "gpu": worker.gpu_index, "pid": worker.process.pid, "starts": worker.starts})

    def run(self, stop: threading.Event, period_seconds: float = 0.25) -> None:
        """Poll until ``stop`` is set (the caller then calls ``stop_children``)."""
        while not stop.is_set():
            self.poll()
            stop.wait(period_seconds)

    def stop_children(self) -> dict[int, int | None]:
        """SIGTERM every child, wait one grace period, SIGKILL the rest; exit codes by GPU."""
        with self._lock:
            self._stopping = True
            running = {w.gpu_index: w.process for w in self._workers.values()
                       if w.process is not None and w.process.poll() is None}
            for process in running.values():
                _signal(process, signal.SIGTERM)
            deadline = self._now() + self.config.stop_grace_seconds
            while any(p.poll() is None for p in running.values()) and self._now() < deadline:
                self._sleep(0.05)
            killed = [i for i, p in running.items() if p.poll() is None]
            for index in killed:
                log.warning("inference server ignored SIGTERM; killing",
                            extra={"gpu": index, "pid": running[index].pid})
                running[index].kill()
            reap_until = self._now() + _REAP_SECONDS  # SIGKILL is not instant; reap the zombies
            while any(running[i].poll() is None for i in killed) and self._now() < reap_until:
                self._sleep(0.05)
            codes = {index: process.poll() for index, process in running.items()}
            for worker in self._workers.values():
                worker.process = None
            return codes

    def status(self) -> tuple[WorkerStatus, ...]:
        """Every worker, by GPU index."""
        with self._lock:
            now = self._now()
            out = []
            for w in sorted(self._workers.values(), key=lambda w: w.gpu_index):
                if self._stopping:
                    state, wait = "stopped", None
                elif w.process is not None:
                    state, wait = "running", None
                elif w.starts == 0 and w.last_exit_code is None:
                    state, wait = "pending", max(0.0, w.next_start_at - now)
                else:
                    state, wait = "backoff", max(0.0, w.next_start_at - now)
                pid = w.process.pid if w.process is not None else None
                out.append(WorkerStatus(w.gpu_index, state, pid, w.starts, w.last_exit_code,
                                        wait))
            return tuple(out)


def _signal(process: ChildProcess, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited between poll and signal
        process.send_signal(sig)
