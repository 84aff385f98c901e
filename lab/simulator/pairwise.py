"""Measured pairwise interference in the simulated world's truth (``interference:``).

A truth file may give, per GPU type, how many times slower each model runs
beside each other model, and which pairs cannot share a GPU at all, in the
document :mod:`contracts.interferencefile` parses. This module applies it to
the simulated world and imports Gavel's measurements into it.

Rules (the one place they are implemented):

- **Pairs not listed.** ``slowdown[a][b]`` missing: the slowdown the GPU type's
  curve gives the two jobs sharing the GPU alone (the truth's ``curves:`` entry
  for the type, else the paper's interference), from their true utilisations.
  The listing is directional: ``slowdown[a][b]`` says nothing about ``b`` beside ``a``.
- **Three or more jobs.** Each job's slowdown is ``1 + sum over the others of
  (s[a][b] - 1)``: the extra time each neighbour causes adds up.
- **Cannot share.** A job placed on a GPU that runs a model it cannot share with
  fails at once as an out-of-memory start (it re-enters the queue).
- A GPU type without an ``interference:`` entry keeps the curve or paper model, so
  results without one are exactly those of a run without this section.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from contracts.interferencefile import PairTable

GAVEL_GPUS = {"p100": "NVIDIA-Tesla-P100", "k80": "NVIDIA-Tesla-K80", "v100": "NVIDIA-Tesla-V100"}
"""Gavel's GPU names and the canonical type names the truth uses for them."""


def job_slowdowns(table: PairTable, models: Sequence[str],
                  pair_fallback: Any) -> list[float]:
    """Each job's slowdown on one GPU shared by jobs of ``models`` (module rules).

    ``pair_fallback(i, j)``: the slowdown of job ``i`` beside job ``j`` for a pair the
    table does not list (the curve's, from the two jobs' utilisations)."""
    n = len(models)
    if n < 2:
        return [1.0] * n
    out = []
    for i, a in enumerate(models):
        extra = 0.0
        for j, b in enumerate(models):
            if i == j:
                continue
            listed = table.listed(a, b)
            extra += (listed if listed is not None else float(pair_fallback(i, j))) - 1.0
        out.append(1.0 + max(0.0, extra))
    return out


class GavelError(ValueError):
    """The Gavel measurements file cannot be imported."""


def gavel_model_name(job: str) -> str:
    """``ResNet-50 (batch size 64)`` -> ``ResNet-50-bs64`` (a name fit for ``tandem.io/model``)."""
    match = re.fullmatch(r"\s*(.*?)\s*\(batch size (\d+)\)\s*", job)
    base, batch = (match.group(1), match.group(2)) if match else (job.strip(), None)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-")
    return f"{name}-bs{batch}" if batch else name


def import_gavel(raw: Any, gpu: str) -> tuple[str, PairTable]:
    """The canonical GPU type and its pair table from Gavel's measurements for ``gpu``.

    ``raw``: the parsed JSON (``gpus.<gpu>.<job>.alone`` and ``.with.<other>`` =
    [this job's throughput, the other's]). Slowdown of ``a`` beside ``b`` is
    ``alone_a / with[a][b][0]``, rounded to 4 digits; ``[0, 0]`` is a pair that
    cannot share. A job beside another copy of itself is kept (``slowdown[a][a]``)."""
    gpus = raw.get("gpus") if isinstance(raw, Mapping) else None
    if not isinstance(gpus, Mapping):
        raise GavelError("not a Gavel measurements file: no 'gpus' mapping")
    key = gpu.lower()
    if key not in gpus:
        raise GavelError(f"GPU {gpu!r} not in the file (has: {', '.join(sorted(gpus))})")
    jobs = gpus[key]
    slowdown: dict[str, dict[str, float]] = {}
    cannot: set[frozenset[str]] = set()
    for job, entry in jobs.items():
        try:
            alone = float(entry["alone"])
            pairs = entry["with"].items()
        except (KeyError, TypeError, AttributeError, ValueError):
            raise GavelError(f"gpus.{key}.{job}: needs 'alone' and 'with'") from None
        a = gavel_model_name(job)
        for other, both in pairs:
            b = gavel_model_name(other)
            try:
                mine = float(both[0])
            except (TypeError, ValueError, IndexError, KeyError):
                raise GavelError(f"gpus.{key}.{job}.with.{other}: must be [throughput, "
                                 "throughput]") from None
            if mine <= 0.0:
                cannot.add(frozenset((a, b)))
            elif alone > 0.0:
                slowdown.setdefault(a, {})[b] = round(alone / mine, 4)
    return GAVEL_GPUS.get(key, f"NVIDIA-Tesla-{gpu.upper()}"), PairTable(slowdown,
                                                                        frozenset(cannot))
