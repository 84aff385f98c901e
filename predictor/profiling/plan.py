"""Choosing co-located combinations that span a cumulative-utilisation range.

Horus fits interference curves over cumulative isolated utilisation: linear below
100 %, quadratic above. A random draw of pairs would crowd the middle and leave
the tails thin, so candidates are bucketed by cumulative utilisation and taken
round-robin across buckets. Everything depends only on the isolated rows and the
seed, so a resumed campaign chooses the same combinations again.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

from predictor.profiling.backend import JobSpec

N_BUCKETS = 11
_DRAWS_PER_TARGET = 60


@dataclass(frozen=True)
class IsolatedBaseline:
    """An ok isolated run, the reference a co-located job is compared with."""

    job: JobSpec
    util_percent: float
    step_time_ms: float
    mem_mib: float


@dataclass(frozen=True)
class Combo:
    """Jobs run together on one GPU, in canonical order, with their isolated baselines."""

    members: tuple[IsolatedBaseline, ...]

    @property
    def combo_id(self) -> str:
        """Deterministic id: a digest of the sorted member keys (resume uses it)."""
        text = "+".join(m.job.key for m in self.members)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def cumulative_util_percent(self) -> float:
        """Sum of the members' isolated utilisation."""
        return sum(m.util_percent for m in self.members)

    @property
    def jobs(self) -> tuple[JobSpec, ...]:
        """The members' job specs, in job_index order."""
        return tuple(m.job for m in self.members)


def make_combo(members: Iterable[IsolatedBaseline]) -> Combo:
    """A combo with its members in canonical (key) order."""
    return Combo(tuple(sorted(members, key=lambda m: m.job.key)))


def baselines_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[IsolatedBaseline]:
    """Isolated baselines from parsed isolated.csv rows with status ok (sorted by key)."""
    out: dict[str, IsolatedBaseline] = {}
    for row in rows:
        if row.get("status") != "ok":
            continue
        job = JobSpec(str(row["model"]), str(row["family"]), row["workload"],
                      int(row["batch_size"]))  # fmt: skip
        mem = row.get("mem_used_nvml_mib") or row.get("mem_peak_framework_mib") or 0.0
        out[job.key] = IsolatedBaseline(job, float(row["util_mean_percent"]),
                                        float(row["step_time_ms"]), float(mem))  # fmt: skip
    return [out[k] for k in sorted(out)]


def choose_combos(
    baselines: Sequence[IsolatedBaseline],
    size: int,
    count: int,
    seed: int,
    util_range_percent: tuple[float, float],
    memory_limit_mib: float,
    exclude: Iterable[str] = (),
) -> list[Combo]:
    """Up to ``count`` new combos of ``size`` jobs spread over the utilisation range."""
    if count <= 0 or len(baselines) < size:
        return []
    lo, hi = util_range_percent
    width = (hi - lo) / N_BUCKETS
    excluded = set(exclude)
    buckets: list[list[Combo]] = [[] for _ in range(N_BUCKETS)]
    seen: set[str] = set()
    # Seed mixes in the size so pairs and triples draw independent streams.
    rng = random.Random(seed * 7919 + size)
    pool = list(baselines)
    total = comb(len(pool), size)
    if total <= count * _DRAWS_PER_TARGET:
        candidates: Iterable[tuple[IsolatedBaseline, ...]] = list(
            itertools.combinations(pool, size)
        )
        rng.shuffle(candidates)  # type: ignore[arg-type]
    else:
        candidates = (tuple(rng.sample(pool, size)) for _ in range(count * _DRAWS_PER_TARGET))
    for members in candidates:
        combo = make_combo(members)
        cid = combo.combo_id
        if cid in seen or cid in excluded:
            continue
        seen.add(cid)
        util = combo.cumulative_util_percent
        mem = sum(m.mem_mib for m in combo.members)
        if not lo <= util <= hi or mem > memory_limit_mib:
            continue
        buckets[min(int((util - lo) / width), N_BUCKETS - 1)].append(combo)
    chosen: list[Combo] = []
    while len(chosen) < count and any(buckets):
        for bucket in buckets:
            if bucket and len(chosen) < count:
                chosen.append(bucket.pop(0))
    return chosen
