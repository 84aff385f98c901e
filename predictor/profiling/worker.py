"""The profiling worker: one process, one CUDA context, runs one job at a time.

Co-located jobs must have separate CUDA contexts, as in production, so each runs
in its own worker process; isolated runs reuse one worker so that torch import
and context creation are paid once per campaign, not once per run. The parent
speaks JSON lines on stdin; replies go to a duplicate of the original stdout,
while fd 1 is pointed at stderr so that prints from models or libraries can never
corrupt the protocol.

    parent -> worker                       worker -> parent
    (start)                                {"event": "hello", "pid": P}
    {"op": "prepare", "job", "settings"}   {"event": "ready"} | {"event": "result", status...}
    {"op": "measure"}                      {"event": "result", "status": "ok", ...}
    {"op": "release"}                      {"event": "released"}
    {"op": "exit"}                         (exits)

``prepare`` builds the model and warms it up; ``measure`` runs the steady-state
window and frees the model. Run with ``python -m predictor.profiling.worker
--device cuda`` (``cpu`` exists for tests of the protocol without a GPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

from predictor.profiling.backend import JobSpec, MeasureSettings

PREFIX = "@@tandem-worker "
_MIB = 1024.0 * 1024.0
_OOM_MARKERS = ("out of memory", "failed to allocate memory", "cudnn_status_alloc_failed",
                "cublas_status_alloc_failed", "bfcarena")  # fmt: skip


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is the framework saying the GPU ran out of memory."""
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:
        pass
    text = str(exc).lower()
    return any(marker in text for marker in _OOM_MARKERS)


def _scalar_loss(output: Any) -> Any:
    """A scalar to backpropagate from any model output (first floating tensor)."""
    import torch

    if isinstance(output, torch.Tensor):
        return output.float().mean()
    if isinstance(output, dict):
        output = list(output.values())
    for item in output:
        if isinstance(item, torch.Tensor) and item.is_floating_point():
            return item.float().mean()
    raise TypeError(f"model output {type(output).__name__} holds no floating tensor")


def _zoo_step(job: JobSpec, settings: MeasureSettings, device: str) -> Callable[[], None]:
    from predictor.zoo import ZOO, build_model

    # The same construction export_onnx uses, so the measured model is the graph
    # whose features the row records.
    model = build_model(job.model)
    return _module_step(model, ZOO[job.model].example_input(job.batch_size), job, settings,
                        device)  # fmt: skip


def _torch_step(job: JobSpec, settings: MeasureSettings, device: str) -> Callable[[], None]:
    from predictor.profiling.usermodels import build_module, example_input

    assert job.torch_model is not None
    model = build_module(job.torch_model)
    return _module_step(model, example_input(job.torch_model, job.batch_size), job, settings,
                        device)  # fmt: skip


def _module_step(model: Any, x: Any, job: JobSpec, settings: MeasureSettings,
                 device: str) -> Callable[[], None]:  # fmt: skip
    """One training step (forward, backward, optimiser) or one inference batch."""
    import torch

    model = model.to(device)
    x = x.to(device)
    if job.workload == "inference":
        model.eval()

        def infer() -> None:
            with torch.inference_mode():
                model(x)

        return infer
    model.train()
    if settings.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def train() -> None:
        opt.zero_grad(set_to_none=True)
        _scalar_loss(model(x)).backward()
        opt.step()

    return train


_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
              "tensor(double)": np.float64, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(bool)": np.bool_}  # fmt: skip


def _onnx_step(job: JobSpec, device: str) -> Callable[[], None]:
    import onnxruntime as ort

    if job.workload != "inference":
        raise ValueError("user ONNX models are profiled for inference only")
    provider = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    session = ort.InferenceSession(str(job.onnx_path), providers=[provider])
    if provider not in session.get_providers():
        # Never measure a silent CPU fallback as if it were the GPU.
        raise RuntimeError(f"ONNX Runtime did not enable {provider} "
                           f"(available: {ort.get_available_providers()})")  # fmt: skip
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in session.get_inputs():
        dims = list(inp.shape)
        shape = [job.batch_size if i == 0 and not isinstance(d, int) else d
                 for i, d in enumerate(dims)]  # fmt: skip
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ValueError(f"input {inp.name} has symbolic dims beyond the batch: {dims}")
        dtype = _ORT_TYPES.get(inp.type)
        if dtype is None:
            raise ValueError(f"input {inp.name} has unsupported type {inp.type}")
        if np.issubdtype(dtype, np.integer):
            feeds[inp.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)

    def infer() -> None:
        session.run(None, feeds)

    return infer


class JobRunner:
    """Holds at most one prepared job; all failures become result messages."""

    def __init__(self, device: str):
        self.device = device
        self._step: Callable[[], None] | None = None
        self._settings = MeasureSettings()

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def prepare(self, job: JobSpec, settings: MeasureSettings) -> dict[str, Any]:
        """Build and warm up ``job``; ``ready`` or a failed result."""
        self.release()
        self._settings = settings
        try:
            if self.device == "cuda":
                import torch

                torch.backends.cudnn.benchmark = True
                torch.cuda.reset_peak_memory_stats()
            if job.onnx_path:
                self._step = _onnx_step(job, self.device)
            elif job.torch_model is not None:
                self._step = _torch_step(job, settings, self.device)
            else:
                self._step = _zoo_step(job, settings, self.device)
            deadline = time.perf_counter() + settings.warmup_seconds
            n = 0
            while n < 2 or time.perf_counter() < deadline:
                self._step()
                self._sync()
                n += 1
        except Exception as exc:  # the job's own failure: report, keep the worker alive
            return self._failed(exc)
        return {"event": "ready"}

    def measure(self) -> dict[str, Any]:
        """Run the measured window of the prepared job, then free it."""
        if self._step is None:
            return {"event": "result", "status": "error", "error": "measure before prepare"}
        s = self._settings
        times: list[float] = []
        try:
            deadline = time.perf_counter() + s.measure_seconds
            while (len(times) < s.min_steps or time.perf_counter() < deadline) and len(
                times
            ) < s.max_steps:
                t0 = time.perf_counter()
                self._step()
                self._sync()
                times.append((time.perf_counter() - t0) * 1000.0)
        except Exception as exc:
            return self._failed(exc)
        peak, reserved = self._memory()
        self.release()
        arr = np.asarray(times)
        return {
            "event": "result", "status": "ok", "error": "",
            "step_time_ms": float(arr.mean()),
            "step_time_std_ms": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0,
            "n_steps": len(times), "mem_peak_framework_mib": peak, "mem_reserved_mib": reserved,
        }  # fmt: skip

    def _memory(self) -> tuple[float | None, float | None]:
        if self.device != "cuda" or self._step is None:
            return None, None
        import torch

        return torch.cuda.max_memory_allocated() / _MIB, torch.cuda.max_memory_reserved() / _MIB

    def _failed(self, exc: BaseException) -> dict[str, Any]:
        status = "oom" if is_oom(exc) else "error"
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        self.release()
        return {"event": "result", "status": status, "error": message}

    def release(self) -> None:
        """Drop the prepared job and return its memory to the driver."""
        self._step = None
        gc.collect()
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()


def serve(runner: JobRunner, inp: TextIO, out: TextIO) -> None:
    """Answer protocol messages from ``inp`` until ``exit`` or end of input."""

    def send(msg: dict[str, Any]) -> None:
        out.write(PREFIX + json.dumps(msg) + "\n")
        out.flush()

    send({"event": "hello", "pid": os.getpid()})
    for line in inp:
        try:
            msg = json.loads(line)
            op = msg["op"]
        except (json.JSONDecodeError, KeyError, TypeError):
            send({"event": "error", "error": f"bad message {line[:200]!r}"})
            continue
        if op == "prepare":
            send(runner.prepare(JobSpec.from_json(msg["job"]), MeasureSettings(**msg["settings"])))
        elif op == "measure":
            send(runner.measure())
        elif op == "release":
            runner.release()
            send({"event": "released"})
        elif op == "exit":
            return
        else:
            send({"event": "error", "error": f"unknown op {op!r}"})


def main(argv: list[str] | None = None) -> None:
    """Entry point of the worker process."""
    parser = argparse.ArgumentParser(prog="python -m predictor.profiling.worker")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(JobRunner(args.device), sys.stdin, proto)


if __name__ == "__main__":
    main()
