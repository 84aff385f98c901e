"""Assembles the device plugin from command-line values (``tandem agent device-plugin``)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.device_plugin.assign import share_ids
from agent.device_plugin.cdi import DEFAULT_DIRS, cdi_device_names
from agent.device_plugin.health import HealthTracker
from agent.device_plugin.mps import MpsHook, MpsSettings, Reservation
from agent.device_plugin.server import (
    DevicePluginRunner,
    DevicePluginService,
    Placements,
    PluginConfig,
    pod_resources_holding,
)
from agent.errors import ConfigError, StateError
from agent.node.extender_view import NodeView
from agent.node.gpus import GpuSource

log = logging.getLogger(__name__)


def placements_of(view: NodeView) -> Placements:
    """(namespace, name, uid, GPU index, GPU uuid, container, state) for every pod and GPU
    in the view."""
    return [(p.namespace, p.name, p.uid, g.index, g.uuid, p.container, p.state)
            for g in view.gpus for p in g.pods]


def reservations_of(view: NodeView) -> dict[str, Reservation]:
    """What the extender reserved per pod UID (memory and predicted utilisation per GPU)."""
    return {p.uid: Reservation(p.memory_mib, p.predicted_util_percent)
            for g in view.gpus for p in g.pods}


def mps_hook(settings: MpsSettings, fetch: Callable[[], NodeView]) -> MpsHook:
    """The Allocate hook for a node that runs MPS; reservations read fresh at each call,
    none when the extender cannot be reached (admission then fails with the reason)."""

    def current() -> dict[str, Reservation]:
        try:
            return reservations_of(fetch())
        except StateError as err:
            log.warning("extender state unavailable", extra={"error": str(err)})
            return {}

    return MpsHook(settings, current)


def fetching_placements(fetch: Callable[[], NodeView]) -> Callable[[], Placements]:
    """Placements fetched fresh from the extender at each call (Allocate is rare and must
    see a pod bound a moment ago); an unreachable extender gives none, so admission
    fails with a reason rather than guessing."""

    def current() -> Placements:
        try:
            return placements_of(fetch())
        except StateError as err:
            log.warning("extender state unavailable", extra={"error": str(err)})
            return []

    return current


def build_runner(config: PluginConfig, source: GpuSource, fetch: Callable[[], NodeView],
                 pod_resources_socket: Path, cdi_dirs: Sequence[Path],
                 stop: threading.Event, mps: MpsSettings | None = None) -> DevicePluginRunner:
    """The runner, wired to the extender's state, the kubelet's pod resources and CDI."""
    if config.shares_per_gpu < 1 or config.shares_per_gpu > 64:
        raise ConfigError(f"--shares {config.shares_per_gpu}: must be between 1 and 64")
    if not config.plugin_dir.is_dir():
        raise ConfigError(f"--plugin-dir {config.plugin_dir} is not a directory (mount the "
                          "kubelet's device-plugins directory)")
    service = DevicePluginService(
        config, HealthTracker(source, config.health_interval_seconds),
        fetching_placements(fetch),
        lambda: pod_resources_holding(pod_resources_socket, config.resource_name),
        lambda: cdi_device_names(cdi_dirs or DEFAULT_DIRS), stop,
        mps=mps_hook(mps, fetch) if mps is not None else None)
    return DevicePluginRunner(service, stop)


def device_listing(source: GpuSource, config: PluginConfig, cdi_dirs: Sequence[Path],
                   cdi_kind: str = "nvidia.com/gpu") -> dict[str, Any]:
    """What the plugin would advertise now: per GPU its health after one poll, its share
    devices and whether the node's CDI specs name it (else the device-node fallback).
    For checking a node by hand, e.g. beside ``nvidia-smi -L``."""
    tracker = HealthTracker(source, config.health_interval_seconds)
    tracker.poll()
    names = cdi_device_names(cdi_dirs or DEFAULT_DIRS)
    gpus = sorted(tracker.gpus().values(), key=lambda g: g.index)
    return {"node": config.node, "resource": config.resource_name,
            "shares_per_gpu": config.shares_per_gpu,
            "gpus": [{"index": g.index, "uuid": g.uuid, "healthy": g.healthy,
                      "devices": len(share_ids(g, config.shares_per_gpu)),
                      "cdi": f"{cdi_kind}={g.uuid}" in names} for g in gpus]}


def run_plugin(runner: DevicePluginRunner, stop: threading.Event) -> None:
    """Run until SIGTERM/SIGINT."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    log.info("device plugin started", extra={
        "node": runner.config.node, "resource": runner.config.resource_name,
        "shares_per_gpu": runner.config.shares_per_gpu, "socket": str(runner.socket)})
    runner.run()
    log.info("device plugin stopped", extra={"node": runner.config.node})
