"""``cuda``: real measurements on an NVIDIA GPU (torch for zoo models, ONNX Runtime CUDA EP).

One measurement: every job is prepared (built, warmed up) in its own worker
process; when all are ready the NVML sampler is primed, all workers are told to
measure at once, and the sampler stops when the last one answers. So samples
cover the steady-state window only, and co-located jobs overlap for the whole of
it. Workers see only the profiled GPU (``CUDA_VISIBLE_DEVICES`` = its UUID).

Memory per job (``mem_used_nvml_mib``) is what NVML attributes to the worker's
process; where NVML cannot match processes (PID namespaces) it falls back to
the device's growth over the run for an isolated job, else to the framework's
reserved peak, and ``memory_sources`` counts which was used.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from types import ModuleType
from typing import Any

from predictor.profiling.backend import (
    Environment,
    JobResult,
    JobSpec,
    Measurement,
    MeasureSettings,
)
from predictor.profiling.errors import WorkerFailed, WorkerTimeout
from predictor.profiling.nvml import NvmlDevice, UtilizationSampler, open_device
from predictor.profiling.pool import WorkerPool, default_worker_argv

_MIB = 1024.0 * 1024.0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("torch", "onnxruntime", "onnx", "nvidia-ml-py", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


class CudaBackend:
    """Measures on GPU ``gpu_index`` with worker processes and an NVML sampler."""

    def __init__(
        self,
        settings: MeasureSettings,
        gpu_index: int = 0,
        nvml: ModuleType | None = None,
        worker_argv: Sequence[str] | None = None,
        startup_timeout_seconds: float = 180.0,
        sampler_factory: Callable[..., UtilizationSampler] = UtilizationSampler,
    ):
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        self.settings = settings
        self.device: NvmlDevice = open_device(nvml, gpu_index)
        self.memory_sources: Counter[str] = Counter()
        self.sampler_sources: Counter[str] = Counter()
        self._sampler_factory = sampler_factory
        env = dict(os.environ)
        # Workers see only this GPU, named by UUID so CUDA and NVML orders cannot disagree.
        env["CUDA_VISIBLE_DEVICES"] = self.device.uuid
        env["PYTHONUNBUFFERED"] = "1"
        self.pool = WorkerPool(worker_argv or default_worker_argv("cuda"), env,
                               startup_timeout_seconds)  # fmt: skip

    def environment(self) -> Environment:
        """NVML's product, driver and CUDA driver version; torch's version and CUDA runtime."""
        software = _versions()
        framework_version = software.get("torch", "")
        cuda_runtime = ""
        try:
            import torch

            cuda_runtime = torch.version.cuda or ""
            framework_version = torch.__version__
        except ImportError:
            pass
        d = self.device
        return Environment(
            gpu_product=d.product, gpu_memory_mib=d.memory_total_mib,
            driver_version=d.driver_version, cuda_version=cuda_runtime or d.cuda_driver_version,
            # "pytorch": the framework key predictor.api.Predictor looks memory overheads up by
            framework="pytorch", framework_version=framework_version, simulated=False,
            cpu=_cpu_model(), software={**software, "cuda_driver": d.cuda_driver_version},
            notes=(f"GPU {d.index} ({d.uuid}); NVML utilisation samples over the measured "
                   f"window after warm-up; settings {asdict(self.settings)}"),
        )  # fmt: skip

    def close(self) -> None:
        """Stop the worker processes and NVML."""
        self.pool.close()
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()

    def _device_used_mib(self) -> float | None:
        try:
            return self.nvml.nvmlDeviceGetMemoryInfo(self.device.handle).used / _MIB
        except self.nvml.NVMLError:
            return None

    def measure(self, jobs: Sequence[JobSpec]) -> Measurement:
        """Prepare every job, measure them together, sample NVML over the window."""
        s = self.settings
        try:
            workers = self.pool.take(len(jobs))
        except WorkerFailed as exc:
            return Measurement(tuple(JobResult("error", f"worker start: {exc}"[:500])
                                     for _ in jobs))  # fmt: skip
        baseline = self._device_used_mib()
        settings = asdict(s)
        # Prepare all at once: co-located jobs build and warm up side by side.
        sent = [self._send(w, {"op": "prepare", "job": asdict(job), "settings": settings})
                for w, job in zip(workers, jobs, strict=True)]  # fmt: skip
        replies = [
            r or self._receive(w, s.timeout_seconds) for w, r in zip(workers, sent, strict=True)
        ]
        failed = [i for i, r in enumerate(replies) if r.get("event") != "ready"]
        if failed:
            for i, w in enumerate(workers):
                if i not in failed and self._send(w, {"op": "release"}) is None:
                    self._receive(w, 60.0)
            return _aborted(replies, failed)
        sampler = self._sampler_factory(self.nvml, self.device.handle, s.sample_interval_ms,
                                        pids=[w.pid for w in workers])  # fmt: skip
        sampler.start()
        sent = [self._send(w, {"op": "measure"}) for w in workers]
        results = [r or self._receive(w, s.measure_seconds + max(60.0, s.timeout_seconds))
                   for w, r in zip(workers, sent, strict=True)]  # fmt: skip
        sampled = sampler.stop()
        failed = [i for i, r in enumerate(results) if r.get("status") != "ok"]
        if failed and len(jobs) > 1:
            # The others did not run co-located for the whole window: not a valid sample.
            return _aborted(results, failed)
        self.sampler_sources[sampled.source] += 1
        stats = sampled.stats()
        out = []
        for w, reply in zip(workers, results, strict=True):
            r = _job_result(reply)
            if r.status == "ok" and sampled.error:
                r = JobResult("error", sampled.error)
            elif r.status == "ok":
                mem = sampled.process_used_max_mib.get(w.pid)
                source = "nvml_process"
                if mem is None and len(jobs) == 1 and baseline is not None and (
                        sampled.device_used_max_mib is not None):  # fmt: skip
                    mem, source = sampled.device_used_max_mib - baseline, "nvml_device_delta"
                if mem is None:
                    mem, source = reply.get("mem_reserved_mib"), "framework_reserved"
                self.memory_sources[source] += 1
                peak = reply.get("mem_peak_framework_mib")
                own = sampled.process_util_percent.get(w.pid)
                r = JobResult("ok", "", r.step_time_ms, r.step_time_std_ms, r.n_steps,
                              peak if peak is not None else mem, mem,
                              sum(own) / len(own) if own else None)  # fmt: skip
            out.append(r)
        if stats is None:
            return Measurement(tuple(out), n_samples=0)
        mean, p50, p90 = stats
        return Measurement(tuple(out), mean, p50, p90, len(sampled.values_percent))

    def _send(self, worker: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """None when sent, else the failed result to record."""
        try:
            worker.send(message)
        except WorkerFailed as exc:
            return {"event": "result", "status": "error", "error": str(exc)[:500]}
        return None

    def _receive(self, worker: Any, timeout_s: float) -> dict[str, Any]:
        try:
            return worker.receive(timeout_s)
        except WorkerTimeout as exc:
            return {"event": "result", "status": "timeout", "error": str(exc).splitlines()[0]}
        except WorkerFailed as exc:
            # A worker that died (e.g. a CUDA error that poisons the context) is
            # replaced by the pool on the next run.
            return {"event": "result", "status": "error", "error": str(exc)[:500]}


def _job_result(reply: dict[str, Any]) -> JobResult:
    status = reply.get("status", "error")
    if status not in ("ok", "oom", "error", "timeout"):
        status = "error"
    return JobResult(
        status=status, error=str(reply.get("error", ""))[:500],
        step_time_ms=reply.get("step_time_ms"), step_time_std_ms=reply.get("step_time_std_ms"),
        n_steps=int(reply.get("n_steps", 0)),
        mem_peak_framework_mib=reply.get("mem_peak_framework_mib"),
    )  # fmt: skip


def _aborted(replies: list[dict[str, Any]], failed: list[int]) -> Measurement:
    """The failed jobs' own results; the others are errors naming the first failure."""
    first = failed[0]
    aborted = {"status": "error", "error": f"aborted: co-located job {first} failed"}
    return Measurement(tuple(_job_result(replies[i] if i in failed else aborted)
                             for i in range(len(replies))))  # fmt: skip
