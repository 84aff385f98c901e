"""Leadership: at most one extender replica binds pods at a time.

Two topologies need two ways of knowing who leads (docs/deploy.md):

- **Sidecar** (default install): the extender runs beside its own kube-scheduler,
  and that scheduler already runs leader election on a ``coordination.k8s.io/v1``
  Lease whose ``holderIdentity`` is ``<hostname>_<uuid>``. Only the leading
  scheduler calls its sidecar, so :class:`LeaseFollower` merely *reads* that Lease
  and reports leadership when the holder's hostname is ours (both containers of a
  pod share the pod's hostname).
- **Standalone** (an existing kube-scheduler calls an extender Deployment with
  several replicas): :class:`LeaseElector` runs its own election with the same
  rules as client-go's ``leaderelection`` package, so one replica binds.

Both implement :class:`Leadership` (``is_leader()``), which the server's
``may_bind`` hook calls; :class:`AlwaysLeader` serves a single replica and
``sim:`` clusters. :class:`PodLabeler` marks the leader's pod so that the
Services route agent reports (and standalone scheduler calls) to it;
:func:`build_leadership` wires a mode to all of these. The elector and the
follower, and how expiry is judged, are :mod:`extender.ha.election`; the Lease
record and the calls on it are :mod:`extender.ha.lease`.

Errors::

    LeaderError
     ├── LeaderConfigError    invalid timings or identity (caller: fix the config)
     └── LeaseApiError        the API call failed (caller: retry next period)
          └── LeaseConflict   someone else wrote first (caller: lost this round)
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from extender.ha.election import (
    LeaderConfigError,
    LeaderElectionConfig,
    LeaseElector,
    LeaseFollower,
)
from extender.ha.lease import KubeLeaseApi, LeaderError

_log = logging.getLogger("tandem.leader")

# Pod label that the Services in front of the extender select on.
LEADER_LABEL = "tandem.io/leader"


class Leadership(Protocol):
    """Answers whether this replica may bind pods now."""

    def is_leader(self) -> bool:
        """True while this replica is the single active binder."""
        ...


class AlwaysLeader:
    """Leadership for a single replica or a simulated cluster: always leads."""

    def is_leader(self) -> bool:
        """Always true."""
        return True


class PodLabeler:
    """Keeps the label ``tandem.io/leader=true`` on our own pod exactly while we lead.

    The Services in front of the extender select this label, so agent reports
    (and, standalone, the scheduler's calls) reach only the active binder.
    Readiness cannot carry leadership instead: a Deployment whose standby is
    never Ready cannot roll out, and its PodDisruptionBudget blocks node drains.
    """

    def __init__(self, core_api: Any, namespace: str, pod_name: str) -> None:
        self._api = core_api
        self._namespace = namespace
        self._pod = pod_name
        self._applied: bool | None = None

    def sync(self, leading: bool) -> None:
        """Patch the label if it differs from ``leading``; failures retry on the next call."""
        if leading == self._applied:
            return
        # A JSON merge patch with null deletes the label.
        body = {"metadata": {"labels": {LEADER_LABEL: "true" if leading else None}}}
        try:
            self._api.patch_namespaced_pod(self._pod, self._namespace, body)
        except Exception as exc:
            _log.warning(
                "leader label patch failed",
                extra={"pod": self._pod, "error": type(exc).__name__},
            )
            return
        self._applied = leading


class LeadershipLoop:
    """Runs ``step()`` every period on a daemon thread until stopped."""

    def __init__(
        self,
        step: Callable[[], bool],
        period_seconds: float,
        on_result: Callable[[bool], None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        if period_seconds <= 0:
            raise LeaderConfigError(["period_seconds: must be > 0"])
        self._step = step
        self._period = period_seconds
        self._on_result = on_result
        self._on_stop = on_stop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-leader", daemon=True)

    def start(self) -> None:
        """Start stepping in the background."""
        self._thread.start()

    def stop(self, timeout_seconds: float = 5.0) -> None:
        """Stop the loop, then run ``on_stop`` (e.g. release the Lease)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_seconds)
        if self._on_stop is not None:
            self._on_stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                leading = self._step()
                if self._on_result is not None:
                    self._on_result(leading)
            except LeaderError:
                _log.exception("leadership step failed")
            self._stop.wait(self._period)


LEADERSHIP_MODES = ("single", "follow-scheduler", "elect")


def build_leadership(
    mode: str,
    *,
    namespace: str,
    pod_name: str,
    hostname: str,
    lease_name: str,
    coordination_api: Any = None,
    core_api: Any = None,
    monotonic: Callable[[], float] = time.monotonic,
    period_seconds: float = 2.0,
) -> tuple[Leadership, LeadershipLoop | None]:
    """The leadership for ``mode`` and the (not yet started) loop that maintains it.

    ``single``: one replica, always leads, no loop. ``follow-scheduler``: the
    sidecar topology, reads kube-scheduler's Lease ``lease_name``. ``elect``: the
    standalone topology, elects on ``lease_name`` with identity
    ``<hostname>_<uuid>`` like kube-scheduler.
    """
    if mode not in LEADERSHIP_MODES:
        raise LeaderConfigError([f"mode: {mode!r} not one of {', '.join(LEADERSHIP_MODES)}"])
    if mode == "single":
        return AlwaysLeader(), None
    if coordination_api is None or core_api is None:
        raise LeaderConfigError([f"mode {mode!r} needs the Kubernetes API clients"])
    leases = KubeLeaseApi(coordination_api)
    labeler = PodLabeler(core_api, namespace, pod_name)
    if mode == "follow-scheduler":
        follower = LeaseFollower(namespace, lease_name, hostname, leases, monotonic)
        loop = LeadershipLoop(
            follower.step, period_seconds, on_result=labeler.sync,
            on_stop=lambda: labeler.sync(False),
        )
        return follower, loop
    config = LeaderElectionConfig(
        namespace=namespace, name=lease_name, identity=f"{hostname}_{uuid.uuid4()}",
        retry_period_seconds=period_seconds,
    )
    elector = LeaseElector(config, leases, monotonic)

    def stop() -> None:
        elector.release()
        labeler.sync(False)

    return elector, LeadershipLoop(
        elector.step, period_seconds, on_result=labeler.sync, on_stop=stop
    )
