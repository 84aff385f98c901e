"""Executors: the only things that run models on the device.

Two implementations, always chosen explicitly:

- ``OrtExecutor``: ONNX Runtime with an explicit provider (CUDA EP on a GPU, CPU
  EP elsewhere). Loads a model from the store after size and path checks (in a
  worker process, ``prepare.py``), profiles it when no batching profile is known,
  splits it into segments for quanta. Every measurement run goes through
  ``device_gate``: the serving runtime makes each one a slice of its loop.
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

from agent.inference.clock import Clock
from agent.inference.errors import ModelRejected
from agent.inference.executors.feeds import Feed, advance, later_inputs, piece_inputs
from agent.inference.preparation.batching_profiles import fit_linear_profile
from agent.inference.preparation.limits import ModelLimits
from agent.inference.quanta import OverheadCurve, group_segments
from predictor.batching import BatchingProfile

DeviceGate = Callable[[Callable[[], Any], float], Any]
"""Runs one device call (``fn``, its expected ms; 0 when unknown) and returns its result."""


def run_inline(fn: Callable[[], Any], expected_ms: float) -> Any:
    """The gate with no serving loop: run now, on the calling thread."""
    return fn()


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
    model: bytes  # the checked, constant-folded onnx.ModelProto, serialized
    session: Any  # onnxruntime.InferenceSession
    atoms: list[Any] = field(default_factory=list)
    """Sessions of the atoms (the graph cut at every valid cut); empty without cuts."""
    atom_costs_ms: list[float] = field(default_factory=list)
    boundary_cost_ms: float = 0.0
    whole_ms: float = 0.0
    segments: list[Any] = field(default_factory=list)
    carried: list[frozenset[str]] = field(default_factory=list)
    """Per segment: what of its feed later segments read (``_advance``)."""


class MeasuredExecutor:
    """What the real executors share: timing through the device gate and the profiling
    arithmetic over atoms (the pieces between valid cuts).

    A subclass sets ``limits``, ``_timer``, ``device_gate`` and ``gpu_type``, and keeps on
    ``loaded.handle`` the ``atom_costs_ms`` (one entry, the whole run, when the model has
    no cut), ``whole_ms`` and ``boundary_cost_ms`` its ``_profile_atoms`` measured.
    """

    limits: ModelLimits
    gpu_type: str
    device_gate: DeviceGate
    _timer: Callable[[], float]

    def _setup(self, device: str, gpu_index: int, gpu_type: str | None, limits: ModelLimits,
               timer: Callable[[], float], prepare_in_process: bool) -> None:
        """The state every real executor keeps: device, GPU type, limits, model worker."""
        from agent.inference.preparation.prepare import ModelPreparer

        self.device = device
        self.gpu_type = gpu_type or ("cpu" if device == "cpu" else f"cuda:{gpu_index}")
        self.limits = limits
        self._timer = timer
        self.preparer = ModelPreparer(prepare_in_process)
        self.device_gate = run_inline
        """How measurement runs reach the device; the serving runtime sets its time slices."""

    def _sync(self) -> None:
        """Wait for the device's queued work (a no-op where runs are synchronous)."""

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

    def _slice(self, fn: Callable[[], Any], expected_ms: float) -> tuple[float, Any]:
        """One device run through the gate, synchronized: (its own duration in ms, result)."""

        def timed() -> tuple[float, Any]:
            start = self._timer()
            out = fn()
            self._sync()
            return (self._timer() - start) * 1000.0, out

        return self.device_gate(timed, expected_ms)

    def _time_ms(self, fn: Callable[[], Any], expected_ms: float = 0.0) -> tuple[float, Any]:
        """Median of ``profile_repeats`` runs after a warm-up, each its own slice; and a result."""
        first, out = self._slice(fn, expected_ms)  # warm-up: first runs allocate
        expected = max(expected_ms, first)
        times = [self._slice(fn, expected)[0] for _ in range(self.limits.profile_repeats)]
        return statistics.median(times), out

    def _fit_chains(self, loaded: LoadedModel,
                    chain_ms: Callable[[np.ndarray, list[float]], list[float]]) -> BatchingProfile:
        """l(b) at ``limits.profile_batches`` from timing the atoms in a chain (one slice
        each, so no slice is longer than an atom), less the yield points, fitted linearly."""
        handle = loaded.handle
        atoms = len(handle.atom_costs_ms)
        samples = []
        for b in self.limits.profile_batches:
            chain = sum(chain_ms(self._sample(loaded, b), [c * b for c in handle.atom_costs_ms]))
            yields = (atoms - 1) * handle.boundary_cost_ms
            samples.append((b, max(chain - yields, chain / atoms)))
        return fit_linear_profile(loaded.ref, self.gpu_type, samples, self.limits.max_batch)

    def known_profile(self, loaded: LoadedModel) -> BatchingProfile | None:
        """No stored profiles here; the server's profile store may have one."""
        return None

    def overhead_curve(
        self, loaded: LoadedModel, profile: BatchingProfile, segment_fraction: float = 1.0
    ) -> OverheadCurve:
        """Overhead(Q) = yield points of the segments built for Q (``segment_fraction`` x Q,
        as the runtime builds them) x measured cost per yield / run time."""
        handle = loaded.handle
        points = []
        for q in QUANTUM_GRID_MS:
            built = group_segments(handle.atom_costs_ms, q * segment_fraction)
            n = len(built) if len(handle.atom_costs_ms) > 1 else 1
            points.append([q, (n - 1) * handle.boundary_cost_ms / max(handle.whole_ms, 1e-6)])
        return OverheadCurve.from_points(loaded.ref, points)


class OrtExecutor(MeasuredExecutor):
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
        prepare_in_process: bool = False,
    ):
        import onnxruntime as ort

        if device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
        if device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise RuntimeError(
                    "--device cuda needs onnxruntime-gpu (CUDAExecutionProvider is not available); "
                    "with a CUDA build of torch, run the graph through it: --executor torch"
                )
            # CPU EP stays as ORT's home for the few ops CUDA lacks; ORT logs them.
            self._providers: list[Any] = [
                ("CUDAExecutionProvider", {"device_id": gpu_index}),
                "CPUExecutionProvider",
            ]
        else:
            self._providers = ["CPUExecutionProvider"]
        self._ort = ort
        self._threads = intra_op_threads
        self._setup(device, gpu_index, gpu_type, limits, timer, prepare_in_process)

    def _session(self, model: bytes) -> Any:
        opts = self._ort.SessionOptions()
        opts.intra_op_num_threads = self._threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        return self._ort.InferenceSession(model, sess_options=opts, providers=self._providers)

    def load(self, ref: str) -> LoadedModel:
        """Check path, size and graph (worker process), build the sessions, time the atoms."""
        prepared = self.preparer.prepare(ref, self.limits)
        try:
            session = self._session(prepared.model)
        except Exception as exc:  # ORT raises its own exception types for bad graphs
            raise ModelRejected(f"onnxruntime cannot load {ref}: {exc}") from exc
        loaded = LoadedModel(
            ref, prepared.input_name, prepared.input_dtype, prepared.sample_shape, (1.0,),
            _OrtHandle(prepared.model, session), cuts=prepared.cuts,
        )  # fmt: skip
        self._profile_atoms(loaded, prepared.atoms)
        return loaded

    def _chain_ms(
        self, loaded: LoadedModel, sessions: list[Any], x: np.ndarray, expected_ms: list[float]
    ) -> list[float]:
        """Median time of each session of a chain fed from ``x``: one slice per run, so a
        long model is measured in pieces no longer than one of its atoms."""
        feed: Feed = {loaded.input_name: x}
        costs = []
        for i, (sess, expected) in enumerate(zip(sessions, expected_ms, strict=True)):
            ins = piece_inputs(sess, feed)
            cost, outs = self._time_ms(lambda s=sess, f=ins: s.run(None, f), expected)
            costs.append(cost)
            feed = advance(sess, outs, feed, later_inputs(sessions, i))
        return costs

    def _profile_atoms(self, loaded: LoadedModel, pieces: tuple[bytes, ...]) -> None:
        handle: _OrtHandle = loaded.handle
        x = self._sample(loaded, 1)
        whole = lambda: handle.session.run(None, {loaded.input_name: x})  # noqa: E731
        if len(pieces) < 2:
            handle.whole_ms = self._time_ms(whole)[0]
            handle.atom_costs_ms = [handle.whole_ms]
            return
        # Sessions are built here (CPU work, no device run); atoms are timed first so
        # that the one whole run has an expected length the serving loop can fit.
        handle.atoms = [self._session(p) for p in pieces]
        costs = self._chain_ms(loaded, handle.atoms, x, [0.0] * len(handle.atoms))
        handle.atom_costs_ms = costs
        handle.whole_ms = self._time_ms(whole, sum(costs))[0]
        # What a yield point costs: one more ORT call and its input/output copies.
        handle.boundary_cost_ms = max(0.0, sum(costs) - handle.whole_ms) / (len(costs) - 1)

    def profile(self, loaded: LoadedModel) -> BatchingProfile:
        """Median latency at ``limits.profile_batches``, fitted linearly.

        A model with atoms is timed atom by atom (each run one device slice, so the
        serving loop is never held for a whole batch of a slow model); l(b) is their
        sum less the yield points measured at batch 1.
        """
        handle: _OrtHandle = loaded.handle
        if handle.atoms:
            return self._fit_chains(
                loaded, lambda x, expected: self._chain_ms(loaded, handle.atoms, x, expected))
        samples = []
        for b in self.limits.profile_batches:
            x = self._sample(loaded, b)
            run = lambda x=x: handle.session.run(None, {loaded.input_name: x})  # noqa: E731
            samples.append((b, self._time_ms(run, handle.whole_ms * b)[0]))
        return fit_linear_profile(loaded.ref, self.gpu_type, samples, self.limits.max_batch)

    def prepare_segments(self, loaded: LoadedModel, target_ms: float) -> None:
        """Group atoms into segments of about ``target_ms`` at batch 1 and build their sessions."""
        handle: _OrtHandle = loaded.handle
        if not handle.atoms:
            handle.segments = [handle.session]
            loaded.segment_fractions = (1.0,)
            return
        ranges = group_segments(handle.atom_costs_ms, target_ms)
        ends = [end - 1 for _, end in ranges[:-1]]  # the cut after atom ``end - 1``
        pieces = self.preparer.split(loaded.ref, handle.model, ends)
        handle.segments = [self._session(p) for p in pieces]
        handle.carried = [later_inputs(handle.segments, i) for i in range(len(pieces))]
        total = sum(handle.atom_costs_ms) or 1.0
        loaded.segment_fractions = tuple(sum(handle.atom_costs_ms[s:e]) / total for s, e in ranges)
        loaded.segment_overhead = self._measure_segment_overhead(loaded, ranges)

    def _measure_segment_overhead(
        self, loaded: LoadedModel, ranges: list[tuple[int, int]]
    ) -> float:
        """What the segments actually built cost over one whole run, at batch 1."""
        handle: _OrtHandle = loaded.handle
        x = self._sample(loaded, 1)
        expected = [sum(handle.atom_costs_ms[s:e]) for s, e in ranges]
        in_sequence = sum(self._chain_ms(loaded, handle.segments, x, expected))
        whole, _ = self._time_ms(
            lambda: handle.session.run(None, {loaded.input_name: x}), handle.whole_ms
        )
        return max(0.0, in_sequence - whole) / max(whole, 1e-6)

    def run_batch(self, loaded: LoadedModel, batch: np.ndarray) -> list[np.ndarray]:
        """One ORT run of the whole model."""
        handle: _OrtHandle = loaded.handle
        return list(handle.session.run(None, {loaded.input_name: batch}))

    def run_segment(self, loaded: LoadedModel, index: int, feed: Feed, profiled_ms: float) -> Feed:
        """One ORT run of one segment."""
        handle: _OrtHandle = loaded.handle
        sess = handle.segments[index]
        outs = sess.run(None, piece_inputs(sess, feed))
        carried = handle.carried[index] if handle.carried else frozenset()
        return advance(sess, outs, feed, carried)

