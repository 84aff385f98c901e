"""A Lucid-style share score: may a pod without progress share a GPU, by its alone profile.

Lucid (Hu et al., "Lucid: A Non-intrusive, Scalable and Interpretable Scheduler for Deep
Learning Training Jobs", ASPLOS'23) profiles each job briefly alone; its Packing Analyze
Model turns the profile into one of three sharing tiers (tiny, medium, jumbo: 0, 1, 2),
and two jobs are packed only if their tiers sum to at most 2 and they fit in memory.

Taken from it: an integer score per job from what is known of it alone, and the rule
that a GPU takes another training pod only while its pods' scores sum to at most a limit
(``limits.max_share_score``; ``null``, the default, switches it off).

Not taken: Lucid's decision tree and its labels (it labels each job by its measured speed
beside others, which a pod without progress never gives here), GPU memory-bandwidth
utilisation (agents report none per pod), memory as a score input (the memory rules
already refuse what does not fit, and on the measured H100 every job holds under 8% of
the GPU), and Lucid's priorities and adaptive sharing. The tiers are fixed thirds of the
GPU's alone utilisation: a job using under a third of the GPU alone is tiny, over two
thirds jumbo. The utilisation is the pod's resolved demand: observed alone by the agents
(``observed:<n>``) where they have, else predicted.

It judges only where learned pairs cannot: where the pod, or a training pod on the GPU,
names no progress counter (``tandem.io/progress``). ``benchmarks/share_score.py`` judges it
on the measured H100 pairs; docs/interference.md ("Pods without progress") says what it found.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from extender.core.table import GpuTable

TIERS = (100.0 / 3.0, 200.0 / 3.0)
"""Alone utilisation (percent of the GPU) where a job turns medium, then jumbo."""
SCORE_RANGE = (0, 100)
"""Accepted ``limits.max_share_score``."""


def share_score(util_percent: float, tiers: tuple[float, ...] = TIERS) -> int:
    """The job's tier: how many of ``tiers`` its alone utilisation reaches (0 tiny .. 2 jumbo)."""
    return int(scores(np.array([util_percent]), tiers)[0])


def scores(util_percent: np.ndarray, tiers: tuple[float, ...] = TIERS) -> np.ndarray:
    """:func:`share_score` of each entry (rounded to 1e-6: reservations are running sums)."""
    util = np.round(util_percent, 6)
    return np.sum([util >= t for t in tiers], axis=0, dtype=np.int64)


def over_limit(limit: int, job_util: float, resident_utils: Iterable[float],
               tiers: tuple[float, ...] = TIERS) -> bool:
    """True when a job joining residents of ``resident_utils`` sums the scores past ``limit``
    (never on an idle GPU: a job alone always may run)."""
    residents = [share_score(u, tiers) for u in resident_utils]
    return bool(residents) and share_score(job_util, tiers) + sum(residents) > limit


def share_refusals(table: GpuTable, rows: np.ndarray, limit: int | None,
                   job_util: np.ndarray, *, progress: bool) -> np.ndarray | None:
    """Per candidate row, True where the score refuses the training pod (None: nowhere).

    Only rows the learned pairs cannot judge count: the pod names no progress counter
    (``progress`` false), or a training pod on the row names none. ``job_util`` has one
    entry per row or one for all."""
    if limit is None:
        return None
    busy = table.training_count[rows] > 0
    if not busy.any():
        return None
    # A row whose one pod is a training pod (the usual shared GPU) reserves its utilisation:
    # scored at once; the rows of several pods read their training pods one by one.
    alone = busy & (table.pod_count[rows] == 1)
    residents = np.where(alone, scores(table.reserved_util[rows]), 0)
    for i in np.flatnonzero(busy & ~alone).tolist():
        residents[i] = sum(share_score(u) for _, u, _, _ in table.row_models.get(int(rows[i]), ()))
    refused = busy & (scores(job_util) + residents > limit)
    if progress:  # measured progress on the row: learned pairs and the curve judge, not this
        for i in np.flatnonzero(refused).tolist():
            refused[i] = not all(p for *_, p in table.row_models.get(int(rows[i]), ()))
    return refused if refused.any() else None
