"""Measured pairwise interference in the simulated world's truth (``interference:``).

A truth file may give, per GPU type, how many times slower each model runs
beside each other model, and which pairs cannot share a GPU at all::

    interference:
      NVIDIA-Tesla-P100:
        slowdown:                  # slowdown[a][b]: how many times slower a runs beside b
          LM-bs5: {ResNet-50-bs64: 3.56}
          ResNet-50-bs64: {LM-bs5: 1.25}
        cannot_share: [[LM-bs80, CycleGAN]]   # the pair does not fit together (out of memory)

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
- Slowdowns are at least 1 (figures below 1 in a file are measurement noise and
  read as 1).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GAVEL_GPUS = {"p100": "NVIDIA-Tesla-P100", "k80": "NVIDIA-Tesla-K80", "v100": "NVIDIA-Tesla-V100"}
"""Gavel's GPU names and the canonical type names the truth uses for them."""
_MAX_SLOWDOWN = 1000.0


@dataclass(frozen=True)
class PairTable:
    """One GPU type's measured pairs (module docstring)."""

    slowdown: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    cannot_share: frozenset[frozenset[str]] = frozenset()

    def listed(self, a: str, b: str) -> float | None:
        """``slowdown[a][b]`` (at least 1), None when the file does not list it."""
        row = self.slowdown.get(a)
        value = None if row is None else row.get(b)
        return None if value is None else max(1.0, value)

    def can_share(self, a: str, b: str) -> bool:
        """False when the file lists ``a`` and ``b`` (either order) under ``cannot_share``."""
        return frozenset((a, b)) not in self.cannot_share

    def models(self) -> list[str]:
        """Every model the table names, sorted."""
        names = set(self.slowdown)
        for row in self.slowdown.values():
            names.update(row)
        for pair in self.cannot_share:
            names.update(pair)
        return sorted(names)


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


def parse_interference(raw: Any, path: str, problems: list[str]) -> dict[str, PairTable]:
    """Validate the ``interference:`` section; every problem is appended with its path."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: must be a mapping of GPU type to its measured pairs")
        return {}
    out: dict[str, PairTable] = {}
    for gpu_type, entry in raw.items():
        where = f"{path}.{gpu_type}"
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: must be a mapping with keys slowdown, cannot_share")
            continue
        problems += [f"{where}.{k}: unknown key (valid: slowdown, cannot_share)"
                     for k in entry if k not in ("slowdown", "cannot_share")]
        out[str(gpu_type)] = PairTable(_slowdowns(entry.get("slowdown"), f"{where}.slowdown",
                                                  problems),
                                       _cannot(entry.get("cannot_share"),
                                               f"{where}.cannot_share", problems))
    return out


def _slowdowns(raw: Any, path: str, problems: list[str]) -> dict[str, dict[str, float]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: must be a mapping slowdown[a][b] (a runs that many times "
                        "slower beside b)")
        return {}
    out: dict[str, dict[str, float]] = {}
    for a, row in raw.items():
        if not isinstance(row, Mapping):
            problems.append(f"{path}.{a}: must be a mapping of model to slowdown")
            continue
        for b, value in row.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or not 0 < value <= _MAX_SLOWDOWN:
                problems.append(f"{path}.{a}.{b}: must be a number in (0, {_MAX_SLOWDOWN:g}], "
                                f"got {value!r}")
                continue
            out.setdefault(str(a), {})[str(b)] = float(value)
    return out


def _cannot(raw: Any, path: str, problems: list[str]) -> frozenset[frozenset[str]]:
    if raw is None:
        return frozenset()
    if not isinstance(raw, list):
        problems.append(f"{path}: must be a list of [model, model] pairs")
        return frozenset()
    pairs = set()
    for k, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2 \
                or not all(isinstance(m, str) and m for m in pair):
            problems.append(f"{path}[{k}]: must be a pair [model, model], got {pair!r}")
            continue
        pairs.add(frozenset(pair))
    return frozenset(pairs)


def interference_document(tables: Mapping[str, PairTable]) -> dict[str, Any]:
    """The YAML form of ``tables`` (reads back equal through :func:`parse_interference`)."""
    return {t: {"slowdown": {a: dict(row) for a, row in table.slowdown.items()},
                "cannot_share": sorted(sorted(p) if len(p) == 2 else [next(iter(p))] * 2
                                       for p in table.cannot_share)}
            for t, table in tables.items()}


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
