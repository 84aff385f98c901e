"""Which pod the kubelet is admitting, and what its container gets: pure decisions.

The kubelet's ``Allocate`` names device IDs but not the pod. tandem's answer does
not depend on which share IDs the kubelet picked: the GPUs a container gets are the
ones the extender bound the pod to, read from the extender's own ledger
(``GET /v1/state``), never from an annotation a pod owner could edit.

Finding the pod (the race, and how it is closed):

1. Candidates are the pods the extender placed on this node, each with its next
   container that holds no ``tandem.io/gpu`` devices yet, according to the
   kubelet's pod resources API (``List``, per container) and this plugin's own
   grants. The extender's state says which container gets which GPU (bind decides
   it: the containers, in order, take the pod's GPUs in index order); the kubelet
   admits containers in order and calls ``Allocate`` once per container, so a
   two-container pod's second ``Allocate`` is for its second container. Pods the
   extender lists as ``untrusted`` (bound without its decision) are never candidates.
2. Of those, the ones whose next container's GPU count equals the number of
   devices requested.
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
CONTAINER_NOTE = PREFIX + "container"
"""Runtime annotation on the container: the container the extender bound the GPUs for."""
APP_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs caused by an application, not the GPU (NVIDIA's device plugin skips the same)."""


@dataclass(frozen=True)
class Gpu(GpuRef):
    """One physical GPU as the plugin advertises it (identity, device minor, health)."""

    minor: int | None = None
    healthy: bool = True


@dataclass(frozen=True)
class Candidate:
    """A pod the extender placed on this node (``key``: namespace/name) and the GPUs, by
    index, of its container waiting for them (None: the extender named no container)."""

    key: str
    uid: str
    gpus: tuple[Gpu, ...]
    container: str | None = None


UNTRUSTED = "untrusted"
"""The ``/v1/state`` state of a pod bound without a decision the extender recorded."""
Row = tuple[str, str, str, int, "str | None", "str | None", str]
"""(namespace, name, uid, GPU index, GPU uuid, container, state) per pod and GPU."""


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


def candidates(placements: Iterable[Row], inventory: Mapping[str, Gpu],
               holding: Mapping[str, set[str]],
               granted: Mapping[str, set[str]] | None = None) -> list[Candidate]:
    """Each pod placed here with its next container that holds no devices yet.

    ``placements``: rows as the extender's state lists them (:data:`Row`); ``holding``:
    ``namespace/name`` -> the containers the kubelet already gave ``tandem.io/gpu``
    devices; ``granted``: pod UID -> the containers this plugin handed GPUs (the
    kubelet's record may lag). A pod whose rows name no container is one candidate
    until any of its containers holds devices.
    """
    pods: dict[str, tuple[str, dict[str | None, list[Gpu]]]] = {}
    have = list(inventory.values())
    for namespace, name, uid, index, uuid, container, state in placements:
        # The plugin's inventory is NVML's: every GPU with its real UUID (complete).
        found = find_gpus([GpuRef(index, uuid or "")], have, complete=True)
        if found is None or state == UNTRUSTED:
            continue
        gpu = have[found[0]]
        gpus = pods.setdefault(uid, (f"{namespace}/{name}", {}))[1].setdefault(container, [])
        if gpu not in gpus:
            gpus.append(gpu)
    out = []
    for uid, (key, containers) in pods.items():
        held = holding.get(key)
        if granted and uid in granted:
            held = (held or set()) | granted[uid]
        # Admission order: the containers took the pod's GPUs in index order.
        for container, gpus in sorted(containers.items(),
                                      key=lambda c: min(g.index for g in c[1])):
            if held is not None and (container is None or container in held):
                continue
            out.append(Candidate(key, uid, tuple(sorted(gpus, key=lambda g: g.index)),
                                 container))
            break
    return sorted(out, key=lambda c: c.key)


def choose(pods: Sequence[Candidate], device_count: int, node: str) -> Candidate | Refusal:
    """The pod being admitted for ``device_count`` devices, or why it cannot be told."""
    matching = [p for p in pods if len(p.gpus) == device_count]
    if not matching:
        waiting = ", ".join(f"{p.key}{'/' + p.container if p.container else ''} "
                            f"({len(p.gpus)})" for p in pods) or "none"
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


def unadvertised(device_ids: Iterable[str], inventory: Mapping[str, Gpu],
                 shares: int) -> list[str]:
    """The device IDs this plugin never advertised (for GPUs it has, ``shares`` each)."""
    known = {d for g in inventory.values() for d in share_ids(g, shares)}
    return sorted(d for d in device_ids if d not in known)


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
    notes = ((POD_UID_NOTE, pod.uid), (GPU_UUID, ",".join(uuids)),
             *(((CONTAINER_NOTE, pod.container),) if pod.container else ()))
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
