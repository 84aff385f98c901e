"""What a simulated agent's NVML would show for a job: the signal model (``signal:``).

A real agent sees each process's SM utilisation, never its slowdown. How the
one follows the other depends on the job: a compute-bound job issues kernels
at its progress rate, so its utilisation drops in proportion to its slowdown; a
memory-bound job keeps its SMs occupied while it waits, so its utilisation
drops less. Measured on an H100 time-slicing two training processes
(``training_data/nvidia-h100-80gb-hbm3/``), NVML gave neither: each process showed about
the GPU's whole busy figure (``time-sliced``). The truth file chooses (the extender's
learners are never told)::

    signal:
      model: proportional      # util / slowdown (default) | sub-proportional: util / sqrt(slowdown)
                               # | time-sliced: the GPU's utilisation, for every process on it
                               # | progress: time-sliced, and each pod's steps per second

``progress`` is what real GPUs give a tandem that reads the jobs' own counters
(``tandem.io/progress``): NVML as ``time-sliced``, and per pod its step rate, its
alone rate over its true slowdown times lognormal noise of :data:`PROGRESS_NOISE_SD` on
the log (the H100 retest's spread of one measurement). ``proportional`` and
``sub-proportional`` are counterfactuals: no measured GPU shows per-process shares.

The reported figure is ``util / slowdown ** p`` (``p`` 1 or 0.5) on a shared GPU, or the
GPU's utilisation (``time-sliced``),
times the job's phase factor (warm-up, evaluation: the truth's ``phases:``), plus
the truth's Gaussian noise (``noise.util_stddev_percent``), clipped to 0..100.
With the default (proportional) the figures are those of earlier releases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SIGNAL_MODELS = {"proportional": 1.0, "sub-proportional": 0.5, "time-sliced": 0.0,
                 "progress": 0.0}
"""Each model's ``p`` in ``util / slowdown ** p`` (``time-sliced`` and ``progress`` show
the GPU's figure)."""
PROGRESS_NOISE_SD = 0.066
"""Spread of one progress measurement's log step time (the H100 retest,
``benchmarks/results/h100_pairs_retest/``)."""
TIME_SLICED = ("time-sliced", "progress")
SIGNAL_KEYS = ("model",)


@dataclass(frozen=True)
class SignalModel:
    """How true utilisation and slowdown become the utilisation an agent reports."""

    model: str = "proportional"

    @property
    def exponent(self) -> float:
        """``p`` in ``util / slowdown ** p``."""
        return SIGNAL_MODELS[self.model]

    def shown(self, util_percent: float, scale: float, shared_slowdown: float | None,
              gpu_util_percent: float = 100.0) -> float:
        """Noise-free utilisation NVML shows for a job in its steady state (percent).

        ``scale``: the job's share when its GPU's jobs together ask for more than 100%
        (used alone); ``shared_slowdown``: its slowdown on a shared GPU (None: alone);
        ``gpu_util_percent``: the shared GPU's utilisation (``time-sliced``)."""
        if shared_slowdown is not None and self.model in TIME_SLICED:
            return gpu_util_percent
        if shared_slowdown is not None:
            s = max(shared_slowdown, 1.0)
            scale = 1.0 / s if self.exponent == 1.0 else 1.0 / math.sqrt(s)
        return util_percent * scale

    @property
    def tells_slowdown(self) -> bool:
        """True unless ``time-sliced``: the simulated pods then name a progress counter
        (``progress``; the per-process counterfactuals stand for one), so decisions may
        place them by learned pair figures (``extender.core.pair_cost``)."""
        return self.model != "time-sliced"

    @property
    def progress(self) -> bool:
        """True when the agents report each pod's steps per second."""
        return self.model == "progress"


def parse_signal(raw: Any, path: str, problems: list[str]) -> SignalModel:
    """Validate the ``signal:`` section (absent: proportional)."""
    if raw is None:
        return SignalModel()
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: must be a mapping with keys from {', '.join(SIGNAL_KEYS)}")
        return SignalModel()
    problems += [f"{path}.{k}: unknown key (valid: {', '.join(SIGNAL_KEYS)})"
                 for k in raw if k not in SIGNAL_KEYS]
    model = raw.get("model", "proportional")
    if model not in SIGNAL_MODELS:
        problems.append(f"{path}.model: must be one of {', '.join(SIGNAL_MODELS)}, got {model!r}")
        model = "proportional"
    return SignalModel(str(model))
