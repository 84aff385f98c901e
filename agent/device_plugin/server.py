"""The ``tandem.io/gpu`` device plugin: gRPC on the kubelet's plugin socket directory.

Life cycle (kubelet device plugin API v1beta1):

1. serve ``DevicePlugin`` on ``<plugin dir>/tandem-gpu.sock``;
2. ``Register`` with the kubelet on ``<plugin dir>/kubelet.sock`` (resource name,
   endpoint, options: preferred allocation on, no PreStartContainer);
3. ``ListAndWatch`` streams ``shares`` devices per GPU (the co-location limit), each
   Healthy or Unhealthy (:mod:`agent.device_plugin.health`);
4. ``Allocate`` hands the container the GPUs the extender bound its pod to
   (:mod:`agent.device_plugin.assign`), or fails admission with the reason;
5. when the kubelet restarts it wipes the directory: our socket disappears (or
   ``kubelet.sock`` is a new file), and the plugin serves and registers again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agent.device_plugin import assign
from agent.device_plugin import protocol as api
from agent.device_plugin.health import HealthTracker
from agent.device_plugin.mps import MpsHook
from contracts.annotations import GPU_RESOURCE

log = logging.getLogger(__name__)

Placements = Iterable[assign.Row]


@dataclass(frozen=True)
class PluginConfig:
    """Where and what the plugin serves."""

    node: str
    plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    socket_name: str = "tandem-gpu.sock"
    resource_name: str = GPU_RESOURCE
    shares_per_gpu: int = 8
    health_interval_seconds: float = 5.0
    assignment_retry_seconds: float = 2.0
    """How long Allocate waits for the extender's state to show a pod bound a moment ago."""


class DevicePluginService(api.DevicePluginServicer):
    """The ``v1beta1.DevicePlugin`` handlers; state comes in through callables."""

    def __init__(self, config: PluginConfig, health: HealthTracker,
                 placements: Callable[[], Placements],
                 holding: Callable[[], dict[str, set[str]]],
                 cdi_names: Callable[[], set[str]],
                 stop: threading.Event,
                 sleep: Callable[[float], None] = time.sleep,
                 mps: MpsHook | None = None) -> None:
        self.config, self.health = config, health
        self._mps = mps  # where the node runs MPS: pipe and memory limit per container
        self._placements, self._holding, self._cdi = placements, holding, cdi_names
        self._stop, self._sleep = stop, sleep
        self._granted: dict[str, set[str]] = {}
        """Containers this plugin handed GPUs, per pod UID (beside the kubelet's record)."""
        self._granted_lock = threading.Lock()

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        """Preferred allocation is answered; PreStartContainer is not needed."""
        return api.DevicePluginOptions(pre_start_required=False,
                                       get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        """The device list now, then again whenever a GPU's health changes."""
        seen = -1
        while not self._stop.is_set() and (context is None or context.is_active()):
            version = self.health.version()
            if version != seen:
                seen = version
                yield self._device_list()
            self.health.wait_change(seen, 1.0)

    def _device_list(self) -> Any:
        response = api.ListAndWatchResponse()
        for gpu in sorted(self.health.gpus().values(), key=lambda g: g.index):
            for device_id in assign.share_ids(gpu, self.config.shares_per_gpu):
                response.devices.add(ID=device_id,
                                     health=api.HEALTHY if gpu.healthy else api.UNHEALTHY)
        return response

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        """Prefer shares of the GPUs the pending pod of that size was bound to."""
        response = api.PreferredAllocationResponse()
        pods = self._candidates()
        for req in request.container_requests:
            # A pod of N GPUs asks for N shares, one per GPU.
            picked = assign.choose(pods, req.allocation_size, self.config.node)
            target = [g.uuid for g in picked.gpus] if isinstance(picked, assign.Candidate) else []
            response.container_responses.add(deviceIDs=assign.preferred(
                list(req.available_deviceIDs), list(req.must_include_deviceIDs),
                req.allocation_size, target))
        return response

    def Allocate(self, request: Any, context: Any) -> Any:
        """Each container gets the GPUs the extender bound for it, or admission fails."""
        response = api.AllocateResponse()
        for req in request.container_requests:
            unknown = assign.unadvertised(req.devices_ids, self.health.gpus(),
                                          self.config.shares_per_gpu)
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"tandem UnknownDevice: {', '.join(unknown[:8])} "
                              "not advertised by this plugin")
            count = len(req.devices_ids)
            pod = self._find(count)
            if isinstance(pod, assign.Refusal):
                log.warning("allocation refused", extra={"reason": pod.reason,
                                                         "detail": pod.message})
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"tandem {pod.reason}: {pod.message}")
            sick = [r for r in (assign.unhealthy_reason(g) for g in pod.gpus) if r]
            if sick:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"tandem Unhealthy: {'; '.join(sick)}")
            given = assign.grant(pod, self._cdi())
            container = response.container_responses.add()
            for name in given.cdi_devices:
                container.cdi_devices.add(name=name)
            for path in given.device_nodes:
                container.devices.add(container_path=path, host_path=path, permissions="rw")
            container.envs.update(dict(given.envs))
            container.annotations.update(dict(given.annotations))
            refused = self._mps and self._mps.apply(container, pod.uid,
                                                    [g.uuid for g in pod.gpus])
            if refused:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"tandem {refused[0]}: {refused[1]}")
            with self._granted_lock:
                self._granted.setdefault(pod.uid, set()).add(pod.container or "")
            log.info("allocated", extra={"pod": pod.key, "uid": pod.uid,
                                         "container": pod.container,
                                         "gpus": [g.uuid for g in pod.gpus],
                                         "cdi": bool(given.cdi_devices),
                                         "share_ids": sorted(req.devices_ids)})
        return response

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        """Not requested in the options; answered empty for a kubelet that calls anyway."""
        return api.PreStartContainerResponse()

    def _candidates(self) -> list[assign.Candidate]:
        try:
            holding = self._holding()
        except PodResourcesUnavailable:
            holding = {}
        rows = list(self._placements())
        placed = {row[2] for row in rows}
        with self._granted_lock:
            for uid in [u for u in self._granted if u not in placed]:
                del self._granted[uid]  # the pod is gone: keep this bounded
            granted = {uid: set(c) for uid, c in self._granted.items()}
        return assign.candidates(rows, self.health.gpus(), holding, granted)

    def _find(self, count: int) -> assign.Candidate | assign.Refusal:
        """Choose the pod; a pod bound a moment ago may not be in the state yet: retry."""
        deadline = time.monotonic() + self.config.assignment_retry_seconds
        while True:
            pod = assign.choose(self._candidates(), count, self.config.node)
            if not isinstance(pod, assign.Refusal) or pod.reason != "NoAssignment" or \
                    time.monotonic() >= deadline:
                return pod
            self._sleep(0.2)


class PodResourcesUnavailable(Exception):
    """The kubelet's pod resources API cannot be reached."""


def pod_resources_holding(socket: Path, resource: str,
                          timeout_seconds: float = 2.0) -> dict[str, set[str]]:
    """``namespace/name`` -> the containers holding ``resource`` devices (kubelet's List)."""
    if not socket.exists():
        raise PodResourcesUnavailable(f"{socket} does not exist")
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        try:
            listing = api.PodResourcesListerStub(channel).List(
                api.ListPodResourcesRequest(), timeout=timeout_seconds)
        except grpc.RpcError as err:
            raise PodResourcesUnavailable(f"List: {err.code()}") from None
    holding: dict[str, set[str]] = {}
    for pod in listing.pod_resources:
        names = {c.name for c in pod.containers
                 if any(d.resource_name == resource and d.device_ids for d in c.devices)}
        if names:
            holding[f"{pod.namespace}/{pod.name}"] = names
    return holding


class DevicePluginRunner:
    """Serves the plugin, registers it, and starts over when the kubelet restarts."""

    def __init__(self, service: DevicePluginService, stop: threading.Event) -> None:
        self.service, self._stop = service, stop
        self.config = service.config
        self.registrations = 0

    @property
    def socket(self) -> Path:
        """The plugin's own socket."""
        return self.config.plugin_dir / self.config.socket_name

    def _serve(self) -> grpc.Server:
        if self.socket.exists():
            self.socket.unlink()  # a stale socket from a previous run
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api.add_device_plugin_to_server(self.service, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        return server

    def _register(self) -> None:
        kubelet = self.config.plugin_dir / api.KUBELET_SOCKET
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            request = api.RegisterRequest(
                version=api.API_VERSION, endpoint=self.config.socket_name,
                resource_name=self.config.resource_name,
                options=api.DevicePluginOptions(get_preferred_allocation_available=True))
            api.RegistrationStub(channel).Register(request, timeout=5.0)
        self.registrations += 1
        log.info("registered with the kubelet", extra={
            "resource": self.config.resource_name, "socket": str(self.socket),
            "registrations": self.registrations})

    def _kubelet_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.config.plugin_dir / api.KUBELET_SOCKET)
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    def run(self) -> None:
        """Poll health, serve and register; again after every kubelet restart, until stop."""
        server: grpc.Server | None = None
        kubelet: tuple[int, int] | None = None
        try:
            while not self._stop.is_set():
                self.service.health.poll()
                current = self._kubelet_id()
                if server is not None and (not self.socket.exists() or current != kubelet):
                    log.info("kubelet restarted or socket removed: registering again")
                    server.stop(grace=1.0).wait()
                    server = None
                if server is None and current is not None:
                    try:
                        server = self._serve()
                        self._register()
                        kubelet = current
                    except (grpc.RpcError, OSError) as err:
                        log.warning("registration failed; retrying",
                                    extra={"error": type(err).__name__})
                        if server is not None:
                            server.stop(grace=0).wait()
                        server = None
                self._stop.wait(min(self.config.health_interval_seconds, 1.0)
                                if server is None else self.config.health_interval_seconds)
        finally:
            self._stop.set()
            self.service.health.wake()
            if server is not None:
                server.stop(grace=1.0).wait()
            if self.socket.exists():
                self.socket.unlink()

