"""The measured-interference document (``interference:``): one parser for every reader.

Per GPU type, how many times slower each model runs beside each other model, and
which pairs cannot share a GPU at all::

    interference:
      NVIDIA-Tesla-P100:
        slowdown:                  # slowdown[a][b]: how many times slower a runs beside b
          LM-bs5: {ResNet-50-bs64: 3.56}
          ResNet-50-bs64: {LM-bs5: 1.25}
        cannot_share: [[LM-bs80, CycleGAN]]   # the pair does not fit together (out of memory)

Two readers take it: the simulator's truth file (``lab.simulator.truth``,
where it is the world's interference) and the extender's ``learning.pair_prior``
(``extender.learning.interference``, where it is what decisions assume of a pair
until the cluster shows otherwise). ``tandem import-interference`` writes it.
Slowdowns are at least 1 (figures below 1 are measurement noise and read as 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.profilefile import ProfileFileError, load_yaml

MAX_SLOWDOWN = 1000.0


class InterferenceFileError(ValueError):
    """An interference file cannot be used; ``problems`` lists every reason."""

    def __init__(self, where: str, problems: list[str]):
        super().__init__(f"{where}: " + "; ".join(problems))
        self.problems = [f"{where}: {p}" for p in problems]


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
                    or not math.isfinite(value) or not 0 < value <= MAX_SLOWDOWN:
                problems.append(f"{path}.{a}.{b}: must be a number in (0, {MAX_SLOWDOWN:g}], "
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


def load_interference_file(path: str | Path) -> dict[str, PairTable]:
    """The ``interference:`` section of a YAML file (a truth file's other sections are
    not read); :class:`InterferenceFileError` names every problem."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InterferenceFileError(where, [f"cannot read: {exc.strerror or exc}"]) from None
    try:
        raw = load_yaml(text, where)
    except ProfileFileError as exc:
        raise InterferenceFileError(where, [str(exc)]) from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("interference"), Mapping) \
            or not raw["interference"]:
        raise InterferenceFileError(where, ["must be a mapping with a non-empty "
                                            "'interference:' section (tandem "
                                            "import-interference writes one)"])
    problems: list[str] = []
    tables = parse_interference(raw["interference"], "interference", problems)
    if problems:
        raise InterferenceFileError(where, problems)
    return tables
