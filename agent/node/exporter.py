"""Prometheus view of the agent: a custom collector over the latest observation.

GPU gauges keep NVIDIA dcgm-exporter's names, units and labels (``gpu``, ``UUID``,
``modelName``, ``Hostname``, plus ``pod``/``namespace``) so existing dashboards
work. dcgm-exporter labels a GPU with the one pod it is assigned to; a shared
GPU has several, so ``pod``/``namespace`` are set only when exactly one known pod
runs there (otherwise empty) and per-pod numbers live in ``tandem_pod_*``.
``DCGM_FI_DEV_XID_ERRORS`` is, as in DCGM, the code of the newest XID (0 = none);
the count is ``tandem_gpu_xid_errors_total``. Unknown values are not exported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.node.extender_view import NodeView
from agent.node.gpus import GpuSample, NodeSample

_MIB = 1 << 20
_GPU_LABELS = ["gpu", "UUID", "modelName", "Hostname", "pod", "namespace"]
_TANDEM_LABELS = ["gpu", "UUID", "Hostname"]

# name -> (help, value getter); units are dcgm-exporter's (%, MiB, W, C).
_DCGM: dict[str, tuple[str, Callable[[GpuSample], float | None]]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", lambda g: g.utilization_percent),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("Memory utilization (in %).",
                                  lambda g: g.memory_utilization_percent),
    "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", lambda g: g.memory_used_mib),
    "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).", lambda g: g.memory_free_mib),
    "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W).", lambda g: g.power_watts),
    "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", lambda g: g.temperature_c),
    "DCGM_FI_DEV_XID_ERRORS": ("Value of the last XID error encountered.", lambda g: g.last_xid),
}


@dataclass(frozen=True)
class Observation:
    """The newest sample (None while the GPU source is down) and extender view."""

    sample: NodeSample | None
    view: NodeView | None


class AgentCollector:
    """Builds metric families from ``latest()`` at scrape time."""

    def __init__(self, latest: Callable[[], Observation | None], hostname: str) -> None:
        self._latest = latest
        self._host = hostname

    def describe(self) -> list[Metric]:
        """No up-front description: families depend on the GPUs seen."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Yield every family for the newest observation."""
        observation = self._latest()
        source_up = GaugeMetricFamily("tandem_agent_gpu_source_up",
                                      "1 if the GPU source answered in the last round.",
                                      labels=["Hostname"])
        up = observation is not None and observation.sample is not None
        source_up.add_metric([self._host], 1.0 if up else 0.0)
        yield source_up
        if observation is None or observation.sample is None:
            return
        yield from self._gpu_families(observation.sample, observation.view)

    def _gpu_families(self, sample: NodeSample, view: NodeView | None) -> Iterator[Metric]:
        names = view.pod_names() if view is not None else {}
        predicted = {g.index: g.predicted_util_percent for g in view.gpus} if view else {}
        dcgm = {n: GaugeMetricFamily(n, h, labels=_GPU_LABELS) for n, (h, _) in _DCGM.items()}
        up = GaugeMetricFamily("tandem_gpu_up", "1 if the GPU answered NVML, 0 if lost.",
                               labels=_TANDEM_LABELS)
        xid = CounterMetricFamily("tandem_gpu_xid_errors", "XID errors seen since agent start.",
                                  labels=_TANDEM_LABELS)
        observed = GaugeMetricFamily("tandem_agent_gpu_observed_utilization_ratio",
                                     "Observed GPU utilisation over the interval (0-1).",
                                     labels=_TANDEM_LABELS)
        expected = GaugeMetricFamily("tandem_agent_gpu_predicted_utilization_ratio",
                                     "Sum of the extender's predictions for the GPU (0-1+).",
                                     labels=_TANDEM_LABELS)
        versus = GaugeMetricFamily("tandem_gpu_observed_to_predicted_utilization_ratio",
                                   "Observed over predicted utilisation (1 = prediction held).",
                                   labels=_TANDEM_LABELS)
        pod_memory = GaugeMetricFamily("tandem_pod_gpu_memory_bytes",
                                       "GPU memory used by a pod's processes on one GPU.",
                                       labels=[*_TANDEM_LABELS, "pod_uid", "pod", "namespace"])
        for g in sample.gpus:
            ids = [str(g.info.index), g.info.uuid, self._host]
            pods = sorted({p.pod_uid for p in g.processes if p.pod_uid})
            only = names.get(pods[0], ("", "")) if len(pods) == 1 else ("", "")
            labels = [str(g.info.index), g.info.uuid, g.info.product, self._host, only[1], only[0]]
            for name, (_, read) in _DCGM.items():
                value = read(g)
                if value is not None:
                    dcgm[name].add_metric(labels, float(value))
            up.add_metric(ids, 0.0 if g.lost else 1.0)
            if g.xid_errors is not None:
                xid.add_metric(ids, float(g.xid_errors))
            if g.utilization_percent is not None:
                observed.add_metric(ids, g.utilization_percent / 100)
            guess = predicted.get(g.info.index)
            if guess is not None:
                expected.add_metric(ids, guess / 100)
                if g.utilization_percent is not None and guess > 0:
                    versus.add_metric(ids, g.utilization_percent / guess)
            for uid in pods:
                used = [p.used_memory_mib for p in g.processes if p.pod_uid == uid]
                if any(u is not None for u in used):
                    namespace, pod = names.get(uid, ("", ""))
                    total = sum(u for u in used if u is not None) * _MIB
                    pod_memory.add_metric([*ids, uid, pod, namespace], float(total))
        yield from dcgm.values()
        yield from (up, xid, observed, expected, versus, pod_memory)
