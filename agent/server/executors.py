"""Executors: the only things that run models on the device.

Two implementations, always chosen explicitly:

- ``OrtExecutor``: ONNX Runtime with an explicit provider (CUDA EP on a GPU, CPU
  EP elsewhere). Loads a model from the store after size and path checks, profiles
  it when no batching profile is known, splits it into segments for quanta.
- ``SimExecutor``: "runs" a batch by sleeping ``l(b)`` from a batching profile on
  an injected clock (a virtual clock in tests and benchmarks), returning the input
  unchanged. It makes the scheduler testable at GPU speeds without a GPU.

Only the server's executor thread calls ``run_batch`` and ``run_segment``.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agent.quanta import OverheadCurve, group_segments
from agent.server.clock import Clock
from agent.server.errors import ModelRejected
from agent.server.profiles import fit_linear_profile
from predictor.batching import BatchingProfile

Feed = dict[str, np.ndarray]

QUANTUM_GRID_MS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)
"""Quantum lengths at which overhead curves are evaluated."""


@dataclass
class LoadedModel:
    """A model ready on an executor: its input contract and its segments for quanta."""

    ref: str
    input_name: str
    input_dtype: np.dtype
    sample_shape: tuple[int | None, ...] | None
    """Input shape without the batch dimension (None where dynamic); None: any shape (sim)."""
    segment_fractions: tuple[float, ...] | None
    """Share of ``l(b)`` each segment costs; None: split evenly by the target (sim)."""
    handle: Any = field(repr=False, default=None)
    cuts: int = 0
    """Valid cuts found in the (constant-folded) graph; 0 on the sim executor."""
    segment_overhead: float | None = None
    """Measured (segments run in sequence - whole run) / whole run at batch 1, once built."""

    def segment_costs_ms(self, latency_ms: float, target_ms: float) -> tuple[float, ...]:
        """Profiled cost of each segment for a whole-model latency of ``latency_ms``."""
        if self.segment_fractions is not None:
            return tuple(f * latency_ms for f in self.segment_fractions)
        pieces = max(1, math.ceil(latency_ms / target_ms - 1e-9))
        return (latency_ms / pieces,) * pieces


class Executor(Protocol):
    """Runs batches and segments of loaded models on one device."""

    kind: str
    gpu_type: str

    def load(self, ref: str) -> LoadedModel:
        """Validate and load a model; raises ModelRejected."""
        ...

    def known_profile(self, loaded: LoadedModel) -> BatchingProfile | None:
        """A batching profile known without measuring, if any."""
        ...

    def profile(self, loaded: LoadedModel) -> BatchingProfile:
        """Measure ``l(b)`` at a few batch sizes and fit it."""
        ...

    def prepare_segments(self, loaded: LoadedModel, target_ms: float) -> None:
        """Group the model into segments of about ``target_ms`` profiled cost."""
        ...

    def overhead_curve(
        self, loaded: LoadedModel, profile: BatchingProfile, segment_fraction: float = 1.0
    ) -> OverheadCurve:
        """Overhead against Q for segments of ``segment_fraction`` x Q (as built)."""
        ...

    def run_batch(self, loaded: LoadedModel, batch: np.ndarray) -> list[np.ndarray]:
        """Run the whole model on a batch; outputs are batch-major."""
        ...

    def run_segment(self, loaded: LoadedModel, index: int, feed: Feed, profiled_ms: float) -> Feed:
        """Run segment ``index`` on ``feed``; the last segment returns the model outputs."""
        ...


class SimExecutor:
    """Profile-driven stand-in: sleeps ``l(b)`` on the clock and echoes the input."""

    kind = "sim"

    def __init__(
        self,
        profiles: Mapping[str, BatchingProfile],
        clock: Clock,
        gpu_type: str,
        jitter_fraction: float = 0.0,
        switch_overhead_ms: float = 0.01,
        seed: int = 0,
    ):
        self._profiles = dict(profiles)
        self._clock = clock
        self.gpu_type = gpu_type
        self._jitter = jitter_fraction
        self._switch_overhead_ms = switch_overhead_ms
        self._rng = random.Random(seed)

    def _lookup(self, ref: str) -> BatchingProfile | None:
        return self._profiles.get(ref) or self._profiles.get(Path(ref).stem)

    def load(self, ref: str) -> LoadedModel:
        """Accept any model that has a profile; the input contract is open (float32, any shape)."""
        if self._lookup(ref) is None:
            raise ModelRejected(
                f"sim executor has no batching profile for model {ref!r}",
                known=sorted(self._profiles),
            )
        return LoadedModel(ref, "input", np.dtype(np.float32), None, None)

    def known_profile(self, loaded: LoadedModel) -> BatchingProfile | None:
        """The configured profile."""
        return self._lookup(loaded.ref)

    def profile(self, loaded: LoadedModel) -> BatchingProfile:
        """The configured profile (the simulator measures nothing)."""
        found = self._lookup(loaded.ref)
        if found is None:
            raise ModelRejected(f"no profile for {loaded.ref!r}")
        return found

    def prepare_segments(self, loaded: LoadedModel, target_ms: float) -> None:
        """Nothing to build: simulated segments are even splits of ``l(b)``."""

    def overhead_curve(
        self, loaded: LoadedModel, profile: BatchingProfile, segment_fraction: float = 1.0
    ) -> OverheadCurve:
        """One configured switch cost per quantum: ``overhead(Q) = switch / Q``."""
        points = [[q, self._switch_overhead_ms / q] for q in QUANTUM_GRID_MS]
        return OverheadCurve.from_points(loaded.ref, points)

    def _sleep(self, profiled_ms: float) -> None:
        factor = 1.0 + (self._rng.gauss(0.0, self._jitter) if self._jitter > 0 else 0.0)
        self._clock.sleep_ms(profiled_ms * max(0.0, factor))

    def run_batch(self, loaded: LoadedModel, batch: np.ndarray) -> list[np.ndarray]:
        """Sleep ``l(b)`` (in chunks of the profile's largest batch) and echo the batch."""
        profile = self.profile(loaded)
        remaining = int(batch.shape[0]) if batch.ndim else 1
        while remaining > 0:
            chunk = min(remaining, profile.max_batch)
            self._sleep(profile.latency_ms(chunk))
            remaining -= chunk
        return [batch]

    def run_segment(self, loaded: LoadedModel, index: int, feed: Feed, profiled_ms: float) -> Feed:
        """Sleep the segment's profiled cost and pass the tensor on."""
        self._sleep(profiled_ms)
        return feed


@dataclass
class _OrtHandle:
    model: Any  # onnx.ModelProto
    session: Any  # onnxruntime.InferenceSession
    atoms: list[Any] = field(default_factory=list)
    atom_costs_ms: list[float] = field(default_factory=list)
    boundary_cost_ms: float = 0.0
    whole_ms: float = 0.0
    segments: list[Any] = field(default_factory=list)
    cuts: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class ModelLimits:
    """Where models may come from and how big they may be."""

    store_root: Path | None = None
    """If set, model paths must resolve inside this directory."""
    max_model_bytes: int = 2 * 2**30
    profile_batches: tuple[int, ...] = (1, 2, 4, 8)
    max_batch: int = 64
    profile_repeats: int = 3


class OrtExecutor:
    """ONNX Runtime on an explicitly chosen device (``cuda`` or ``cpu``)."""

    kind = "onnxruntime"

    def __init__(
        self,
        device: str,
        gpu_index: int = 0,
        gpu_type: str | None = None,
        limits: ModelLimits = ModelLimits(),
        intra_op_threads: int = 1,
        timer: Callable[[], float] = time.perf_counter,
    ):
        import onnxruntime as ort

        if device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
        if device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise RuntimeError(
                    "--device cuda needs onnxruntime-gpu (CUDAExecutionProvider is not available)"
                )
            # CPU EP stays as ORT's home for the few ops CUDA lacks; ORT logs them.
            self._providers: list[Any] = [
                ("CUDAExecutionProvider", {"device_id": gpu_index}),
                "CPUExecutionProvider",
            ]
        else:
            self._providers = ["CPUExecutionProvider"]
        self._ort = ort
        self.device = device
        self.gpu_type = gpu_type or ("cpu" if device == "cpu" else f"cuda:{gpu_index}")
        self.limits = limits
        self._threads = intra_op_threads
        self._timer = timer

    def _session(self, model: Any) -> Any:
        opts = self._ort.SessionOptions()
        opts.intra_op_num_threads = self._threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        return self._ort.InferenceSession(
            model.SerializeToString(), sess_options=opts, providers=self._providers
        )

    def load(self, ref: str) -> LoadedModel:
        """Check path, size and graph; build the whole-model session and profile its atoms."""
        from agent.server.modelcheck import check_model_file
        from agent.server.segments import fold_constants

        model, input_name, dtype, sample_shape = check_model_file(ref, self.limits)
        # Cuts and segments are found on the folded graph (segments.py says why).
        model = fold_constants(model)
        try:
            session = self._session(model)
        except Exception as exc:  # ORT raises its own exception types for bad graphs
            raise ModelRejected(f"onnxruntime cannot load {ref}: {exc}") from exc
        loaded = LoadedModel(
            ref, input_name, dtype, sample_shape, (1.0,), _OrtHandle(model, session)
        )
        self._profile_atoms(loaded)
        return loaded

    def _sample(self, loaded: LoadedModel, batch: int) -> np.ndarray:
        if loaded.sample_shape is None or any(d is None for d in loaded.sample_shape):
            raise ModelRejected(
                f"{loaded.ref}: non-batch input dimensions must be static to profile the model"
            )
        shape = (batch, *[int(d) for d in loaded.sample_shape if d is not None])
        rng = np.random.default_rng(0)
        if np.issubdtype(loaded.input_dtype, np.floating):
            return rng.standard_normal(shape).astype(loaded.input_dtype)
        return np.zeros(shape, dtype=loaded.input_dtype)

    def _time_ms(self, fn: Callable[[], object]) -> float:
        fn()  # warm-up: first runs allocate
        times = []
        for _ in range(self.limits.profile_repeats):
            start = self._timer()
            fn()
            times.append((self._timer() - start) * 1000.0)
        return statistics.median(times)

    def _profile_atoms(self, loaded: LoadedModel) -> None:
        from agent.server.segments import SegmentError, atoms, find_cuts

        handle: _OrtHandle = loaded.handle
        x = self._sample(loaded, 1)
        handle.whole_ms = self._time_ms(lambda: handle.session.run(None, {loaded.input_name: x}))
        try:
            handle.cuts = find_cuts(handle.model)
            pieces = atoms(handle.model) if handle.cuts else []
        except SegmentError:
            pieces = []
        loaded.cuts = len(handle.cuts)
        if len(pieces) < 2:
            handle.atom_costs_ms = [handle.whole_ms]
            return
        handle.atoms = [self._session(p) for p in pieces]
        feed: Feed = {loaded.input_name: x}
        costs = []
        for sess in handle.atoms:
            current = feed
            costs.append(self._time_ms(lambda s=sess, f=current: s.run(None, f)))
            outs = sess.run(None, feed)
            feed = {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}
        handle.atom_costs_ms = costs
        sequential = sum(costs)
        # What a yield point costs: one more ORT call and its input/output copies.
        handle.boundary_cost_ms = max(0.0, sequential - handle.whole_ms) / (len(costs) - 1)

    def known_profile(self, loaded: LoadedModel) -> BatchingProfile | None:
        """ORT has no stored profiles; the server's profile store may."""
        return None

    def profile(self, loaded: LoadedModel) -> BatchingProfile:
        """Median latency at ``limits.profile_batches``, fitted linearly."""
        handle: _OrtHandle = loaded.handle
        samples = []
        for b in self.limits.profile_batches:
            x = self._sample(loaded, b)
            samples.append(
                (b, self._time_ms(lambda x=x: handle.session.run(None, {loaded.input_name: x})))
            )
        return fit_linear_profile(loaded.ref, self.gpu_type, samples, self.limits.max_batch)

    def prepare_segments(self, loaded: LoadedModel, target_ms: float) -> None:
        """Group atoms into segments of about ``target_ms`` at batch 1 and build their sessions."""
        from agent.server.segments import split_model

        handle: _OrtHandle = loaded.handle
        if not handle.atoms:
            handle.segments = [handle.session]
            loaded.segment_fractions = (1.0,)
            return
        ranges = group_segments(handle.atom_costs_ms, target_ms)
        cuts = [handle.cuts[end - 1] for _, end in ranges[:-1]]
        handle.segments = [self._session(p) for p in split_model(handle.model, cuts)]
        total = sum(handle.atom_costs_ms) or 1.0
        loaded.segment_fractions = tuple(sum(handle.atom_costs_ms[s:e]) / total for s, e in ranges)
        loaded.segment_overhead = self._measure_segment_overhead(loaded)

    def _measure_segment_overhead(self, loaded: LoadedModel) -> float:
        """What the segments actually built cost over one whole run, at batch 1."""
        handle: _OrtHandle = loaded.handle
        x = self._sample(loaded, 1)

        def in_sequence() -> None:
            feed: Feed = {loaded.input_name: x}
            for i in range(len(handle.segments)):
                feed = self.run_segment(loaded, i, feed, 0.0)

        whole = self._time_ms(lambda: handle.session.run(None, {loaded.input_name: x}))
        return max(0.0, self._time_ms(in_sequence) - whole) / max(whole, 1e-6)

    def overhead_curve(
        self, loaded: LoadedModel, profile: BatchingProfile, segment_fraction: float = 1.0
    ) -> OverheadCurve:
        """Overhead(Q) = yield points of the segments built for Q (``segment_fraction`` x Q,
        as the runtime builds them) x measured cost per yield / run time."""
        handle: _OrtHandle = loaded.handle
        points = []
        for q in QUANTUM_GRID_MS:
            built = group_segments(handle.atom_costs_ms, q * segment_fraction)
            n = len(built) if handle.atoms else 1
            points.append([q, (n - 1) * handle.boundary_cost_ms / max(handle.whole_ms, 1e-6)])
        return OverheadCurve.from_points(loaded.ref, points)

    def run_batch(self, loaded: LoadedModel, batch: np.ndarray) -> list[np.ndarray]:
        """One ORT run of the whole model."""
        handle: _OrtHandle = loaded.handle
        return list(handle.session.run(None, {loaded.input_name: batch}))

    def run_segment(self, loaded: LoadedModel, index: int, feed: Feed, profiled_ms: float) -> Feed:
        """One ORT run of one segment."""
        handle: _OrtHandle = loaded.handle
        sess = handle.segments[index]
        outs = sess.run(None, feed)
        return {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}
