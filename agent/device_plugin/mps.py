"""MPS enforcement at admission: each container gets its GPU's MPS pipe and a device
memory limit equal to what the extender reserved for its pod.

The MPS server refuses a client allocation past ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``,
so a job that grows past its reservation fails alone instead of taking its
neighbours' memory. Optionally ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps its SMs at
its predicted utilisation. The daemons (one per GPU) are the agent's
(``agent.node.mps``); a GPU whose daemon is not running refuses admission.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts import mps as layout

CONTAINER_PIPE = "/tmp/nvidia-mps"
"""Where a container sees its GPU's pipe directory (``CUDA_MPS_PIPE_DIRECTORY``)."""


@dataclass(frozen=True)
class Reservation:
    """What the extender reserved for a pod on each of its GPUs."""

    mem_mib: int | None
    util_percent: float | None


@dataclass(frozen=True)
class MpsSettings:
    """``--mps-root`` and the thread-percentage option of the device plugin."""

    root: Path = layout.DEFAULT_ROOT
    thread_percentage: bool = False
    """Also set ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` from the predicted utilisation."""
    min_thread_percentage: int = 10
    """Floor of that percentage, so a job predicted near 0% still runs."""


@dataclass(frozen=True)
class MpsGrant:
    """Environment and mounts for one container, or ``refusal`` (reason, message)."""

    envs: tuple[tuple[str, str], ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()
    """(container path, host path)."""
    refusal: tuple[str, str] | None = None


def mps_grant(settings: MpsSettings, uid: str, gpu_uuids: list[str],
              reservations: Mapping[str, Reservation],
              daemon_running: Callable[[Path], bool]) -> MpsGrant:
    """What a container of pod ``uid`` on ``gpu_uuids`` gets from MPS (pure but for the
    daemon check)."""
    if len(gpu_uuids) != 1:
        # A client connects to one MPS server; the daemons are per GPU.
        return MpsGrant()
    uuid = gpu_uuids[0]
    reserved = reservations.get(uid)
    if reserved is None or reserved.mem_mib is None or reserved.mem_mib < 1:
        return MpsGrant(refusal=("MpsLimitUnknown",
                                 f"the extender's state has no memory reservation for pod "
                                 f"{uid}; MPS needs one to set its limit"))
    pipe = layout.pipe_dir(settings.root, uuid)
    if not daemon_running(pipe):
        return MpsGrant(refusal=("MpsNotRunning",
                                 f"no MPS control daemon for GPU {uuid} ({pipe}); the node "
                                 "agent starts it with --mps"))
    envs = [("CUDA_MPS_PIPE_DIRECTORY", CONTAINER_PIPE),
            # device 0: the one GPU the container sees
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={reserved.mem_mib}M")]
    if settings.thread_percentage and reserved.util_percent is not None:
        share = max(settings.min_thread_percentage, math.ceil(reserved.util_percent))
        envs.append(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(min(100, share))))
    mounts = ((CONTAINER_PIPE, str(pipe)), ("/dev/shm", str(layout.shm_dir(settings.root))))
    return MpsGrant(envs=tuple(envs), mounts=mounts)


def control_pipe_exists(pipe: Path) -> bool:
    """Whether the control daemon's pipe is there (it removes it when it quits)."""
    return (pipe / layout.CONTROL_PIPE).exists()


class MpsHook:
    """Adds the MPS grant to an Allocate container response (the device plugin's hook)."""

    def __init__(self, settings: MpsSettings,
                 reservations: Callable[[], Mapping[str, Reservation]],
                 daemon_running: Callable[[Path], bool] = control_pipe_exists) -> None:
        self.settings = settings
        self._reservations, self._running = reservations, daemon_running

    def apply(self, container: Any, uid: str, gpu_uuids: list[str]) -> tuple[str, str] | None:
        """Fill ``container`` (a ContainerAllocateResponse); the refusal, if any."""
        given = mps_grant(self.settings, uid, gpu_uuids, self._reservations(), self._running)
        if given.refusal is not None:
            return given.refusal
        container.envs.update(dict(given.envs))
        for container_path, host_path in given.mounts:
            container.mounts.add(container_path=container_path, host_path=host_path,
                                 read_only=False)
        return None
