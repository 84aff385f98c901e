"""The MPS control daemons of a node: one per GPU, started and kept running by the agent.

Each daemon is ``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES`` set to
its GPU and its own pipe and log directories (:mod:`contracts.mps`), so the device
plugin can point each container at its GPU's daemon and set the container's memory
limit (:mod:`agent.device_plugin.mps`). Each check asks every daemon
``get_server_list``; one that does not answer is started again, at most once per
``restart_backoff_seconds``. On shutdown each daemon is told ``quit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from contracts import mps as layout

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"


@dataclass(frozen=True)
class MpsDaemonConfig:
    """Where the daemons live and how often they are checked."""

    root: Path = layout.DEFAULT_ROOT
    command: str = CONTROL
    check_interval_seconds: float = 5.0
    restart_backoff_seconds: float = 10.0
    timeout_seconds: float = 10.0


Runner = Callable[..., subprocess.CompletedProcess]


class MpsDaemons:
    """Start, check and stop one MPS control daemon per GPU UUID."""

    def __init__(self, config: MpsDaemonConfig, uuids: Callable[[], Sequence[str]],
                 run: Runner = subprocess.run, clock: Callable[[], float] = time.monotonic,
                 environ: Mapping[str, str] | None = None) -> None:
        self.config, self._uuids, self._run, self._clock = config, uuids, run, clock
        self._environ = dict(os.environ if environ is None else environ)
        self._last_start: dict[str, float] = {}
        self.starts: dict[str, int] = {}

    def env(self, uuid: str) -> dict[str, str]:
        """The environment every command about ``uuid``'s daemon runs with."""
        return {**self._environ, "CUDA_VISIBLE_DEVICES": uuid,
                "CUDA_MPS_PIPE_DIRECTORY": str(layout.pipe_dir(self.config.root, uuid)),
                "CUDA_MPS_LOG_DIRECTORY": str(layout.log_dir(self.config.root, uuid))}

    def _control(self, uuid: str, args: list[str], stdin: str | None = None) -> bool:
        try:
            done = self._run([self.config.command, *args], input=stdin, env=self.env(uuid),
                             capture_output=True, text=True,
                             timeout=self.config.timeout_seconds, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            log.warning("mps control failed", extra={"gpu": uuid, "error": str(err)})
            return False
        return done.returncode == 0

    def running(self, uuid: str) -> bool:
        """Whether ``uuid``'s control daemon answers."""
        return self._control(uuid, [], "get_server_list\n")

    def start(self, uuid: str) -> bool:
        """Make the directories and start the daemon (it forks into the background)."""
        for directory in (layout.pipe_dir(self.config.root, uuid),
                          layout.log_dir(self.config.root, uuid),
                          layout.shm_dir(self.config.root)):
            directory.mkdir(parents=True, exist_ok=True)
            # The daemon starts each server as its client's user: like /tmp, anyone
            # may add entries, only their owner removes them.
            with contextlib.suppress(OSError):
                directory.chmod(0o1777)
        self._last_start[uuid] = self._clock()
        self.starts[uuid] = self.starts.get(uuid, 0) + 1
        ok = self._control(uuid, ["-d"])
        log.info("mps daemon started" if ok else "mps daemon failed to start",
                 extra={"gpu": uuid, "starts": self.starts[uuid]})
        return ok

    def check(self) -> dict[str, bool]:
        """One pass: each GPU's daemon running, started again where it is not."""
        state = {}
        for uuid in self._uuids():
            if self.running(uuid):
                state[uuid] = True
                continue
            last = self._last_start.get(uuid)
            if last is not None and self._clock() - last < self.config.restart_backoff_seconds:
                state[uuid] = False
                continue
            state[uuid] = self.start(uuid) and self.running(uuid)
        return state

    def stop(self) -> None:
        """Tell every daemon to quit (running clients finish first)."""
        for uuid in self._uuids():
            self._control(uuid, [], "quit\n")

    def run(self, stop: threading.Event) -> None:
        """Check every interval until ``stop``, then stop the daemons."""
        while not stop.is_set():
            self.check()
            stop.wait(self.config.check_interval_seconds)
        self.stop()


def start_mps_daemons(config: MpsDaemonConfig, uuids: Callable[[], Sequence[str]],
                      stop: threading.Event) -> threading.Thread:
    """Supervise the daemons in a thread until ``stop``; the thread quits them at the end."""
    daemons = MpsDaemons(config, uuids)
    thread = threading.Thread(target=daemons.run, args=(stop,), name="mps-daemons",
                              daemon=True)
    thread.start()
    return thread
