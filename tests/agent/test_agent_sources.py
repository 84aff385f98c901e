"""One conformance suite run against every ``GpuSource`` (the real NVML one only on a GPU)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.node.gpus import GpuSource
from agent.node.nvml import NvmlGpuSource
from agent.node.sim_gpus import SimGpuSource, SimJob, load_sim_gpus
from lab.fakes.nvml import FakeNvml

DATA = Path(__file__).parents[1] / "data" / "agent"


def sim_source() -> GpuSource:
    jobs = [SimJob(0, "uid-a", 60.0, 2048)]
    return SimGpuSource(load_sim_gpus(DATA / "sim_cluster.yaml", "gpu-node-1"), lambda: jobs)


def fake_nvml_source() -> GpuSource:
    nvml = FakeNvml.from_json(json.loads((DATA / "nvml_two_gpus.json").read_text()))
    return NvmlGpuSource(nvml, wall_clock=lambda: 10.0)


SOURCES = [
    pytest.param(sim_source, id="sim"),
    pytest.param(fake_nvml_source, id="nvml-mocked"),
    pytest.param(NvmlGpuSource, id="nvml-real", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("make", SOURCES)
def test_source_conformance(make: Callable[[], GpuSource]) -> None:
    source = make()
    assert isinstance(source, GpuSource)
    inventory = list(source.inventory())
    assert inventory and len({g.index for g in inventory}) == len(inventory)
    for _ in range(2):  # the second read exercises the sample cursors
        sample = source.sample(1.0)
        assert [g.info for g in sample.gpus] == inventory
        for gpu in sample.gpus:
            assert gpu.info.uuid.startswith("GPU-")
            assert gpu.utilization_percent is None or 0.0 <= gpu.utilization_percent <= 100.0
            assert gpu.memory_used_mib is None or gpu.info.memory_total_mib is None \
                or 0 <= gpu.memory_used_mib <= gpu.info.memory_total_mib
            assert all(p.pid > 0 for p in gpu.processes)
    close = getattr(source, "close", None)
    if close is not None:
        close()
