"""Workload generators; every parameter names its source or says it is assumed.

``w-small`` / ``w-large`` reproduce the Horus testbed mixes (TPDS'21 §5.2):
100 single-GPU jobs (the paper trains single-GPU jobs only, since over half of
production jobs need one GPU), durations "between 3 minutes to 2 hours", split
into short/long at 800 s and light/heavy at 60% GPU utilisation. The paper does
not publish the class proportions, only that W-Small has "a higher proportion of
short and small jobs" and W-Large "longer and heavier jobs" (§6.1); the shares
below are therefore **assumed** (70/30 versus 30/70).

``production`` follows the month-long production trace of Horus §2.1 / Fig. 1
(398 jobs, a 500+ machine cluster): per-job utilisation averaging 51% with half
the jobs at or below 60%, and JCT averaging about 500 min with half at or below
300 min. GPUs per job: more than 50% of production jobs need a single GPU
(Horus §5.2, citing Philly [9] and Tiresias [26]); the multi-GPU shares beyond
that are **assumed**. Arrivals are Poisson at an offered load (GPU-seconds
demanded per GPU-second available over the arrival window): **assumed** 2.0,
which gives the multi-hour queues Horus reports (§2.1: 4,000-8,000 s).
Durations are log-normal with the paper's median and mean, clipped to
[60 s, 2 days] (**assumed** cap, so that makespan measures the backlog rather
than a single straggler).

Shared by both: GPU memory per job is **assumed** (no per-job GPU-memory
distribution is readable from here: the PAI 2020 sensor table is on Aliyun OSS,
see research notes §4.2); utilisation predictions carry a log-normal error with
sigma 0.133, the RMSLE of Horus's XGBoost predictor (Table 4); memory estimates
are 0-15% *below* the truth, since Eq. 2 is a minimum estimate (§4.1.2) - the
amount is **assumed**. These two errors are what make OOM events possible.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from lab.simulator.jobs import SimJob

GPU_MEMORY_MIB = 8192.0
"""Memory of the paper's cards (RTX 2080, GTX 1080), used to size job memory."""
UTIL_RMSLE = 0.133
"""Horus Table 4: XGBoost RMSLE of predicted utilisation."""
SHORT_LONG_SPLIT_S = 800.0
LIGHT_HEAVY_SPLIT_PERCENT = 60.0


class WorkloadError(ValueError):
    """Unknown workload name or bad generator parameter."""


@dataclass(frozen=True)
class MixSpec:
    """A testbed mix: job count, class shares and the arrival rate."""

    jobs: int
    short_share: float
    light_share: float
    mean_interarrival_s: float
    """Assumed: all 100 jobs submitted within about an hour (36 s apart on average)."""


W_SMALL = MixSpec(jobs=100, short_share=0.7, light_share=0.6, mean_interarrival_s=36.0)
W_LARGE = MixSpec(jobs=100, short_share=0.3, light_share=0.4, mean_interarrival_s=36.0)
PRODUCTION_GPU_SHARES = {1: 0.55, 2: 0.15, 4: 0.15, 8: 0.10, 16: 0.05}
PRODUCTION_JCT_MEDIAN_S = 300 * 60.0
PRODUCTION_JCT_MEAN_S = 500 * 60.0
PRODUCTION_MAX_DURATION_S = 2 * 86400.0
"""Assumed cap: a finite trace's makespan would otherwise be one straggler's length."""
PRODUCTION_LOAD = 2.0
PRODUCTION_UTIL_BETA = (2.0, 1.92)
"""Beta(2, 1.92): mean 0.51, median 0.51 (<= 0.60), matching Horus Fig. 1."""


def _predictions(rng: np.random.Generator, util: float, mem: float) -> tuple[float, float]:
    pred_util = math.exp(math.log1p(util) + rng.normal(0.0, UTIL_RMSLE)) - 1.0
    pred_mem = mem * rng.uniform(0.85, 1.0)
    return round(min(100.0, max(1.0, pred_util)), 2), round(pred_mem, 1)


def _memory_for(rng: np.random.Generator, util: float) -> float:
    # Assumed: heavier jobs tend to hold more memory; 10%-65% of an 8 GiB card.
    low, high = (0.10, 0.40) if util < LIGHT_HEAVY_SPLIT_PERCENT else (0.25, 0.65)
    return round(GPU_MEMORY_MIB * rng.uniform(low, high), 1)


def testbed_mix(spec: MixSpec, seed: int) -> list[SimJob]:
    """W-Small / W-Large style single-GPU jobs (see module docstring)."""
    rng = np.random.default_rng(seed)
    jobs: list[SimJob] = []
    t = 0.0
    for i in range(spec.jobs):
        short = rng.random() < spec.short_share
        light = rng.random() < spec.light_share
        duration = (rng.uniform(180.0, SHORT_LONG_SPLIT_S) if short
                    else math.exp(rng.uniform(math.log(SHORT_LONG_SPLIT_S), math.log(7200.0))))
        util = rng.uniform(10.0, LIGHT_HEAVY_SPLIT_PERCENT) if light else rng.uniform(60.0, 95.0)
        mem = _memory_for(rng, util)
        pred_util, pred_mem = _predictions(rng, util, mem)
        jobs.append(SimJob(
            id=f"job-{i:05d}", arrival_s=round(t, 3), duration_s=round(duration, 1),
            util_percent=round(util, 2), mem_mib=mem, predicted_util_percent=pred_util,
            predicted_mem_mib=pred_mem,
            kind=f"{'short' if short else 'long'}-{'light' if light else 'heavy'}"))
        t += rng.exponential(spec.mean_interarrival_s)
    return jobs


def production(seed: int, jobs: int = 2000, gpus: int = 1024,
               load: float = PRODUCTION_LOAD) -> list[SimJob]:
    """Production-like trace sized for a cluster of ``gpus`` GPUs (see module docstring)."""
    if jobs < 1 or gpus < 1 or not load > 0:
        raise WorkloadError("production: jobs, gpus and load must be positive")
    rng = np.random.default_rng(seed)
    sizes = np.array(list(PRODUCTION_GPU_SHARES))
    shares = np.array(list(PRODUCTION_GPU_SHARES.values()))
    total_gpus = rng.choice(sizes, size=jobs, p=shares / shares.sum())
    # Log-normal with the paper's median and mean: mean/median = exp(sigma^2 / 2).
    sigma = math.sqrt(2.0 * math.log(PRODUCTION_JCT_MEAN_S / PRODUCTION_JCT_MEDIAN_S))
    durations = np.clip(rng.lognormal(math.log(PRODUCTION_JCT_MEDIAN_S), sigma, size=jobs),
                        60.0, PRODUCTION_MAX_DURATION_S)
    utils = np.clip(100.0 * rng.beta(*PRODUCTION_UTIL_BETA, size=jobs), 1.0, 100.0)
    window = float((durations * total_gpus).sum()) / (gpus * load)
    arrivals = np.sort(rng.uniform(0.0, window, size=jobs))
    out: list[SimJob] = []
    for i in range(jobs):
        g = int(total_gpus[i])
        per_task = min(g, 8)
        util = float(utils[i])
        mem = _memory_for(rng, util)
        pred_util, pred_mem = _predictions(rng, util, mem)
        out.append(SimJob(
            id=f"job-{i:05d}", arrival_s=round(float(arrivals[i]), 3),
            duration_s=round(float(durations[i]), 1), tasks=g // per_task, gpus_per_task=per_task,
            util_percent=round(util, 2), mem_mib=mem, predicted_util_percent=pred_util,
            predicted_mem_mib=pred_mem, kind=f"{g}gpu"))
    return out


WORKLOADS: dict[str, Callable[[int], list[SimJob]]] = {
    "w-small": lambda seed: testbed_mix(W_SMALL, seed),
    "w-large": lambda seed: testbed_mix(W_LARGE, seed),
    "production": lambda seed: production(seed),
}
DEFAULT_CLUSTER = {"w-small": "testbed", "w-large": "testbed", "production": "large"}


def generate(name: str, seed: int) -> list[SimJob]:
    """Jobs of the named workload; unknown names list the valid ones."""
    try:
        factory = WORKLOADS[name]
    except KeyError:
        raise WorkloadError(f"unknown workload {name!r} (valid: {', '.join(WORKLOADS)})") from None
    return factory(seed)


def with_models(jobs: list[SimJob], models: int) -> list[SimJob]:
    """The jobs grouped into ``models`` models (``model-00`` ...) by true utilisation.

    Jobs are sorted by utilisation and cut into equal groups; each group is one
    model, and every job of it takes the model's numbers: utilisation the group's
    mean, memory the group's largest, predicted numbers equal to these (so the
    trace, the default truth, equals the prior, and a truth file says how the
    world differs from it). Arrival times, durations and GPU counts are kept."""
    if models < 1:
        raise WorkloadError("models must be >= 1")
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].util_percent, jobs[i].id))
    out = list(jobs)
    for k, group in enumerate(np.array_split(np.array(order, dtype=np.int64), models)):
        if group.size == 0:
            continue
        util = round(float(np.mean([jobs[i].util_percent for i in group])), 2)
        mem = max(jobs[i].mem_mib for i in group)
        for i in group.tolist():
            out[i] = replace(jobs[i], util_percent=util, mem_mib=mem, predicted_util_percent=util,
                             predicted_mem_mib=mem, model=f"model-{k:02d}")
    return out


def with_named_models(jobs: list[SimJob], names: list[str], seed: int) -> list[SimJob]:
    """Each job trains one of ``names``, drawn uniformly with ``seed`` (``--models truth``).

    Every job of a model then takes the model's numbers, as :func:`with_models` does:
    utilisation the mean of its jobs', memory their largest, predictions equal to
    these. Arrival times, durations and GPU counts are kept."""
    if not names:
        raise WorkloadError("the truth names no models to draw from")
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, len(names), size=len(jobs))
    out = list(jobs)
    for k, name in enumerate(names):
        group = np.flatnonzero(drawn == k).tolist()
        if not group:
            continue
        util = round(float(np.mean([jobs[i].util_percent for i in group])), 2)
        mem = max(jobs[i].mem_mib for i in group)
        for i in group:
            out[i] = replace(jobs[i], util_percent=util, mem_mib=mem, predicted_util_percent=util,
                             predicted_mem_mib=mem, model=name)
    return out
