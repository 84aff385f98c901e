"""The explicit ``sim:FILE`` GPU source, for CI and the demo (never a silent fallback).

GPUs come from the simulated cluster file the extender reads (``--cluster sim:FILE``),
parsed by the one shared parser (``contracts/clusterfile.py``); this node's entry is
picked by name.
Load follows the jobs an injected provider says are placed on each GPU:
utilisation is the sum of their profiles capped at 100 % plus seeded Gaussian
noise, memory the sum of theirs capped at the GPU's total. Power and temperature
are simple linear functions of utilisation so dashboards have something to draw.

Because the extender builds its inventory from the same parse, GPU indices, UUIDs,
products and memory sizes in this source's reports match the extender's GPUs.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.errors import ConfigError
from agent.node.gpus import GpuInfo, GpuSample, NodeSample, ProcessSample
from contracts.clusterfile import ClusterFileError, SimNode, load_cluster_file


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


def true_load_factor(pod_uid: str, low: float = 0.6, high: float = 1.5) -> float:
    """A deterministic per-pod factor in [low, high): how far reality is from the prediction."""
    digest = hashlib.sha256(pod_uid.encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2.0**64
    return low + (high - low) * fraction


def sim_pid(pod_uid: str) -> int:
    """A stable fake PID for a simulated pod's process."""
    return 100_000 + int.from_bytes(hashlib.sha256(pod_uid.encode()).digest()[:4], "big") % 800_000


def load_sim_gpus(path: Path, node: str) -> tuple[SimGpuSpec, ...]:
    """``node``'s GPUs from a simulated cluster file; ``ConfigError`` naming every problem."""
    try:
        return sim_gpu_specs(load_cluster_file(path).node(node))
    except ClusterFileError as err:
        # The agent's CLI turns ConfigError into exit code 2; keep the parser's message.
        raise ConfigError(str(err)) from err


def sim_gpu_specs(node: SimNode) -> tuple[SimGpuSpec, ...]:
    """The simulated GPUs of one node of a parsed cluster file."""
    return tuple(SimGpuSpec(g.index, g.product, g.memory_mib, g.uuid) for g in node.gpus)


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
        demand = sum(j.utilization_percent for j in jobs)
        load = min(100.0, demand)
        if jobs:  # an idle GPU reads exactly 0, as NVML does
            load = min(100.0, max(0.0, load + self._rng.gauss(0.0, self._noise)))
        # Per-process samples as NVML gives them: each job's share of what the GPU did.
        share = load / demand if demand > 0 else 0.0
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
                              pod_uid=j.pod_uid,
                              utilization_percent=round(j.utilization_percent * share, 2))
                for j in sorted(jobs, key=lambda j: j.pod_uid)
            ),
        )
