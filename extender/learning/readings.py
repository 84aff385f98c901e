"""Per-process utilisation that is not a share of its GPU, found and set aside.

The learners read a co-located pod's per-process utilisation (``nvmlDeviceGetProcessUtilization``)
as its share of the GPU: its alone utilisation over that figure is its slowdown, and the
figure is a floor of the pod's own use. Measured on an H100 time-slicing two training
processes (``training_data/nvidia-h100-80gb-hbm3/``, column ``process_util_mean_percent``),
NVML does not report shares: each process showed about the GPU's whole busy figure, the two
summing to 1.84 to 2.08 times the GPU's utilisation in every one of 105 measured pairs
(alone, the figure equals the GPU's). A 16 % job read 97 % beside another. Taken as shares,
such figures read "no slowdown" however much the jobs slowed each other, and raise a light
model's predicted utilisation to the GPU's.

Shares of one GPU's time cannot add up to more than the GPU was busy. A GPU whose
per-process figures add up to more than :data:`SUM_SLACK` times its utilisation plus
:data:`SUM_MARGIN_PERCENT` (sampling noise: the two come from different NVML sample
streams), each at least :data:`NEAR_GPU` of it (as measured), has its processes taken
as if NVML gave no per-process figure: a pod alone on it still teaches through the GPU's
utilisation; shared, it teaches nothing (reason ``per-process-not-shares``). Interference
on such GPUs has to come from a measured matrix (``learning.pair_prior``) or the curve,
not from the agents.
"""

from __future__ import annotations

import math
from dataclasses import replace

from extender.state.reports import DecodedReport

SUM_SLACK = 1.25
SUM_MARGIN_PERCENT = 10.0
NEAR_GPU = 0.6
"""Each figure at least this fraction of the GPU's (measured: 0.78 at the least)."""


def not_shares(gpu_util_percent: float, figures: list[float]) -> bool:
    """True when per-process ``figures`` cannot be shares of a GPU this busy: they add up
    to more than it was busy, each about its whole figure."""
    if len(figures) < 2 or not math.isfinite(gpu_util_percent):
        return False  # one process is the GPU's figure; an unknown total proves nothing
    return (sum(figures) > SUM_SLACK * gpu_util_percent + SUM_MARGIN_PERCENT
            and min(figures) >= NEAR_GPU * gpu_util_percent)


def shares_only(report: DecodedReport) -> tuple[DecodedReport, frozenset[int]]:
    """``report`` with the per-process figures removed where they are not shares, and
    the positions (in ``report.gpus``) of the GPUs that lost them."""
    flagged: set[int] = set()
    processes = []
    for position, (util, procs) in enumerate(zip(report.util_percent, report.processes,
                                                 strict=False)):
        figures = [float(p.util_percent) for p in procs if p.util_percent is not None]
        if not_shares(util, figures):
            flagged.add(position)
            procs = tuple(replace(p, util_percent=None) for p in procs)
        processes.append(procs)
    if not flagged:
        return report, frozenset()
    return replace(report, processes=tuple(processes)), frozenset(flagged)
