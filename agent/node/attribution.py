"""Map a host PID to its pod UID and container id through ``/proc/<pid>/cgroup``.

The agent runs with ``hostPID: true`` and reads the host's ``/proc`` (the root is
injectable, e.g. ``/host/proc``). Path shapes handled, anywhere in the cgroup path
(so nesting under kind's ``/docker/<id>/`` or ``kubelet.slice`` works):

==========================  ===============================================================
driver / runtime            example path
==========================  ===============================================================
systemd + containerd        ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-
                            pod6f1c_..._90ab.slice/cri-containerd-<64 hex>.scope``
systemd + containerd (v1)   ``/kubepods-besteffort-pod<uid_>.slice:cri-containerd:<64 hex>``
systemd + CRI-O             ``.../kubepods-pod<uid_>.slice/crio-<64 hex>.scope``
systemd + docker            ``.../docker-<64 hex>.scope``
cgroupfs (any runtime)      ``/kubepods/burstable/pod<uid>/<64 hex>``, ``/kubepods/pod<uid>/<id>``
==========================  ===============================================================

systemd slices spell the pod UID with underscores; it is returned with dashes.
CRI-O's ``crio-conmon-<id>.scope`` is the monitor, not the container: no
container id. cgroup v2 (``0::/path``) is preferred; under v1 the first line
that names a pod wins (every controller carries the same pod path).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:^|[/-])pod({_UID})(?:\.slice)?(?=/|:|$)")
_CONTAINER = re.compile(
    r"(?:/(?:cri-containerd|crio|docker|cri-o)-([0-9a-f]{64})\.scope"  # systemd scopes
    r"|:(?:cri-containerd|crio|docker):([0-9a-f]{64})"  # containerd systemd, v1 style
    r"|/([0-9a-f]{64}))(?:/|$)"  # cgroupfs
)


@dataclass(frozen=True)
class Attribution:
    """Which pod (and container) a process belongs to."""

    pod_uid: str
    container_id: str | None


def attribute_cgroup_path(path: str) -> Attribution | None:
    """Pod and container named by one cgroup path, or None outside any pod."""
    pod = _POD.search(path)
    if pod is None:
        return None
    tail = path[pod.end() :]
    container = _CONTAINER.search(tail)
    container_id = next((g for g in container.groups() if g), None) if container else None
    return Attribution(pod_uid=pod.group(1).replace("_", "-"), container_id=container_id)


def attribute_cgroup_file(text: str) -> Attribution | None:
    """Parse the content of ``/proc/<pid>/cgroup`` (v1 or v2 lines)."""
    v2_paths, v1_paths = [], []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        (v2_paths if hierarchy == "0" and controllers == "" else v1_paths).append(path)
    for path in v2_paths + v1_paths:
        found = attribute_cgroup_path(path)
        if found is not None:
            return found
    return None


class ProcAttributor:
    """Reads ``<proc_root>/<pid>/cgroup``; a vanished or unreadable PID gives None."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self._root = proc_root

    def attribute(self, pid: int) -> Attribution | None:
        """The pod of ``pid``, or None (not in a pod, gone, or no permission)."""
        try:
            text = (self._root / str(int(pid)) / "cgroup").read_text()
        except (OSError, ValueError):
            return None
        return attribute_cgroup_file(text)
