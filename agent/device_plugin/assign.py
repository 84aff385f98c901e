"""Which pod the kubelet is admitting, and what its container gets: pure decisions.

The kubelet's ``Allocate`` names device IDs but not the pod. tandem's answer does
not depend on which share IDs the kubelet picked: the GPUs a container gets are the
ones the extender bound the pod to, read from the extender's own ledger
(``GET /v1/state``), never from an annotation a pod owner could edit.

Finding the pod (the race, and how it is closed):

1. Candidates are the pods the extender placed on this node that hold no
   ``tandem.io/gpu`` devices yet, according to the kubelet's pod resources API
   (``List``) — pods already running are excluded by the kubelet's own record.
2. Of those, the ones whose GPU count equals the number of devices requested.
3. Exactly one GPU assignment among them: that is the answer (two pods with the
   same GPUs get the same answer, so it does not matter which one is admitted).
4. Several different assignments: the plugin cannot know which pod the kubelet
   is admitting, and refuses (``Ambiguous``) rather than hand over a GPU the
   extender did not bind. The extender prevents this state in the first place:
   with ``handoff.mode: device-plugin`` it binds at most one pod per node whose
   hand-off is pending (docs/deploy.md, "GPU hand-off").

A pod with no candidate (bound by another scheduler, or the extender does not
know it) fails admission with a reason instead of getting a random GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from contracts.annotations import GPU_UUID, PREFIX
from contracts.gpus import GpuRef, find_gpus

SHARE_SEPARATOR = "::"
POD_UID_NOTE = PREFIX + "pod-uid"
"""Runtime annotation on the container: the pod the GPU was handed to."""
APP_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs caused by an application, not the GPU (NVIDIA's device plugin skips the same)."""


@dataclass(frozen=True)
class Gpu(GpuRef):
    """One physical GPU as the plugin advertises it (identity, device minor, health)."""

    minor: int | None = None
    healthy: bool = True


@dataclass(frozen=True)
class Candidate:
    """A pod the extender placed on this node (``key``: namespace/name), GPUs by index."""

    key: str
    uid: str
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class Refusal:
    """Why admission must fail; ``reason`` is one stable word, ``message`` the detail."""

    reason: str
    message: str


def share_ids(gpu: Gpu, shares: int) -> list[str]:
    """The device IDs advertised for ``gpu``: one per co-location slot."""
    return [f"{gpu.uuid}{SHARE_SEPARATOR}{k}" for k in range(shares)]


def uuid_of(device_id: str) -> str:
    """The GPU UUID a share ID belongs to."""
    return device_id.split(SHARE_SEPARATOR, 1)[0]


def candidates(placements: Iterable[tuple[str, str, str, int, str | None]],
               inventory: Mapping[str, Gpu],
               holding: set[str]) -> list[Candidate]:
    """Pods placed here and holding no devices yet.

    ``placements``: (namespace, name, uid, gpu index, gpu uuid) per pod and GPU, as
    the extender's state lists them; ``holding``: ``namespace/name`` of pods the
    kubelet already gave ``tandem.io/gpu`` devices.
    """
    by_uid: dict[str, tuple[str, list[Gpu]]] = {}
    have = list(inventory.values())
    for namespace, name, uid, index, uuid in placements:
        key = f"{namespace}/{name}"
        # The plugin's inventory is NVML's: every GPU with its real UUID (complete).
        found = find_gpus([GpuRef(index, uuid or "")], have, complete=True)
        if key in holding or found is None:
            continue
        gpu = have[found[0]]
        gpus = by_uid.setdefault(uid, (key, []))[1]
        if gpu not in gpus:
            gpus.append(gpu)
    return sorted((Candidate(key, uid, tuple(sorted(gpus, key=lambda g: g.index)))
                   for uid, (key, gpus) in by_uid.items()), key=lambda c: c.key)


def choose(pods: Sequence[Candidate], device_count: int, node: str) -> Candidate | Refusal:
    """The pod being admitted for ``device_count`` devices, or why it cannot be told."""
    matching = [p for p in pods if len(p.gpus) == device_count]
    if not matching:
        waiting = ", ".join(f"{p.key} ({len(p.gpus)})" for p in pods) or "none"
        return Refusal("NoAssignment",
                       f"no pod the tandem extender placed on {node} is waiting for "
                       f"{device_count} GPU(s) (waiting: {waiting}); pods that request "
                       "tandem.io/gpu must be scheduled by tandem (schedulerName: tandem)")
    assignments = {tuple(g.uuid for g in p.gpus) for p in matching}
    if len(assignments) > 1:
        return Refusal("Ambiguous",
                       f"{len(matching)} pods on {node} wait for {device_count} GPU(s) on "
                       f"different GPUs ({', '.join(p.key for p in matching)}); refusing "
                       "rather than handing over a GPU the extender did not bind")
    return matching[0]


def unhealthy_reason(gpu: Gpu) -> str | None:
    """Why ``gpu`` must not be handed out, or None."""
    return None if gpu.healthy else f"GPU {gpu.index} ({gpu.uuid}) is unhealthy"


def preferred(available: Sequence[str], must_include: Sequence[str], size: int,
              target: Sequence[str]) -> list[str]:
    """``size`` share IDs: the must-include ones, then shares of the ``target`` GPUs
    (one per GPU first, so a multi-GPU pod's count spreads like its assignment),
    then the rest, each group in a stable order."""
    chosen = list(dict.fromkeys(must_include))[:size]
    rest = [d for d in sorted(available) if d not in chosen]
    on_target = [d for d in rest if uuid_of(d) in set(target)]
    seen: set[str] = {uuid_of(d) for d in chosen}
    first_per_gpu = []
    for d in on_target:
        if uuid_of(d) not in seen:
            seen.add(uuid_of(d))
            first_per_gpu.append(d)
    ordered = first_per_gpu + [d for d in on_target if d not in first_per_gpu] + \
        [d for d in rest if d not in on_target]
    return chosen + ordered[: max(0, size - len(chosen))]


@dataclass(frozen=True)
class ContainerGrant:
    """What the container gets: CDI names, or device nodes, mounts and environment."""

    cdi_devices: tuple[str, ...] = ()
    device_nodes: tuple[str, ...] = ()
    envs: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()


CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def grant(pod: Candidate, cdi_names: set[str], cdi_kind: str = "nvidia.com/gpu") -> ContainerGrant:
    """CDI device names where the node's CDI spec has every GPU of the pod; otherwise
    the GPUs' device nodes plus ``NVIDIA_VISIBLE_DEVICES`` set by the plugin (the
    kubelet, not the pod owner, sets it, so a hardened runtime may accept it)."""
    uuids = [g.uuid for g in pod.gpus]
    notes = ((POD_UID_NOTE, pod.uid), (GPU_UUID, ",".join(uuids)))
    wanted = [f"{cdi_kind}={u}" for u in uuids]
    if wanted and all(name in cdi_names for name in wanted):
        # CUDA images set ENV NVIDIA_VISIBLE_DEVICES=all; a runtime in legacy mode would
        # add every GPU on top of the CDI devices. "void" leaves the container to CDI.
        return ContainerGrant(cdi_devices=tuple(wanted), annotations=notes,
                              envs=(("NVIDIA_VISIBLE_DEVICES", "void"),))
    nodes = tuple(f"/dev/nvidia{g.minor if g.minor is not None else g.index}"
                  for g in pod.gpus) + CONTROL_NODES
    envs = (("NVIDIA_VISIBLE_DEVICES", ",".join(uuids)),
            ("TANDEM_GPU_UUID", ",".join(uuids)))
    return ContainerGrant(device_nodes=nodes, envs=envs, annotations=notes)
