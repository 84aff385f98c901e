"""GPU health for ``ListAndWatch``, read from the node's GPU source (NVML or sim).

A GPU is unhealthy when the source lost it, when it left the inventory, or after
an XID that the GPU itself caused (application XIDs such as 13 or 43 do not
count, as in NVIDIA's own device plugin). Unhealthy is sticky until the plugin
restarts: a GPU that threw a fatal XID needs a reset, not another tenant.
"""

from __future__ import annotations

import logging
import threading

from agent.device_plugin.assign import APP_XIDS, Gpu
from agent.errors import GpuSourceError
from agent.node.gpus import GpuSource

log = logging.getLogger(__name__)


class HealthTracker:
    """The advertised GPUs and their health; ``poll`` refreshes, ``wait_change`` blocks."""

    def __init__(self, source: GpuSource, interval_seconds: float = 5.0) -> None:
        self._source = source
        self._interval = interval_seconds
        self._lock = threading.Condition()
        self._gpus: dict[str, Gpu] = {}
        self._broken: set[str] = set()
        self._xids: dict[str, int] = {}
        self._version = 0

    def gpus(self) -> dict[str, Gpu]:
        """UUID -> GPU, health included (what the last poll saw)."""
        with self._lock:
            return dict(self._gpus)

    def version(self) -> int:
        """A counter that moves whenever the advertised list changes."""
        with self._lock:
            return self._version

    def poll(self) -> None:
        """Read inventory and one sample; mark GPUs lost, gone or after a fatal XID."""
        try:
            inventory = {g.uuid: g for g in self._source.inventory()}
            sample = self._source.sample(self._interval)
        except GpuSourceError as err:
            log.warning("GPU source failed; every GPU is unhealthy", extra={"error": str(err)})
            self._update({u: Gpu(g.index, g.uuid, g.minor, False)
                          for u, g in self.gpus().items()})
            return
        broken = set(self._broken)
        for s in sample.gpus:
            uuid = s.info.uuid
            previous = self._xids.get(uuid)
            if s.xid_errors is not None:
                self._xids[uuid] = s.xid_errors
            fatal_xid = (previous is not None and s.xid_errors is not None
                         and s.xid_errors > previous and (s.last_xid or 0) not in APP_XIDS)
            if s.lost or fatal_xid:
                if uuid not in broken:
                    log.warning("GPU marked unhealthy", extra={
                        "gpu": s.info.index, "uuid": uuid, "lost": s.lost,
                        "last_xid": s.last_xid})
                broken.add(uuid)
        self._broken = broken
        known = dict(self.gpus())
        for uuid, info in inventory.items():
            known[uuid] = Gpu(info.index, uuid, None, True)
        self._update({u: Gpu(g.index, u, g.minor, u in inventory and u not in broken)
                      for u, g in known.items()})

    def _update(self, gpus: dict[str, Gpu]) -> None:
        with self._lock:
            if gpus != self._gpus:
                self._gpus = gpus
                self._version += 1
                self._lock.notify_all()

    def wait_change(self, seen_version: int, timeout_seconds: float) -> int:
        """Block until the version differs from ``seen_version`` (or timeout); the version."""
        with self._lock:
            self._lock.wait_for(lambda: self._version != seen_version, timeout_seconds)
            return self._version

    def wake(self) -> None:
        """Wake every waiter (used on shutdown)."""
        with self._lock:
            self._version += 1
            self._lock.notify_all()
