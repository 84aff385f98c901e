"""The production server: cheroot (threaded WSGI, optional TLS) plus the reload loop."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cheroot import wsgi

from contracts.httpfront import direct_files, front_paths
from contracts.httpserve import harden, tls_adapter
from contracts.logs import get_logger
from extender.config.loader import ConfigHolder
from extender.config.sections import ServerConfig
from extender.scheduler_auth import SCHEDULING_PATHS

LISTEN_BACKLOG = 128
"""Pending connections the kernel queues before accept (cheroot's default is 5)."""


@dataclass
class RunningServer:
    """A started server: its bound port and a stop function."""

    server: wsgi.Server
    thread: threading.Thread
    port: int
    scheme: str

    @property
    def url(self) -> str:
        """Base URL on loopback."""
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        self.server.stop()
        self.thread.join(timeout=10)


def make_server(app: Any, cfg: ServerConfig, port: int | None = None) -> wsgi.Server:
    """A cheroot server for ``app``; TLS via the builtin adapter when cert and key are set."""
    server = wsgi.Server((cfg.host, cfg.port if port is None else port), app,
                         numthreads=cfg.threads, server_name="tandem-extender",
                         request_queue_size=LISTEN_BACKLOG)
    # Slow clients wait in the selector, not in a worker (contracts.httpserve).
    harden(server, cfg.request_read_timeout_seconds, cfg.max_body_bytes,
           lambda message, kind="": json.dumps({"Error": message}).encode())
    # The scheduler's verbs (three requests a pod) skip cheroot's request machinery;
    # every request is read and answered without _pyio files (contracts.httpfront).
    front_paths(direct_files(server), SCHEDULING_PATHS)
    if cfg.tls_cert_file and cfg.tls_key_file:
        server.ssl_adapter = tls_adapter(cfg.tls_cert_file, cfg.tls_key_file)
    return server


def start_background(app: Any, cfg: ServerConfig, port: int | None = None) -> RunningServer:
    """Bind (port 0 picks a free port) and serve in a daemon thread."""
    server = make_server(app, cfg, port)
    server.prepare()
    bound = server.bind_addr[1]
    thread = threading.Thread(target=server.serve, name="tandem-extender-http", daemon=True)
    thread.start()
    return RunningServer(server, thread, int(bound), "https" if server.ssl_adapter else "http")


def reload_loop(holder: ConfigHolder, stop: threading.Event,
                on_failure: Callable[[list[str]], None] | None = None) -> threading.Thread:
    """Poll the config file and swap in a valid new config; log rejected edits."""
    log = get_logger()

    def run() -> None:
        while not stop.wait(holder.current().reload_interval_seconds):
            problems = holder.reload_if_changed()
            if problems:
                log.warning("config reload rejected", extra={"problems": problems})
                if on_failure:
                    on_failure(problems)
            elif problems == []:
                log.info("config reloaded", extra={"path": holder.current().source_path})

    thread = threading.Thread(target=run, name="tandem-config-reload", daemon=True)
    thread.start()
    return thread
