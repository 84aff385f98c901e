"""The explicit ``sim:FILE`` GPU source, for CI and the demo (never a silent fallback).

GPUs come from the same YAML as the extender's simulated cluster (``nodes: [{name,
gpus: [{product, memory_mib, count}]}]``); this node's entry is picked by name.
Load follows the jobs an injected provider says are placed on each GPU:
utilisation is the sum of their profiles capped at 100 % plus seeded Gaussian
noise, memory the sum of theirs capped at the GPU's total. Power and temperature
are simple linear functions of utilisation so dashboards have something to draw.

GPU keys and identities match the extender's sim source (``extender/sim_cluster.py``) so
reports line up with its inventory: ``product``, ``memory_mib``, ``count``, and on a
single-GPU entry ``index`` and ``uuid``; the default UUID is ``GPU-sim-NODE-INDEX``.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.errors import ConfigError
from agent.gpus import GpuInfo, GpuSample, NodeSample, ProcessSample


@dataclass(frozen=True)
class SimJob:
    """One pod's load on one simulated GPU."""

    gpu_index: int
    pod_uid: str
    utilization_percent: float
    memory_mib: int


JobProvider = Callable[[], Sequence[SimJob]]


@dataclass(frozen=True)
class SimGpuSpec:
    """One simulated GPU from the file."""

    index: int
    product: str
    memory_mib: int
    uuid: str
    power_idle_watts: float = 60.0
    power_max_watts: float = 300.0


def sim_gpu_uuid(node: str, index: int) -> str:
    """The UUID of simulated GPU ``index`` on ``node`` (the extender's sim scheme)."""
    return f"GPU-sim-{node}-{index}"


def true_load_factor(pod_uid: str, low: float = 0.6, high: float = 1.5) -> float:
    """A deterministic per-pod factor in [low, high): how far reality is from the prediction."""
    digest = hashlib.sha256(pod_uid.encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2.0**64
    return low + (high - low) * fraction


def sim_pid(pod_uid: str) -> int:
    """A stable fake PID for a simulated pod's process."""
    return 100_000 + int.from_bytes(hashlib.sha256(pod_uid.encode()).digest()[:4], "big") % 800_000


def load_sim_gpus(path: Path, node: str) -> tuple[SimGpuSpec, ...]:
    """Read ``node``'s GPUs from a simulated-cluster YAML file, with clear errors."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"sim file {path}: {err}") from err
    nodes = document.get("nodes") if isinstance(document, dict) else None
    if not isinstance(nodes, list):
        raise ConfigError(f"sim file {path}: expected a mapping with a 'nodes' list")
    names = [n.get("name") for n in nodes if isinstance(n, dict)]
    entry = next((n for n in nodes if isinstance(n, dict) and n.get("name") == node), None)
    if entry is None:
        known = ", ".join(map(str, names))
        raise ConfigError(f"sim file {path}: no node {node!r} (nodes: {known})")
    gpus: list[SimGpuSpec] = []
    for position, raw in enumerate(entry.get("gpus") or []):
        where = f"sim file {path}: nodes[{node}].gpus[{position}]"
        gpus.extend(_parse_gpu_entry(raw, where, node, len(gpus)))
    if len({g.index for g in gpus}) != len(gpus):
        raise ConfigError(f"sim file {path}: nodes[{node}]: GPU indices repeat")
    return tuple(sorted(gpus, key=lambda g: g.index))


_GPU_KEYS = {"product", "memory_mib", "count", "index", "uuid"}  # as the extender accepts


def _parse_gpu_entry(raw: Any, where: str, node: str, position: int) -> list[SimGpuSpec]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping")
    unknown = sorted(set(raw) - _GPU_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}")
    product, memory, count = raw.get("product"), raw.get("memory_mib"), raw.get("count", 1)
    if not isinstance(product, str) or not product:
        raise ConfigError(f"{where}.product: expected a non-empty string")
    if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
        raise ConfigError(f"{where}.memory_mib: expected a positive integer")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
        raise ConfigError(f"{where}.count: expected an integer in 1..64")
    given_uuid, given_index = raw.get("uuid"), raw.get("index")
    if given_uuid is not None and (count != 1 or not isinstance(given_uuid, str)):
        raise ConfigError(f"{where}.uuid: a string, only on an entry with count 1")
    if given_index is not None and (count != 1 or isinstance(given_index, bool)
                                    or not isinstance(given_index, int) or given_index < 0):
        raise ConfigError(f"{where}.index: a non-negative integer, only on an entry with count 1")
    if count == 1:
        index = position if given_index is None else given_index
        return [SimGpuSpec(index, product, memory, given_uuid or sim_gpu_uuid(node, index))]
    return [SimGpuSpec(position + k, product, memory, sim_gpu_uuid(node, position + k))
            for k in range(count)]


class SimGpuSource:
    """Simulated GPUs whose load follows the jobs placed on them."""

    def __init__(self, gpus: Sequence[SimGpuSpec], jobs: JobProvider, *, seed: int = 0,
                 noise_percent: float = 2.0, wall_clock: Callable[[], float] = time.time) -> None:
        self._gpus = tuple(gpus)
        self._jobs = jobs
        self._rng = random.Random(seed)
        self._noise = noise_percent
        self._clock = wall_clock

    def inventory(self) -> Sequence[GpuInfo]:
        """The simulated GPUs (``mig_mode`` is always false)."""
        return [
            GpuInfo(index=g.index, uuid=g.uuid, product=g.product, memory_total_mib=g.memory_mib)
            for g in self._gpus
        ]

    def sample(self, interval_seconds: float) -> NodeSample:
        """One round: per GPU the capped sum of its jobs' load, plus seeded noise."""
        by_gpu: dict[int, list[SimJob]] = {}
        for job in self._jobs():
            by_gpu.setdefault(job.gpu_index, []).append(job)
        samples = tuple(
            self._sample_gpu(info, spec, by_gpu.get(info.index, []))
            for info, spec in zip(self.inventory(), self._gpus, strict=True)
        )
        return NodeSample(self._clock(), interval_seconds, samples)

    def _sample_gpu(self, info: GpuInfo, spec: SimGpuSpec, jobs: list[SimJob]) -> GpuSample:
        load = min(100.0, sum(j.utilization_percent for j in jobs))
        if jobs:  # an idle GPU reads exactly 0, as NVML does
            load = min(100.0, max(0.0, load + self._rng.gauss(0.0, self._noise)))
        used = min(spec.memory_mib, sum(j.memory_mib for j in jobs))
        return GpuSample(
            info=info,
            memory_used_mib=used,
            utilization_percent=round(load, 2),
            memory_utilization_percent=round(load * 0.4, 2),
            power_watts=round(spec.power_idle_watts
                              + (spec.power_max_watts - spec.power_idle_watts) * load / 100, 1),
            temperature_c=int(30 + 0.4 * load),
            xid_errors=0,
            last_xid=0,
            processes=tuple(
                ProcessSample(pid=sim_pid(j.pod_uid), used_memory_mib=j.memory_mib,
                              pod_uid=j.pod_uid)
                for j in sorted(jobs, key=lambda j: j.pod_uid)
            ),
        )
