"""The simulated world's ground truth, kept apart from what the scheduler believes.

A job's *belief* is what the extender would know before running it (its
``predicted_*`` numbers: the prior, standing in for the trained model and the
Eq. 2 memory estimate). Its *truth* is what the GPUs actually do. Without a
truth file the truth is the trace itself (each job's ``util_percent`` and
``mem_mib``) and the interference is the paper's model
(:mod:`lab.simulator.interference`), so results are exactly those of a run
without one. A truth file (``tandem simulate --truth FILE``, YAML) overrides
parts of it::

    noise:
      util_stddev_percent: 2.0   # measurement noise of an agent's sample (>= 0)
      seed: 1                    # seed of that noise
    models:                      # by the trace's ``model`` field
      resnet50:
        util_percent: 62.0       # every GPU type, or {<gpu type>: 62.0, ...}
        mem_mib: 3100            # every GPU type, or {<gpu type>: 3100, ...}
      bert-base:
        util_factor: 1.3         # true = the trace's utilisation x factor (capped at 100)
    curves:                      # per GPU type, the predictor.curves config form
      NVIDIA-GeForce-RTX-2080: {slope: 0.3, over_slope: 0.6, over_quadratic: 0.9}
    phases:                      # what the agents measure besides the steady state
      warmup_seconds: 60         # each job's first seconds (loading, compiling) ...
      warmup_util_factor: 0.05   # ... at this fraction of its utilisation
      eval_every_seconds: 600    # an evaluation phase every so often ...
      eval_seconds: 30           # ... this long ...
      eval_util_factor: 0.2      # ... at this fraction of its utilisation
    interference:                # per GPU type, measured pairs (lab.simulator.pairwise)
      NVIDIA-Tesla-P100:
        slowdown: {LM-bs5: {ResNet-50-bs64: 3.56}, ResNet-50-bs64: {LM-bs5: 1.25}}
        cannot_share: [[LM-bs80, CycleGAN]]
    signal: {model: proportional}   # what agents show (lab.simulator.signal)

A model's utilisation is given by ``util_percent`` or ``util_factor``, not both;
a GPU type a per-type mapping leaves out keeps the trace's number. Jobs whose
model the file does not name keep the trace's numbers; GPU types without a curve
keep the paper's interference. A truth curve's slowdown is ``1 + cost`` where two
or more jobs share a GPU, uncapped (the curve is the truth). Phases change only
what the agents report (:func:`lab.simulator.agents.phase_factor`), not the
jobs' progress or interference: a job's true utilisation is its steady one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from contracts.interferencefile import PairTable, interference_document, parse_interference
from contracts.profilefile import ProfileFileError, load_yaml
from lab.simulator.interference import SlowdownModel
from lab.simulator.jobs import SimJob
from lab.simulator.signal import SignalModel, parse_signal
from predictor.curves import InterferenceCurve, coefficient_table, curve_costs, parse_curves

TOP_KEYS = ("noise", "models", "curves", "phases", "interference", "signal")
PHASE_KEYS = ("warmup_seconds", "warmup_util_factor", "eval_every_seconds", "eval_seconds",
              "eval_util_factor")
MODEL_KEYS = ("util_percent", "util_factor", "mem_mib")
NOISE_KEYS = ("util_stddev_percent", "seed")


class TruthError(ValueError):
    """A truth file cannot be used; ``problems`` lists every one with its path."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class ModelTruth:
    """One model's true per-GPU utilisation and memory (None: the trace's own)."""

    util_percent: Mapping[str | None, float] = field(default_factory=dict)
    """Per GPU type; the key None applies to every type."""
    util_factor: float | None = None
    mem_mib: Mapping[str | None, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Phases:
    """A job's measured signal besides its steady state: warm-up and evaluation phases."""

    warmup_seconds: float = 0.0
    warmup_util_factor: float = 1.0
    eval_every_seconds: float = 0.0
    """0: no evaluation phases."""
    eval_seconds: float = 0.0
    eval_util_factor: float = 1.0


@dataclass(frozen=True)
class Truth:
    """What the simulated GPUs really do (module docstring)."""

    models: Mapping[str, ModelTruth] = field(default_factory=dict)
    curves: Mapping[str, InterferenceCurve] = field(default_factory=dict)
    util_stddev_percent: float = 2.0
    seed: int = 1
    phases: Phases = Phases()
    interference: Mapping[str, PairTable] = field(default_factory=dict)
    """Measured pairs per GPU type (:mod:`lab.simulator.pairwise`)."""
    signal: SignalModel = SignalModel()
    """What the agents show of a job's utilisation (:mod:`lab.simulator.signal`)."""

    def util_of(self, job: SimJob, gpu_type: str) -> float:
        """True utilisation of one GPU of ``job`` on ``gpu_type`` (percent)."""
        m = self.models.get(job.model)
        if m is None:
            return job.util_percent
        value = _per_type(m.util_percent, gpu_type)
        if value is not None:
            return value
        if m.util_factor is not None:
            return min(100.0, job.util_percent * m.util_factor)
        return job.util_percent

    def mem_of(self, job: SimJob, gpu_type: str) -> float:
        """True memory of one GPU of ``job`` on ``gpu_type`` (MiB)."""
        m = self.models.get(job.model)
        value = None if m is None else _per_type(m.mem_mib, gpu_type)
        return job.mem_mib if value is None else value

    def slowdown_model(self, name: str, type_names: Sequence[str]) -> SlowdownModel:
        """The engine's interference: the paper's, with this truth's curves where given."""
        paper = SlowdownModel.for_types(name, type_names)
        if not any(t in self.curves for t in type_names):
            return paper
        return CurveSlowdown(paper.name, paper.coeffs, paper,
                             np.array([t in self.curves for t in type_names], dtype=bool),
                             coefficient_table([self.curves.get(t, InterferenceCurve())
                                                for t in type_names]))


def _per_type(values: Mapping[str | None, float], gpu_type: str) -> float | None:
    return values.get(gpu_type, values.get(None))


@dataclass(frozen=True)
class CurveSlowdown(SlowdownModel):
    """Paper slowdown for some types, a truth curve's ``1 + cost`` for the others."""

    paper: SlowdownModel | None = None
    has_curve: np.ndarray | None = None
    curve_coeffs: np.ndarray | None = None

    def slowdown(self, util_sum_percent: np.ndarray, jobs: np.ndarray,
                 type_ids: np.ndarray) -> np.ndarray:
        """Slowdown of every job on each given GPU (1.0 where it runs alone)."""
        assert self.paper is not None and self.has_curve is not None
        assert self.curve_coeffs is not None
        paper = self.paper.slowdown(util_sum_percent, jobs, type_ids)
        curve = np.maximum(1.0 + curve_costs(util_sum_percent, self.curve_coeffs[type_ids]), 1.0)
        return np.where(self.has_curve[type_ids], np.where(jobs >= 2, curve, 1.0), paper)


def _number(value: Any, path: str, problems: list[str], low: float, high: float,
            low_open: bool = False) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        problems.append(f"{path}: must be a finite number, got {value!r}")
        return None
    if value > high or value < low or (low_open and value == low):
        bound = f"({low:g}" if low_open else f"[{low:g}"
        problems.append(f"{path}: must be within {bound}, {high:g}], got {value!r}")
        return None
    return float(value)


def _per_type_values(raw: Any, path: str, problems: list[str], high: float
                     ) -> dict[str | None, float]:
    if isinstance(raw, Mapping):
        out: dict[str | None, float] = {}
        for k, v in raw.items():
            value = _number(v, f"{path}.{k}", problems, 0.0, high)
            if value is not None:
                out[str(k)] = value
        return out
    value = _number(raw, path, problems, 0.0, high)
    return {} if value is None else {None: value}


def _model(raw: Any, path: str, problems: list[str]) -> ModelTruth:
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: must be a mapping with keys from {', '.join(MODEL_KEYS)}")
        return ModelTruth()
    for key in raw:
        if key not in MODEL_KEYS:
            problems.append(f"{path}.{key}: unknown key (valid: {', '.join(MODEL_KEYS)})")
    if "util_percent" in raw and "util_factor" in raw:
        problems.append(f"{path}: give util_percent or util_factor, not both")
    util = _per_type_values(raw["util_percent"], f"{path}.util_percent", problems, 100.0) \
        if "util_percent" in raw else {}
    factor = _number(raw["util_factor"], f"{path}.util_factor", problems, 0.0, 100.0,
                     low_open=True) if "util_factor" in raw else None
    mem = _per_type_values(raw["mem_mib"], f"{path}.mem_mib", problems, 1e9) \
        if "mem_mib" in raw else {}
    return ModelTruth(util, factor, mem)


def parse_truth(raw: Any, path: str = "truth") -> Truth:
    """Validate a truth document; raises TruthError listing every problem with its path."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise TruthError([f"{path}: must be a mapping with keys from {', '.join(TOP_KEYS)}"])
    problems: list[str] = [f"{path}.{k}: unknown key (valid: {', '.join(TOP_KEYS)})"
                           for k in raw if k not in TOP_KEYS]
    noise = raw.get("noise") or {}
    sd, seed = 2.0, 1
    if not isinstance(noise, Mapping):
        problems.append(f"{path}.noise: must be a mapping with keys from {', '.join(NOISE_KEYS)}")
        noise = {}
    problems += [f"{path}.noise.{k}: unknown key (valid: {', '.join(NOISE_KEYS)})"
                 for k in noise if k not in NOISE_KEYS]
    if "util_stddev_percent" in noise:
        sd = _number(noise["util_stddev_percent"], f"{path}.noise.util_stddev_percent",
                     problems, 0.0, 100.0) or 0.0
    if "seed" in noise:
        value = noise["seed"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.append(f"{path}.noise.seed: must be an integer >= 0, got {value!r}")
        else:
            seed = value
    models_raw = raw.get("models") or {}
    models: dict[str, ModelTruth] = {}
    if not isinstance(models_raw, Mapping):
        problems.append(f"{path}.models: must be a mapping of model name to its truth")
    else:
        models = {str(k): _model(v, f"{path}.models.{k}", problems) for k, v in models_raw.items()}
    curves = parse_curves(raw.get("curves"), f"{path}.curves", problems)
    phases = _phases(raw.get("phases") or {}, f"{path}.phases", problems)
    pairs = parse_interference(raw.get("interference"), f"{path}.interference", problems)
    signal = parse_signal(raw.get("signal"), f"{path}.signal", problems)
    if problems:
        raise TruthError(problems)
    return Truth(models, curves, sd, seed, phases, pairs, signal)


def _phases(raw: Any, path: str, problems: list[str]) -> Phases:
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: must be a mapping with keys from {', '.join(PHASE_KEYS)}")
        return Phases()
    problems += [f"{path}.{k}: unknown key (valid: {', '.join(PHASE_KEYS)})"
                 for k in raw if k not in PHASE_KEYS]
    values = {k: _number(raw[k], f"{path}.{k}", problems, 0.0,
                         1.0 if k.endswith("factor") else 1e9)
              for k in PHASE_KEYS if k in raw}
    return Phases(**{k: float(v) for k, v in values.items() if v is not None})


def load_truth(file: Path) -> Truth:
    """Read and validate a truth YAML file (a key written twice in one mapping is refused,
    as in every file tandem reads)."""
    try:
        text = file.read_text()
    except OSError as exc:
        raise TruthError([f"{file}: cannot read: {exc.strerror}"]) from None
    try:
        raw = load_yaml(text, str(file))
    except ProfileFileError as exc:
        raise TruthError([f"{file}: not valid YAML: {'; '.join(exc.problems)}"]) from None
    return parse_truth(raw, str(file))


def factor_truth(models: Sequence[str], low: float, high: float, seed: int,
                 util_stddev_percent: float = 2.0) -> Truth:
    """A truth where each model's utilisation is its prior x a factor drawn in [low, high]."""
    rng = np.random.default_rng(seed)
    names = sorted(set(models))
    factors = rng.uniform(low, high, size=len(names))
    return Truth({m: ModelTruth(util_factor=round(float(f), 3)) for m, f in zip(
        names, factors, strict=True)}, {}, util_stddev_percent, seed)


def truth_document(truth: Truth) -> dict[str, Any]:
    """The YAML document of ``truth`` (reads back equal through :func:`parse_truth`)."""
    def per_type(values: Mapping[str | None, float]) -> Any:
        return values[None] if set(values) == {None} else {str(k): v for k, v in values.items()}

    models: dict[str, Any] = {}
    for name, m in truth.models.items():
        entry: dict[str, Any] = {}
        if m.util_percent:
            entry["util_percent"] = per_type(m.util_percent)
        if m.util_factor is not None:
            entry["util_factor"] = m.util_factor
        if m.mem_mib:
            entry["mem_mib"] = per_type(m.mem_mib)
        models[name] = entry
    doc: dict[str, Any] = {
        "noise": {"util_stddev_percent": truth.util_stddev_percent, "seed": truth.seed},
        "models": models, "curves": {t: c.to_config() for t, c in truth.curves.items()}}
    if truth.phases != Phases():
        doc["phases"] = dict(truth.phases.__dict__)
    if truth.interference:
        doc["interference"] = interference_document(truth.interference)
    if truth.signal != SignalModel():
        doc["signal"] = {"model": truth.signal.model}
    return doc


def truth_models(truth: Truth) -> list[str]:
    """Every model the truth names (``models:`` and ``interference:``), sorted."""
    names = set(truth.models)
    for table in truth.interference.values():
        names.update(table.models())
    return sorted(names)
