"""The Prometheus collector: dcgm-exporter names and labels, tandem metrics, exact values."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.node.exporter import AgentCollector, Observation
from agent.node.extender_view import parse_node_view
from agent.node.gpus import GpuInfo, GpuSample, NodeSample, ProcessSample

HOST = "gpu-node-1"
H100 = "NVIDIA H100 80GB HBM3"


def gpu(index: int, util: float | None, procs: tuple[ProcessSample, ...] = (),
        lost: bool = False) -> GpuSample:
    return GpuSample(info=GpuInfo(index, f"GPU-{index}", H100, 81559),
                     memory_used_mib=None if lost else 10240, utilization_percent=util,
                     memory_utilization_percent=None if lost else 12.0,
                     power_watts=None if lost else 250.5, temperature_c=None if lost else 41,
                     xid_errors=None if lost else 2, last_xid=None if lost else 79,
                     processes=procs, lost=lost)


SAMPLE = NodeSample(1.0, 1.0, (
    gpu(0, 60.0, (ProcessSample(1, 4096, "uid-a"), ProcessSample(2, 1024, "uid-a"))),
    gpu(1, 30.0, (ProcessSample(3, 2048, "uid-b"), ProcessSample(4, 512, "uid-c"),
                  ProcessSample(5, None))),
    gpu(2, None, lost=True),
))
VIEW = parse_node_view({"nodes": {HOST: {"gpus": [
    {"index": 0, "predicted_util": 40.0,
     "pods": [{"uid": "uid-a", "pod": "ml/train-a", "workload": "training"}]},
    {"index": 1, "predicted_util": 0.0,
     "pods": [{"uid": "uid-b", "pod": "serving/infer-b", "workload": "inference"}]},
]}}}, HOST)


def registry_for(observation: Observation | None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(AgentCollector(lambda: observation, HOST))
    return registry


def gpu_labels(index: int, pod: str = "", namespace: str = "") -> dict[str, str]:
    return {"gpu": str(index), "UUID": f"GPU-{index}", "modelName": H100, "Hostname": HOST,
            "pod": pod, "namespace": namespace}


def ids(index: int) -> dict[str, str]:
    return {"gpu": str(index), "UUID": f"GPU-{index}", "Hostname": HOST}


@pytest.mark.parametrize(("name", "labels", "value"), [
    pytest.param("DCGM_FI_DEV_GPU_UTIL", gpu_labels(0, "train-a", "ml"), 60.0,
                 id="util-single-pod-labelled"),
    pytest.param("DCGM_FI_DEV_GPU_UTIL", gpu_labels(1), 30.0, id="util-shared-gpu-no-pod"),
    pytest.param("DCGM_FI_DEV_MEM_COPY_UTIL", gpu_labels(1), 12.0, id="mem-copy-util"),
    pytest.param("DCGM_FI_DEV_FB_USED", gpu_labels(1), 10240.0, id="fb-used-mib"),
    pytest.param("DCGM_FI_DEV_FB_FREE", gpu_labels(1), 81559.0 - 10240.0, id="fb-free-mib"),
    pytest.param("DCGM_FI_DEV_POWER_USAGE", gpu_labels(1), 250.5, id="power-watts"),
    pytest.param("DCGM_FI_DEV_GPU_TEMP", gpu_labels(1), 41.0, id="temperature"),
    pytest.param("DCGM_FI_DEV_XID_ERRORS", gpu_labels(1), 79.0, id="xid-last-code"),
    pytest.param("tandem_gpu_xid_errors_total", ids(1), 2.0, id="xid-count"),
    pytest.param("tandem_gpu_up", ids(0), 1.0, id="up"),
    pytest.param("tandem_gpu_up", ids(2), 0.0, id="lost"),
    pytest.param("tandem_agent_gpu_observed_utilization_ratio", ids(0), 0.6, id="observed"),
    pytest.param("tandem_agent_gpu_predicted_utilization_ratio", ids(0), 0.4, id="predicted"),
    pytest.param("tandem_gpu_observed_to_predicted_utilization_ratio", ids(0), 1.5,
                 id="observed-over-predicted"),
    pytest.param("tandem_pod_gpu_memory_bytes",
                 {**ids(0), "pod_uid": "uid-a", "pod": "train-a", "namespace": "ml"},
                 5120.0 * 2**20, id="pod-memory-summed-over-processes"),
    pytest.param("tandem_pod_gpu_memory_bytes",
                 {**ids(1), "pod_uid": "uid-c", "pod": "", "namespace": ""},
                 512.0 * 2**20, id="pod-memory-unknown-name"),
    pytest.param("tandem_agent_gpu_source_up", {"Hostname": HOST}, 1.0, id="source-up"),
])
def test_sample_values(name: str, labels: dict[str, str], value: float) -> None:
    assert registry_for(Observation(SAMPLE, VIEW)).get_sample_value(name, labels) == value


@pytest.mark.parametrize(("name", "labels"), [
    pytest.param("DCGM_FI_DEV_GPU_UTIL", gpu_labels(2), id="lost-gpu-has-no-util"),
    pytest.param("DCGM_FI_DEV_POWER_USAGE", gpu_labels(2), id="lost-gpu-has-no-power"),
    pytest.param("tandem_gpu_observed_to_predicted_utilization_ratio", ids(1),
                 id="zero-prediction-no-ratio"),
    pytest.param("tandem_agent_gpu_predicted_utilization_ratio", ids(2), id="no-prediction"),
])
def test_unknown_values_are_not_exported(name: str, labels: dict[str, str]) -> None:
    assert registry_for(Observation(SAMPLE, VIEW)).get_sample_value(name, labels) is None


@pytest.mark.parametrize("observation", [
    pytest.param(None, id="before-first-sample"),
    pytest.param(Observation(None, VIEW), id="source-down"),
])
def test_source_down_exports_only_the_up_gauge(observation: Observation | None) -> None:
    registry = registry_for(observation)
    assert registry.get_sample_value("tandem_agent_gpu_source_up", {"Hostname": HOST}) == 0.0
    assert b"DCGM_FI_DEV" not in generate_latest(registry)


def test_without_extender_view_gpus_are_still_exported() -> None:
    registry = registry_for(Observation(SAMPLE, None))
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_UTIL", gpu_labels(0)) == 60.0
    assert registry.get_sample_value("tandem_agent_gpu_predicted_utilization_ratio", ids(0)) is None


def test_collector_reads_the_latest_value_at_scrape_time() -> None:
    current = [Observation(SAMPLE, VIEW)]
    registry = CollectorRegistry()
    registry.register(AgentCollector(lambda: current[0], HOST))
    labels = gpu_labels(0, "train-a", "ml")
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_UTIL", labels) == 60.0
    current[0] = Observation(NodeSample(2.0, 1.0, (gpu(0, 95.0, SAMPLE.gpus[0].processes),)),
                             VIEW)
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_UTIL", labels) == 95.0
