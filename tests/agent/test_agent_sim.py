"""The explicit ``sim:FILE`` GPU source and the extender-state job provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import ConfigError
from agent.node.extender_view import PlacedJobs, ViewHolder, parse_node_view
from agent.node.gpus import GpuSource, parse_gpu_source
from agent.node.sim_gpus import (
    SimGpuSource,
    SimGpuSpec,
    SimJob,
    load_sim_gpus,
    sim_pid,
    true_load_factor,
)
from contracts.clusterfile import sim_gpu_uuid

DATA = Path(__file__).parents[1] / "data" / "agent"
H100 = SimGpuSpec(0, "H100", 81559, "GPU-a", power_idle_watts=50.0, power_max_watts=350.0)


def h100s(count: int) -> list[SimGpuSpec]:
    return [SimGpuSpec(i, "H100", 81559, f"GPU-{i}", 50.0, 350.0) for i in range(count)]


def test_load_picks_this_node_and_expands_counts() -> None:
    gpus = load_sim_gpus(DATA / "sim_cluster.yaml", "gpu-node-1")
    assert [(g.product, g.memory_mib) for g in gpus] == [
        ("NVIDIA-H100-80GB-HBM3", 81559), ("NVIDIA-H100-80GB-HBM3", 81559),
        ("NVIDIA-A100-SXM4-40GB", 40960)]
    assert [(g.index, g.uuid) for g in gpus] == [
        (0, "GPU-sim-gpu-node-1-0"), (1, "GPU-sim-gpu-node-1-1"), (2, "GPU-fixed-a100")]
    assert sim_gpu_uuid("n", 3) == "GPU-sim-n-3"  # the extender's sim scheme
    assert len(load_sim_gpus(DATA / "sim_cluster.yaml", "gpu-node-2")) == 8


# The file's rules are tested once, on the shared parser (test_contracts_clusterfile.py);
# here only what the agent adds: its node's lookup and the ConfigError its CLI exits on.
@pytest.mark.parametrize(("text", "where"), [
    pytest.param("nodes: [{name: n, gpus: [{product: X, memory_mib: 0}]}]",
                 "nodes[0].gpus[0].memory_mib", id="file-problem-with-its-path"),
    pytest.param("nodes: [{name: other, gpus: [{product: X, memory_mib: 1}]}]",
                 "no node 'n' (nodes: other)", id="unknown-node"),
    pytest.param("nodes: [unclosed", "not valid YAML", id="bad-yaml"),
])
def test_load_rejects_bad_files_with_the_path(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_sim_gpus(path, "n")
    assert where in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize(("text", "kind", "path"), [
    pytest.param("nvml", "nvml", None, id="nvml"),
    pytest.param("sim:/x/c.yaml", "sim", Path("/x/c.yaml"), id="sim"),
])
def test_parse_gpu_source(text: str, kind: str, path: Path | None) -> None:
    spec = parse_gpu_source(text)
    assert (spec.kind, spec.path) == (kind, path)


@pytest.mark.parametrize("text", ["sim:", "fake", "", "NVML"])
def test_parse_gpu_source_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_gpu_source(text)


def test_load_follows_jobs_sum_capped_with_noise() -> None:
    jobs = [SimJob(0, "a", 40.0, 1000), SimJob(0, "b", 30.0, 2000), SimJob(1, "c", 90.0, 500),
            SimJob(1, "d", 60.0, 500)]
    src = SimGpuSource(h100s(3), lambda: jobs, seed=7, noise_percent=0.0,
                       wall_clock=lambda: 5.0)
    g0, g1, idle = src.sample(1.0).gpus
    assert (g0.utilization_percent, g0.memory_used_mib) == (70.0, 3000)
    assert g1.utilization_percent == 100.0  # 150 % capped
    assert (idle.utilization_percent, idle.memory_used_mib, idle.processes) == (0.0, 0, ())
    assert g0.power_watts == 50.0 + 300.0 * 0.7
    assert [(p.pid, p.pod_uid, p.used_memory_mib) for p in g0.processes] == [
        (sim_pid("a"), "a", 1000), (sim_pid("b"), "b", 2000)]
    # Per-process samples: each job's share of what the GPU did (over-committed: scaled).
    assert [p.utilization_percent for p in g0.processes] == [40.0, 30.0]
    assert [p.utilization_percent for p in g1.processes] == [60.0, 40.0]


def test_noise_is_seeded_and_bounded() -> None:
    jobs = [SimJob(0, "a", 50.0, 10)]

    def series(seed: int) -> list[float | None]:
        src = SimGpuSource([H100], lambda: jobs, seed=seed, noise_percent=5.0)
        return [src.sample(1.0).gpus[0].utilization_percent for _ in range(50)]

    assert series(1) == series(1) != series(2)
    values = [v for v in series(1) if v is not None]
    assert 0.0 <= min(values) < 50.0 < max(values) <= 100.0


def test_memory_is_capped_at_the_gpu_total() -> None:
    src = SimGpuSource([H100], lambda: [SimJob(0, "a", 1.0, 90_000)], noise_percent=0.0)
    assert src.sample(1.0).gpus[0].memory_used_mib == 81559


def test_true_load_factor_is_deterministic_and_in_range() -> None:
    factors = [true_load_factor(f"uid-{k}") for k in range(200)]
    assert factors == [true_load_factor(f"uid-{k}") for k in range(200)]
    assert all(0.6 <= f < 1.5 for f in factors)
    assert max(factors) - min(factors) > 0.6  # spread: observed visibly diverges


def test_placed_jobs_apply_the_true_load_factor() -> None:
    state = {"nodes": {"gpu-node-1": {"gpus": [
        {"index": 0, "uuid": "GPU-a", "predicted_util": 70.0, "pods": [
            {"pod": "ns/p1", "uid": "u1", "state": "placed", "workload": "training",
             "util_percent": 40.0, "mem_mib": 2048.0},
            {"pod": "ns/p2", "uid": "u2", "state": "assumed", "workload": "training",
             "util_percent": 30.0, "mem_mib": 1024.0}]},
        {"index": 1, "pods": []}]}}}
    views = ViewHolder()
    provider = PlacedJobs(views)
    assert provider() == ()
    views.set(parse_node_view(state, "gpu-node-1"))
    assert provider() == (SimJob(0, "u1", 40 * true_load_factor("u1"), 2048),
                          SimJob(0, "u2", 30 * true_load_factor("u2"), 1024))


def test_sim_source_satisfies_the_protocol() -> None:
    assert isinstance(SimGpuSource([H100], list), GpuSource)
