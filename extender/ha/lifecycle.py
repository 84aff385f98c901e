"""Process lifecycle of ``tandem extender serve``: leadership wiring and graceful shutdown.

On SIGTERM the kubelet gives the pod ``terminationGracePeriodSeconds`` (30 s in
``manifests/``) before SIGKILL. The shutdown runs, in this order:

1. ``/readyz`` starts failing (:class:`Draining`), so the Service stops
   sending new agent reports and scheduler calls here;
2. the leadership loop stops, which releases our Lease (``elect``) and removes
   the ``tandem.io/leader`` pod label, so a standby takes over at once instead
   of after the Lease expires;
3. the HTTP server stops accepting and waits up to ``shutdown_timeout_seconds``
   (20 s, below the grace period) for in-flight requests: a bind that already
   passed ``may_bind`` completes, annotations and binding included.

Errors::

    LeadershipSetupError   missing pod identity or bad mode/lease (caller: exit 2)
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from contracts.logs import get_logger
from extender.cluster.namespace import own_namespace
from extender.ha.election import LeaderConfigError
from extender.ha.leader import LEADERSHIP_MODES, Leadership, LeadershipLoop, build_leadership

SHUTDOWN_TIMEOUT_SECONDS = 20.0
"""How long in-flight requests may run after SIGTERM (below the 30 s grace period)."""


class LeadershipSetupError(ValueError):
    """Leadership cannot be set up from the flags and environment given."""


class StoppableServer(Protocol):
    """What shutdown needs from the WSGI server (cheroot's ``wsgi.Server``)."""

    shutdown_timeout: float

    def stop(self) -> None:
        """Stop accepting, then wait up to ``shutdown_timeout`` for workers."""
        ...


class Draining:
    """A readiness check that fails once shutdown has begun."""

    __name__ = "not-draining"

    def __init__(self) -> None:
        self._event = threading.Event()

    def __call__(self) -> bool:
        """True while the process is not shutting down."""
        return not self._event.is_set()

    def begin(self) -> None:
        """Start failing readiness."""
        self._event.set()

    @property
    def active(self) -> bool:
        """True once shutdown began."""
        return self._event.is_set()


def kube_clients() -> tuple[Any, Any]:
    """(CoordinationV1Api, CoreV1Api) from in-cluster config, else the local kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoordinationV1Api(), client.CoreV1Api()


def setup_leadership(
    mode: str, lease_name: str | None, *, environ: Mapping[str, str] | None = None,
    hostname: Callable[[], str] = socket.gethostname,
    clients: Callable[[], tuple[Any, Any]] | None = None,
) -> tuple[Leadership, LeadershipLoop | None]:
    """Leadership for ``--leadership MODE`` in the install's namespace
    (``extender.cluster.namespace``) as pod ``POD_NAME``; loop not started.

    ``single`` needs nothing; the Lease modes need the downward-API variables the
    manifests set, a lease name, and the Kubernetes clients (built only then, so
    a ``sim:`` extender never touches a kubeconfig).
    """
    env = os.environ if environ is None else environ
    if mode not in LEADERSHIP_MODES:
        raise LeadershipSetupError(
            f"--leadership must be one of {', '.join(LEADERSHIP_MODES)}, got {mode!r}")
    if mode == "single":
        leadership, loop = build_leadership(mode, namespace="", pod_name="", hostname="",
                                            lease_name="")
        return leadership, loop
    if not env.get("POD_NAME"):
        raise LeadershipSetupError(
            f"--leadership={mode} needs POD_NAME (set from the downward API)")
    if not lease_name:
        raise LeadershipSetupError(f"--leadership={mode} needs --lease-name")
    coordination_api, core_api = (clients or kube_clients)()
    try:
        return build_leadership(
            mode, namespace=own_namespace(environ=env), pod_name=env["POD_NAME"],
            hostname=hostname(),
            lease_name=lease_name, coordination_api=coordination_api, core_api=core_api)
    except LeaderConfigError as exc:
        raise LeadershipSetupError(f"--leadership={mode}: {exc}") from None


@dataclass
class GracefulShutdown:
    """Runs the shutdown sequence once, however many signals arrive."""

    draining: Draining
    server: StoppableServer
    loop: LeadershipLoop | None
    stop_event: threading.Event
    shutdown_timeout_seconds: float = SHUTDOWN_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        self._once = threading.Lock()
        self._done = threading.Event()

    def run(self) -> None:
        """Fail readiness, give up leadership, then drain and stop the server."""
        if not self._once.acquire(blocking=False):
            return
        log = get_logger()
        self.draining.begin()
        log.info("shutting down: readiness failing")
        if self.loop is not None:
            self.loop.stop()
            log.info("shutting down: leadership released")
        self.stop_event.set()
        self.server.shutdown_timeout = self.shutdown_timeout_seconds
        self.server.stop()
        log.info("shutting down: server stopped")
        self._done.set()

    def on_signal(self, *_: object) -> None:
        """Signal handler: run the sequence off the signal frame.

        The handler interrupts the thread running cheroot's accept loop; stopping
        the server from inside that frame would wait on the loop it interrupted.
        """
        threading.Thread(target=self.run, name="tandem-shutdown", daemon=True).start()

    def wait(self, timeout_seconds: float | None = None) -> bool:
        """Block until the sequence finished; True if it did."""
        return self._done.wait(timeout_seconds)
