"""``TorchExecutor``: ONNX models run through torch, on CUDA or the CPU, chosen explicitly.

For machines with a CUDA build of torch but no ``onnxruntime-gpu``: the model
goes through the same checks, constant folding and cut finding as on ONNX
Runtime (in the model worker, ``prepare.py``), then ``onnx_torch`` compiles the
folded graph to torch calls on the device. An operator it cannot run refuses the
model at registration (422, the operator named), before any profiling.

Segments are node ranges of the one compiled graph, cut at the same places as
ONNX Runtime's pieces: a segment hands its live tensor to the next on the
device, so a yield point costs no copy. Every timed run ends with a device
synchronization, so profiles, atom costs and the time a segment is charged are
device time, not the time to queue kernels.

``--device cuda`` without a CUDA device visible to torch refuses to start; it
never serves on the CPU instead. torch is imported when the executor is built,
so the agent runs without torch unless this executor is chosen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.inference.errors import ModelRejected
from agent.inference.executors.executors import (
    Feed,
    LoadedModel,
    MeasuredExecutor,
)
from agent.inference.preparation.limits import ModelLimits
from agent.inference.quanta import group_segments
from predictor.batching import BatchingProfile

_RUN_ERRORS = (RuntimeError, ValueError, TypeError, IndexError)
"""What torch raises for a graph it cannot run at these shapes (CUDA OOM included)."""


def require_torch_device(device: str, gpu_index: int) -> Any:
    """The torch device to serve on; RuntimeError (a clear sentence) when it is not there."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    try:
        import torch
    except ImportError:
        raise RuntimeError(
            "--executor torch needs torch (a CUDA build for --device cuda); it is not installed"
        ) from None
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = torch.version.cuda or "none: a CPU-only build"
        raise RuntimeError(
            f"--executor torch --device cuda: torch {torch.__version__} sees no CUDA device "
            f"(torch.cuda.is_available() is False; CUDA in this build: {build}). Serve on "
            "the CPU only by asking for it: --device cpu"
        )
    if not 0 <= gpu_index < torch.cuda.device_count():
        raise RuntimeError(
            f"--gpu {gpu_index}: torch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", gpu_index)


@dataclass
class _TorchHandle:
    graph: Any  # onnx_torch_graph.TorchGraph
    bounds: list[int]
    """Atom boundaries as node indices: atom i is nodes [bounds[i], bounds[i + 1])."""
    atom_costs_ms: list[float] = field(default_factory=list)
    boundary_cost_ms: float = 0.0
    whole_ms: float = 0.0
    segments: list[tuple[int, int]] = field(default_factory=list)


class TorchExecutor(MeasuredExecutor):
    """ONNX graphs executed as torch operations on an explicitly chosen device."""

    kind = "torch"

    def __init__(
        self,
        device: str,
        gpu_index: int = 0,
        gpu_type: str | None = None,
        limits: ModelLimits = ModelLimits(),
        intra_op_threads: int | None = 1,
        timer: Callable[[], float] = time.perf_counter,
        prepare_in_process: bool = False,
    ):
        self.torch_device = require_torch_device(device, gpu_index)
        import torch

        self._torch = torch
        self._cpu_threads = intra_op_threads if device == "cpu" and intra_op_threads else None
        self._threads_set: set[int] = set()
        self._pin_threads()  # as ORT's CPU executor: one core
        self._setup(device, gpu_index, gpu_type, limits, timer, prepare_in_process)

    # ---- running --------------------------------------------------------------------

    def _pin_threads(self) -> None:
        """Hold the calling thread's intra-op threads to ``intra_op_threads``. The limit
        is per thread (OpenMP's), so the executor loop's thread needs its own call: there
        a batch of 4 would otherwise fan out over every core and stall tens of ms on a
        busy host, which profiles (run there as probe slices) then take for l(b)."""
        if self._cpu_threads is None or threading.get_ident() in self._threads_set:
            return
        self._torch.set_num_threads(self._cpu_threads)
        self._threads_set.add(threading.get_ident())

    def _sync(self) -> None:
        if self.torch_device.type == "cuda":
            self._torch.cuda.synchronize(self.torch_device)

    def _to_device(self, value: Any) -> Any:
        if isinstance(value, np.ndarray):
            # torch shares a writable array's memory; a read-only request body is copied.
            array = value if value.flags.writeable else value.copy()
            return self._torch.from_numpy(np.ascontiguousarray(array)).to(self.torch_device)
        return value

    def _run(self, loaded: LoadedModel, feed: Feed, start: int, stop: int) -> dict[str, Any]:
        """Nodes ``[start, stop)`` on ``feed``; host arrays at the end of the graph, device
        tensors (synchronized) between segments."""
        handle: _TorchHandle = loaded.handle
        self._pin_threads()
        out = handle.graph.run({k: self._to_device(v) for k, v in feed.items()}, start, stop)
        if stop == len(handle.graph):
            return {k: v.cpu().numpy() for k, v in out.items()}  # the copy waits for the device
        self._sync()
        return out

    def run_batch(self, loaded: LoadedModel, batch: np.ndarray) -> list[np.ndarray]:
        """The whole model on a batch."""
        handle: _TorchHandle = loaded.handle
        return list(self._run(loaded, {loaded.input_name: batch}, 0, len(handle.graph)).values())

    def run_segment(self, loaded: LoadedModel, index: int, feed: Feed, profiled_ms: float) -> Feed:
        """Segment ``index``: device tensors out, the model outputs (arrays) after the last."""
        handle: _TorchHandle = loaded.handle
        start, stop = handle.segments[index]
        return self._run(loaded, feed, start, stop)

    # ---- loading and measuring ------------------------------------------------------

    def load(self, ref: str) -> LoadedModel:
        """Check and fold (model worker), compile to torch, time the atoms; ModelRejected."""
        import onnx

        from agent.inference.executors.onnx_torch import UnsupportedGraph
        from agent.inference.executors.onnx_torch_graph import TorchGraph

        prepared = self.preparer.prepare(ref, self.limits)
        proto = onnx.ModelProto()
        proto.ParseFromString(prepared.model)
        try:
            graph = TorchGraph(proto, self.torch_device)
        except UnsupportedGraph as exc:
            raise ModelRejected(f"model {ref!r}: {exc}", unsupported=exc.problems) from None
        except _RUN_ERRORS as exc:  # constants the device cannot hold, bad tensor data
            raise ModelRejected(f"model {ref!r}: torch cannot load it: {exc}") from None
        bounds = [0, *(n + 1 for n in prepared.cut_nodes), len(graph)]
        loaded = LoadedModel(
            ref, prepared.input_name, prepared.input_dtype, prepared.sample_shape, (1.0,),
            _TorchHandle(graph, bounds), cuts=prepared.cuts,
        )  # fmt: skip
        try:
            self._profile_atoms(loaded)
        except _RUN_ERRORS as exc:
            raise ModelRejected(f"model {ref!r}: torch cannot run it: {exc}") from None
        return loaded

    def _chain_ms(self, loaded: LoadedModel, ranges: list[tuple[int, int]], x: np.ndarray,
                  expected_ms: list[float]) -> list[float]:
        """Median time of each node range of a chain fed from ``x``, one slice per run."""
        feed: Feed = {loaded.input_name: x}
        costs = []
        for (start, stop), expected in zip(ranges, expected_ms, strict=True):
            run = lambda f=feed, a=start, b=stop: self._run(loaded, f, a, b)  # noqa: E731
            cost, feed = self._time_ms(run, expected)
            costs.append(cost)
        return costs

    def _atoms(self, loaded: LoadedModel) -> list[tuple[int, int]]:
        b = loaded.handle.bounds
        return [(b[i], b[i + 1]) for i in range(len(b) - 1)]

    def _profile_atoms(self, loaded: LoadedModel) -> None:
        handle: _TorchHandle = loaded.handle
        x = self._sample(loaded, 1)
        atoms = self._atoms(loaded)
        whole = lambda: self._run(loaded, {loaded.input_name: x}, 0, len(handle.graph))  # noqa: E731
        if len(atoms) < 2:
            handle.whole_ms = self._time_ms(whole)[0]
            handle.atom_costs_ms = [handle.whole_ms]
            return
        costs = self._chain_ms(loaded, atoms, x, [0.0] * len(atoms))
        handle.atom_costs_ms = costs
        handle.whole_ms = self._time_ms(whole, sum(costs))[0]
        # What a yield point costs: one more synchronization and Python hand-off.
        handle.boundary_cost_ms = max(0.0, sum(costs) - handle.whole_ms) / (len(costs) - 1)

    def profile(self, loaded: LoadedModel) -> BatchingProfile:
        """Median latency at ``limits.profile_batches``, fitted linearly; the model is timed
        atom by atom (no slice longer than one atom), less its yield points."""
        atoms = self._atoms(loaded)
        return self._fit_chains(loaded, lambda x, expected: self._chain_ms(loaded, atoms, x,
                                                                           expected))

    def prepare_segments(self, loaded: LoadedModel, target_ms: float) -> None:
        """Group atoms into segments of about ``target_ms`` at batch 1 (node ranges)."""
        handle: _TorchHandle = loaded.handle
        atoms = self._atoms(loaded)
        ranges = group_segments(handle.atom_costs_ms, target_ms) if len(atoms) > 1 else [(0, 1)]
        handle.segments = [(atoms[s][0], atoms[e - 1][1]) for s, e in ranges]
        total = sum(handle.atom_costs_ms) or 1.0
        loaded.segment_fractions = tuple(sum(handle.atom_costs_ms[s:e]) / total for s, e in ranges)
        if len(ranges) > 1:
            x = self._sample(loaded, 1)
            expected = [sum(handle.atom_costs_ms[s:e]) for s, e in ranges]
            in_sequence = sum(self._chain_ms(loaded, handle.segments, x, expected))
            whole = self._chain_ms(loaded, [(0, len(handle.graph))], x, [handle.whole_ms])[0]
            loaded.segment_overhead = max(0.0, in_sequence - whole) / max(whole, 1e-6)
        else:
            loaded.segment_overhead = 0.0
