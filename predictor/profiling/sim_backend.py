"""``sim:FILE``: a synthetic GPU for tests and dry runs, chosen explicitly.

Nothing it returns is a measurement. Rows written with it are marked
``"simulated": true`` in provenance.json, and the campaign refuses to mix them
with real data in one directory. The file::

    gpu: {product: SIM-GPU-16GB, memory_mib: 16384}
    seconds_per_run: 6          # charged to the injected sleep (a fake clock in tests)
    colocation: {linear: 0.3, quadratic: 1.2}
    models:
      resnet18:
        family: resnet
        features: {flops_per_sample: 3.6e9, params_bytes: 4.7e7,
                   activations_bytes_per_sample: 2.0e7, op_counts: {Conv: 20, Relu: 17}}
        training:  {util_percent_b1: 20, util_exponent: 0.35, step_time_ms_b1: 4,
                    time_exponent: 0.8, memory_mib_base: 600, memory_mib_per_sample: 30}
        inference: {util_percent_b1: 8, ...}
        error: "injected failure"   # optional: every run of this model fails

Isolated: ``util = min(100, util_b1 * b**util_exponent)``,
``step = step_b1 * b**time_exponent``, ``memory = base + per_sample * b``;
a run whose memory (summed over co-located jobs) exceeds ``gpu.memory_mib`` is an
OOM. Co-located with cumulative utilisation ``U`` (fraction), job ``i`` slows by
``1 + linear * (U - u_i) + quadratic * max(0, U - 1)**2`` and the GPU shows
``min(100, 100 U)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from predictor.profiling.backend import (
    Environment,
    JobResult,
    JobSpec,
    Measurement,
    MeasureSettings,
)
from predictor.profiling.errors import BackendUnavailable
from predictor.profiling.spec import CatalogueEntry

_CURVE_KEYS = ("util_percent_b1", "util_exponent", "step_time_ms_b1", "time_exponent",
               "memory_mib_base", "memory_mib_per_sample")  # fmt: skip


@dataclass(frozen=True)
class SimCurve:
    """Synthetic behaviour of one model under one workload."""

    util_percent_b1: float
    util_exponent: float
    step_time_ms_b1: float
    time_exponent: float
    memory_mib_base: float
    memory_mib_per_sample: float

    def util_percent(self, batch: int) -> float:
        """Isolated utilisation at ``batch``."""
        return min(100.0, self.util_percent_b1 * batch**self.util_exponent)

    def step_time_ms(self, batch: int) -> float:
        """Isolated step time at ``batch``."""
        return self.step_time_ms_b1 * batch**self.time_exponent

    def memory_mib(self, batch: int) -> float:
        """Memory at ``batch``."""
        return self.memory_mib_base + self.memory_mib_per_sample * batch


@dataclass(frozen=True)
class SimModel:
    """One model of the sim file."""

    name: str
    family: str
    curves: Mapping[str, SimCurve]
    features: Mapping[str, Any]
    error: str = ""


def _load(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise BackendUnavailable(f"sim file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise BackendUnavailable(f"sim file {path}: expected a mapping")
    return data


def _parse_models(raw: Any, path: Path) -> dict[str, SimModel]:
    problems: list[str] = []
    models: dict[str, SimModel] = {}
    if not isinstance(raw, dict) or not raw:
        raise BackendUnavailable(f"sim file {path}: models: expected a non-empty mapping")
    for name, m in raw.items():
        if not isinstance(m, dict) or "family" not in m:
            problems.append(f"models.{name}: expected a mapping with family")
            continue
        curves = {}
        for workload in ("training", "inference"):
            c = m.get(workload)
            if c is None:
                continue
            missing = [k for k in _CURVE_KEYS if not isinstance(c.get(k), int | float)]
            if missing:
                problems.append(f"models.{name}.{workload}: missing numbers {missing}")
                continue
            curves[workload] = SimCurve(**{k: float(c[k]) for k in _CURVE_KEYS})
        if not curves:
            problems.append(f"models.{name}: needs training and/or inference")
        features = m.get("features")
        if not isinstance(features, dict):
            problems.append(f"models.{name}.features: expected a mapping")
            features = {}
        models[str(name)] = SimModel(str(name), str(m["family"]), curves, features,
                                     str(m.get("error", "")))  # fmt: skip
    if problems:
        raise BackendUnavailable(f"sim file {path}: " + "; ".join(problems))
    return models


class SimBackend:
    """Synthetic GPU described by a YAML file; see the module docstring."""

    def __init__(
        self,
        path: Path,
        settings: MeasureSettings,
        sleep: Callable[[float], None] = lambda _s: None,
    ):
        data = _load(path)
        gpu = data.get("gpu") or {}
        if not isinstance(gpu.get("product"), str) or not isinstance(
            gpu.get("memory_mib"), int | float
        ):
            raise BackendUnavailable(f"sim file {path}: gpu: needs product and memory_mib")
        colo = data.get("colocation") or {}
        self.path = Path(path)
        self.product = gpu["product"]
        self.memory_mib = float(gpu["memory_mib"])
        self.linear = float(colo.get("linear", 0.3))
        self.quadratic = float(colo.get("quadratic", 1.0))
        self.seconds_per_run = float(data.get("seconds_per_run", 0.0))
        self.models = _parse_models(data.get("models"), self.path)
        self.settings = settings
        self._sleep = sleep

    def catalogue(self) -> dict[str, CatalogueEntry]:
        """The models of the sim file as a planning catalogue."""
        return {n: CatalogueEntry(n, m.family, tuple(m.curves)) for n, m in self.models.items()}

    def features(self, job: JobSpec) -> dict[str, Any]:
        """Graph-feature columns from the file (scaled by batch size where per sample)."""
        f = self.models[job.model].features
        return {
            "flops": float(f.get("flops_per_sample", 0.0)) * job.batch_size,
            "params_bytes": float(f.get("params_bytes", 0.0)),
            "activations_bytes": float(f.get("activations_bytes_per_sample", 0.0)) * job.batch_size,
            "peak_activation_bytes": float(f.get("activations_bytes_per_sample", 0.0))
            * job.batch_size,
            "op_counts": dict(f.get("op_counts", {})),
        }

    def environment(self) -> Environment:
        """A product name from the file; versions say 'simulated'."""
        return Environment(
            gpu_product=self.product, gpu_memory_mib=self.memory_mib,
            driver_version="simulated", cuda_version="simulated", framework="sim",
            framework_version="simulated", simulated=True, cpu="simulated",
            software={}, notes=f"synthetic numbers from {self.path.name}; not measurements",
        )  # fmt: skip

    def measure(self, jobs: Sequence[JobSpec]) -> Measurement:
        """Synthetic results for ``jobs`` run together."""
        self._sleep(self.seconds_per_run)
        results: list[JobResult | None] = [None] * len(jobs)
        curves: list[SimCurve] = []
        memory = 0.0
        for i, job in enumerate(jobs):
            model = self.models.get(job.model)
            curve = model.curves.get(job.workload) if model else None
            if model is None or curve is None:
                results[i] = JobResult("error", f"sim: no {job.workload} curve for {job.model}")
            elif model.error:
                results[i] = JobResult("error", model.error)
            else:
                memory += curve.memory_mib(job.batch_size)
                if memory > self.memory_mib:
                    results[i] = JobResult("oom", f"sim: {memory:.0f} MiB > {self.memory_mib:.0f}")
            curves.append(curve if curve is not None else SimCurve(0, 0, 0, 0, 0, 0))
        if any(r is not None for r in results):
            failed = next(i for i, r in enumerate(results) if r is not None)
            aborted = JobResult("error", f"aborted: co-located job {failed} failed")
            return Measurement(tuple(r or aborted for r in results))
        utils = [c.util_percent(j.batch_size) / 100.0 for c, j in zip(curves, jobs, strict=True)]
        total = sum(utils)
        out = []
        for u, c, j in zip(utils, curves, jobs, strict=True):
            slow = 1.0 + self.linear * (total - u) + self.quadratic * max(0.0, total - 1.0) ** 2
            step = c.step_time_ms(j.batch_size) * slow
            n = max(self.settings.min_steps, int(self.settings.measure_seconds * 1000 / step))
            mem = c.memory_mib(j.batch_size)
            out.append(JobResult("ok", "", step, 0.02 * step, n, mem * 0.9, mem))
        device_util = min(100.0, 100.0 * total)
        s = self.settings
        n_samples = max(1, int(s.measure_seconds * 1000 / s.sample_interval_ms))
        return Measurement(tuple(out), device_util, device_util, device_util, n_samples,
                           self.seconds_per_run)  # fmt: skip
