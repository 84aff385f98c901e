"""The measurement backend protocol and the values it exchanges with a campaign.

A backend runs one or more jobs *together* on one GPU and returns what it
measured: one job is an isolated run, two or three are a co-located combination.
Two implementations exist and are chosen explicitly, never as a fallback:
``cuda`` (:mod:`predictor.profiling.cuda`, real GPU, NVML) and ``sim:FILE``
(:mod:`predictor.profiling.sim_backend`, synthetic numbers for tests and dry runs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Workload = Literal["training", "inference"]
Status = Literal["ok", "oom", "error", "timeout"]


def config_key(model: str, workload: str, batch_size: int) -> str:
    """Identity of a model configuration on one GPU: resume matches rows to jobs by it."""
    return f"{model}|{workload}|{batch_size}"


TORCH_INPUT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "int64", "int32")


@dataclass(frozen=True)
class TorchModelSpec:
    """A user's torch model: how to build it and what one input sample looks like.

    ``factory`` is ``package.module:callable`` (importable by the profiler and its
    workers, e.g. through PYTHONPATH) or ``/path/to/file.py:callable``; calling it
    with no arguments returns a ``torch.nn.Module``. Inputs are random tensors of
    shape ``(batch, *input_shape)``; integer inputs (token ids) are drawn from
    ``[0, input_high)``. :mod:`predictor.profiling.usermodels` builds both.
    """

    factory: str
    input_shape: tuple[int, ...]
    input_dtype: str = "float32"
    input_high: int = 2

    def problems(self) -> list[str]:
        """Every invalid field as ``name: reason``."""
        out = []
        module, sep, attr = self.factory.rpartition(":")
        if not sep or not module or not attr.isidentifier():
            out.append(f"factory: {self.factory!r} is not 'module:callable' or 'file.py:callable'")
        if not self.input_shape or any(d < 1 for d in self.input_shape):
            out.append(f"input_shape: {list(self.input_shape)} needs one or more sizes >= 1")
        if self.input_dtype not in TORCH_INPUT_DTYPES:
            out.append(f"input_dtype: {self.input_dtype!r} is not one of "
                       f"{'|'.join(TORCH_INPUT_DTYPES)}")  # fmt: skip
        if self.input_high < 1:
            out.append("input_high: must be >= 1")
        return out


@dataclass(frozen=True)
class JobSpec:
    """One model configuration to run: a catalogue (zoo) model, a user ONNX file or a
    user torch model, with its workload and batch size."""

    model: str
    family: str
    workload: Workload
    batch_size: int
    onnx_path: str | None = None
    """A user ONNX model (inference only) instead of a zoo model."""
    torch_model: TorchModelSpec | None = None
    """A user torch model (training and inference) instead of a zoo model."""

    @property
    def key(self) -> str:
        """Deterministic identity of the configuration on one GPU (resume uses it)."""
        return config_key(self.model, self.workload, self.batch_size)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        """The inverse of ``dataclasses.asdict`` (the worker protocol sends that)."""
        torch_model = data.get("torch_model")
        if torch_model is not None:
            torch_model = TorchModelSpec(**{**torch_model,
                                            "input_shape": tuple(torch_model["input_shape"])})
        return cls(**{**data, "torch_model": torch_model})


@dataclass(frozen=True)
class MeasureSettings:
    """How long and how often one run measures; units in the names."""

    warmup_seconds: float = 2.0
    """Steps run before measuring (cuDNN autotuning, allocator growth); >= 0."""
    measure_seconds: float = 4.0
    """Length of the measured steady-state window; > 0."""
    sample_interval_ms: float = 200.0
    """NVML polling period, 100..250 ms (the driver samples about every 167 ms)."""
    min_steps: int = 3
    """A window ends only after this many steps, even if it runs past measure_seconds."""
    max_steps: int = 100_000
    """A window ends after this many steps even before measure_seconds."""
    timeout_seconds: float = 120.0
    """A job that does not finish warm-up plus measurement in this time is a timeout."""
    optimizer: Literal["sgd", "adam"] = "sgd"
    """Optimiser of training steps."""

    def problems(self) -> list[str]:
        """Every invalid field as ``name: reason``."""
        out = []
        if self.warmup_seconds < 0:
            out.append("warmup_seconds: must be >= 0")
        if self.measure_seconds <= 0:
            out.append("measure_seconds: must be > 0")
        if not 100.0 <= self.sample_interval_ms <= 250.0:
            out.append("sample_interval_ms: must be within 100..250")
        if self.min_steps < 1 or self.max_steps < self.min_steps:
            out.append("min_steps/max_steps: need 1 <= min_steps <= max_steps")
        if self.timeout_seconds <= self.warmup_seconds + self.measure_seconds:
            out.append("timeout_seconds: must exceed warmup_seconds + measure_seconds")
        if self.optimizer not in ("sgd", "adam"):
            out.append("optimizer: must be sgd|adam")
        return out


@dataclass(frozen=True)
class JobResult:
    """What one job of a run measured; numbers are None unless status is ok."""

    status: Status
    error: str = ""
    step_time_ms: float | None = None
    step_time_std_ms: float | None = None
    n_steps: int = 0
    mem_peak_framework_mib: float | None = None
    mem_used_nvml_mib: float | None = None
    process_util_mean_percent: float | None = None
    """This job's own SM utilisation as NVML reports it per process (None: unsupported)."""


@dataclass(frozen=True)
class Measurement:
    """One run: per-job results plus the whole GPU's NVML utilisation over the window."""

    jobs: tuple[JobResult, ...]
    util_mean_percent: float | None = None
    util_p50_percent: float | None = None
    util_p90_percent: float | None = None
    n_samples: int = 0
    duration_seconds: float = 0.0


@dataclass(frozen=True)
class Environment:
    """The GPU and software a backend measures on (goes into rows and provenance)."""

    gpu_product: str
    gpu_memory_mib: float
    driver_version: str
    cuda_version: str
    framework: str
    framework_version: str
    simulated: bool
    cpu: str = ""
    software: dict[str, str] = field(default_factory=dict)
    notes: str = ""


class ProfilingBackend(Protocol):
    """Runs jobs on one GPU. ``measure`` never raises for a job's own failure."""

    def environment(self) -> Environment:
        """The GPU product, driver, CUDA and framework versions."""
        ...

    def measure(self, jobs: Sequence[JobSpec]) -> Measurement:
        """Run ``jobs`` together (1 = isolated) and measure them; one JobResult per job."""
        ...


def gpu_slug(product: str) -> str:
    """Directory name of a GPU product: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    slug = re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-")
    if not slug:
        raise ValueError(f"GPU product {product!r} has no usable characters for a directory name")
    return slug
