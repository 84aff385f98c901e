"""An inference server and a loopback WSGI host for the session proxy's tests and the
slow-clients benchmark: the real server app over a sim-executor runtime (``Upstream``,
whose ``restart()`` stands in for a server restart) and cheroot on port 0 (``Loopback``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cheroot import wsgi
from flask import Flask

from agent.inference.clock import MonotonicClock
from agent.inference.executors.executors import SimExecutor
from agent.inference.http.app import create_app
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from agent.session.proxy import session_request
from predictor.batching import BatchingProfile

SLO = session_request("default.web-abc12", "tiny", 0, slo_ms=2000, rate_rps=100)


def make_runtime(max_queue: int = 10_000) -> ServingRuntime:
    clock = MonotonicClock()
    profiles = {
        "tiny": BatchingProfile.linear("tiny", "sim", 0.01, 0.05, max_batch=32),
        "heavy": BatchingProfile.linear("heavy", "sim", 50.0, 100.0, max_batch=8),
    }
    runtime = ServingRuntime(SimExecutor(profiles, clock, "sim"), clock,
                             RuntimeConfig("sim", quantum_ms=1.0, max_queue=max_queue),
                             post_workers=1)
    runtime.start()
    return runtime


@dataclass
class Upstream:
    """The inference server; ``restart()`` replaces it with a fresh, empty one."""

    max_queue: int = 10_000
    runtime: ServingRuntime = field(init=False)
    app: Flask = field(init=False)
    posts: int = 0
    infer_environs: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.runtime = make_runtime(self.max_queue)
        self.app = create_app(self.runtime, max_body_bytes=1 << 20)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ["REQUEST_METHOD"] == "POST" and environ["PATH_INFO"] == "/v1/sessions":
            self.posts += 1
        if environ["PATH_INFO"].endswith("/infer"):
            self.infer_environs.append(dict(environ))
        return self.app(environ, start_response)

    def restart(self) -> None:
        self.runtime.stop()
        self.__post_init__()

    def names(self) -> list[str]:
        return [s["name"] for s in self.runtime.snapshot()["sessions"]]

    def entry(self, name: str) -> dict[str, Any]:
        return next(s for s in self.runtime.snapshot()["sessions"] if s["name"] == name)


class Loopback:
    """A WSGI app on loopback cheroot (port 0)."""

    def __init__(self, app: Any) -> None:
        self.server = wsgi.Server(("127.0.0.1", 0), app, numthreads=4)
        self.server.prepare()
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.bind_addr[1]}"

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(timeout=5)
