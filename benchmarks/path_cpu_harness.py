"""The server side of ``serving_path_cpu.py``: ``tandem ARGS`` in this process, its threads
counted (and profiled, with ``$TANDEM_PATH_CPU_PROFILE``) from start-up, and a window
marked by two SIGUSR1s, whose profile and thread names go to ``$TANDEM_PATH_CPU_OUT``.

Run from the server's checkout (its working directory), whatever checkout this file is
in: it imports nothing of the project before ``serve`` puts that checkout first.
"""

from __future__ import annotations

import cProfile
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

OUT_ENV = "TANDEM_PATH_CPU_OUT"
PROFILE_ENV = "TANDEM_PATH_CPU_PROFILE"
_ROLES = (("CP Server Thread", "http_workers"), ("tandem-http", "http_accept"),
          ("tandem-gpu", "executor_loop"), ("tandem-post", "post_processing"),
          ("MainThread", "main"))


def group(name: str) -> str:
    """A server thread's role from its Python name."""
    for prefix, role in _ROLES:
        if name.startswith(prefix):
            return role
    return "other"


_profilers: dict[int, cProfile.Profile] = {}
_marks: list[dict[str, tuple[int, float, float]]] = []


_started: dict[str, int] = {}


def _watched_threads(profile: bool) -> None:
    """Every thread started from now on is counted by role (threads that end in the
    window are not in ``/proc`` at its end) and, if ``profile``, runs under its own
    profiler (CPU clock)."""
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def inner(self: threading.Thread) -> None:
        role = group(self.name)
        _started[role] = _started.get(role, 0) + 1
        if profile:
            profiler = cProfile.Profile(time.thread_time)
            _profilers[threading.get_native_id()] = profiler
            profiler.enable()
        bootstrap(self)

    threading.Thread._bootstrap_inner = inner  # type: ignore[attr-defined]


def _label(code: Any) -> str:
    if isinstance(code, str):
        return code
    name = code.co_filename.replace(os.getcwd() + "/", "")
    for marker in ("site-packages/", "lib/python3"):
        if marker in name:
            name = name.split(marker, 1)[1]
    return f"{name}:{code.co_firstlineno}({code.co_name})"


def _stats() -> dict[str, tuple[int, float, float]]:
    """Calls, own time and total time by function, over every profiled thread so far.
    ``getstats`` is one C call under the interpreter lock: no thread changes it meanwhile."""
    out: dict[str, tuple[int, float, float]] = {}
    for profiler in list(_profilers.values()):
        for entry in profiler.getstats():  # type: ignore[attr-defined]
            key = _label(entry.code)
            calls, own, total = out.get(key, (0, 0.0, 0.0))
            out[key] = (calls + entry.callcount, own + entry.inlinetime, total + entry.totaltime)
    return out


def _mark(*_: object) -> None:
    """SIGUSR1: the window's start, then its end; at the end the thread names (and the
    profile's difference) go to ``$TANDEM_PATH_CPU_OUT``."""
    _marks.append({**(_stats() if _profilers else {}),
                   **{f"threads started: {k}": (n, 0.0, 0.0) for k, n in _started.items()}})
    if len(_marks) < 2:
        return
    before, after = _marks[0], _marks[1]
    window = {k: (c - before.get(k, (0, 0.0, 0.0))[0], o - before.get(k, (0, 0.0, 0.0))[1],
                  t - before.get(k, (0, 0.0, 0.0))[2]) for k, (c, o, t) in after.items()}
    names = {t.native_id: t.name for t in threading.enumerate()}
    Path(os.environ[OUT_ENV]).write_text(json.dumps({
        "threads": names,
        "functions": {k: v for k, v in window.items() if (v[0] or v[1])
                      and not k.startswith("threads started")},
        "threads_started": {k.split(": ", 1)[1]: v[0] for k, v in window.items()
                            if k.startswith("threads started") and v[0]}}))


def serve(argv: list[str]) -> None:
    """``tandem`` with ``argv``, marked by SIGUSR1, its threads profiled if asked."""
    sys.path[0] = os.getcwd()  # the server's checkout, not this script's folder
    _watched_threads(bool(os.environ.get(PROFILE_ENV)))
    signal.signal(signal.SIGUSR1, _mark)
    from agent.inference.http import serve as serving
    from agent.inference.runtime.pathcost import RequestPathLimits
    from tandem.cli import main as tandem_main

    # No CPU or worker limit on the path: what is measured is its cost at the trio's
    # rates, not whether admission holds them on this host now.
    serving.path_limits = lambda options: RequestPathLimits(workers=1 << 20, cores=64.0)
    # Nor is the executor planned at the share of a core a busy host leaves it: the same
    # sessions are admitted whatever the host's load, so trees compare at one load.
    serving.executor_probe = lambda executor, config: None

    sys.argv = ["tandem", *argv]
    tandem_main()


if __name__ == "__main__":
    serve(sys.argv[1:])
