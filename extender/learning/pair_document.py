"""The pair learner's persisted form: ``pairs`` inside the learning document.

Three lists of rows, oldest first (the learner's least recently seen first):

- ``pairs``: ``[gpu_type, model, beside, samples, mean_log_slowdown, m2]``;
- ``groups``: ``[gpu_type, model, [others...], samples, mean_extra_slowdown]`` (absent
  from documents written before group samples);
- ``cannot_share``: ``[gpu_type, model_a, model_b]``;
- ``progress``: ``[gpu_type, model, beside, samples, mean_log_step_ratio, m2]``: the
  progress samples (:mod:`extender.learning.progress_pairs`; absent from documents
  written before them). A pod's alone step time is not kept: it drifts and is re-measured.

:func:`encode` keeps it within a byte budget by leaving out the oldest group samples,
then the oldest pairs; :func:`decode` refuses a row out of range with ValueError (the
caller starts empty: learning again beats trusting garbage).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from extender.learning.pair_fit import MAX_EXTRA, MAX_LOG, GroupKey

PairKey = tuple[str, str, str]
"""(GPU type, model a, model b): a beside b."""
Cannot = set[tuple[str, frozenset[str]]]


def encode(stats: Mapping[PairKey, list[float]], groups: Mapping[GroupKey, list[float]],
           cannot: Cannot, max_bytes: int | None = None,
           progress: Mapping[PairKey, list[float]] | None = None) -> dict[str, Any]:
    """The rows of ``stats`` and ``progress`` (count, mean, m2), ``groups`` (count, mean)
    and ``cannot``; within ``max_bytes`` of compact JSON when given."""
    pairs = _rows(stats)
    progress_rows = _rows(progress or {})
    group_rows = [[t, a, list(others), int(n), round(m, 6)]
                  for (t, a, others), (n, m) in groups.items()]
    cannot_rows = sorted([t, *sorted(p)] for t, p in cannot)
    if max_bytes is not None:  # the compact JSON each row takes, with its comma
        sizes = {id(r): len(json.dumps(r, separators=(",", ":"))) + 1
                 for r in (*pairs, *group_rows, *progress_rows)}
        size = len(json.dumps(cannot_rows, separators=(",", ":"))) + 40 + sum(sizes.values())
        for rows in (group_rows, pairs, progress_rows):  # oldest first in each
            dropped = 0
            while size > max_bytes and dropped < len(rows):
                size -= sizes[id(rows[dropped])]
                dropped += 1
            del rows[:dropped]
    return {"pairs": pairs, "groups": group_rows, "cannot_share": cannot_rows,
            "progress": progress_rows}


def _rows(stats: Mapping[PairKey, list[float]]) -> list[list[Any]]:
    return [[t, a, b, int(n), round(m, 6), round(m2, 6)] for (t, a, b), (n, m, m2) in stats.items()]


def decode_progress(doc: Any, max_entries: int) -> OrderedDict[PairKey, list[float]]:
    """The progress rows of ``doc`` (as :func:`encode` wrote them; none in older
    documents), the newest ``max_entries`` kept; ValueError naming the first bad row."""
    out: OrderedDict[PairKey, list[float]] = OrderedDict()
    rows = doc.get("progress", []) if isinstance(doc, Mapping) else None
    try:
        for row in rows if isinstance(rows, list) else [rows]:
            t, a, b, n, m, m2 = row
            if not (isinstance(n, int) and n >= 1 and -MAX_LOG <= float(m) <= MAX_LOG
                    and float(m2) >= 0 and math.isfinite(float(m2))):
                raise ValueError(f"bad progress row {row!r}")
            out[(str(t), str(a), str(b))] = [float(n), float(m), float(m2)]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"learning document: pairs: {exc}") from None
    while len(out) > max_entries:
        out.popitem(last=False)
    return out


def decode(doc: Any, max_entries: int) -> tuple[OrderedDict[PairKey, list[float]],
                                                OrderedDict[GroupKey, list[float]], Cannot]:
    """What ``doc`` (as :func:`encode` wrote it) holds, the newest ``max_entries`` pairs and
    group samples kept; ValueError naming the first bad row."""
    if not isinstance(doc, Mapping):
        raise ValueError("learning document: pairs must be a mapping")
    stats: OrderedDict[PairKey, list[float]] = OrderedDict()
    groups: OrderedDict[GroupKey, list[float]] = OrderedDict()
    cannot: Cannot = set()
    try:
        for row in doc.get("pairs", []):
            t, a, b, n, m, m2 = row
            if not (isinstance(n, int) and n >= 1 and 0 <= float(m) <= MAX_LOG
                    and float(m2) >= 0):
                raise ValueError(f"bad pair row {row!r}")
            stats[(str(t), str(a), str(b))] = [float(n), float(m), float(m2)]
        for row in doc.get("groups", []):  # absent from documents older than groups
            t, a, others, n, m = row
            if not (isinstance(n, int) and n >= 1 and 0 <= float(m) <= MAX_EXTRA
                    and isinstance(others, list) and len(others) >= 2):
                raise ValueError(f"bad group row {row!r}")
            groups[(str(t), str(a), tuple(sorted(str(o) for o in others)))] = \
                [float(n), float(m)]
        for row in doc.get("cannot_share", []):
            t, *pair = row
            cannot.add((str(t), frozenset(str(p) for p in pair)))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"learning document: pairs: {exc}") from None
    for kept in (stats, groups):
        while len(kept) > max_entries:
            kept.popitem(last=False)
    return stats, groups, cannot
