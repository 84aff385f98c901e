"""Batching profiles ``l(b)`` per (model, GPU type) from Nexus files, YAML and batching.csv.

Sources:

- Nexus profile files (``training_data/nexus-profiles``): a profile id, a GPU
  name, a ``Forward latency`` CSV of ``batch,latency(us),std(us),memory(B)``, and
  pre/post-processing sections. Nexus plans with ``(mean + std) * 1.15``; that is
  ``NEXUS_MARGIN``, a parameter here, recorded on every loaded profile.
- Plan-file ``profiles:`` entries (DESIGN.md): ``{model, gpu_type, linear:
  {alpha_ms, beta_ms} | table: [[b, ms], ...], memory_mib}``, checked by the one
  strict parser ``contracts.profilefile`` and built here (``build_profiles``).
- ``training_data/<gpu>/batching.csv`` rows (``predictor.dataset``).

``fit_linear`` fits ``l(b) = alpha*b + beta`` by least squares and reports R^2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from contracts.profilefile import (
    ProfileEntry,
    ProfileFileError,
    parse_document,
    read_profile_file,
)
from predictor.batching import BatchingProfile, ProfileError
from predictor.errors import ProfileNotFound


@dataclass(frozen=True)
class Margin:
    """Planning latency = (mean + std_weight*std) * factor."""

    std_weight: float = 1.0
    factor: float = 1.15

    def apply(self, mean_ms: float, std_ms: float) -> float:
        """Planned latency of one measured row."""
        return (mean_ms + self.std_weight * std_ms) * self.factor


NEXUS_MARGIN = Margin(1.0, 1.15)
NO_MARGIN = Margin(0.0, 1.0)


@dataclass(frozen=True)
class LinearFit:
    """Least-squares ``l(b) = alpha_ms*b + beta_ms`` and its coefficient of determination."""

    alpha_ms: float
    beta_ms: float
    r2: float
    n_points: int


@dataclass(frozen=True)
class NexusProfile:
    """One parsed Nexus profile file (latencies in ms, memory in MiB)."""

    profile_id: str
    model: str
    gpu_name: str
    batches: tuple[int, ...]
    mean_ms: tuple[float, ...]
    std_ms: tuple[float, ...]
    memory_mib: tuple[float, ...]
    preprocess_ms: tuple[float, float] | None
    postprocess_ms: tuple[float, float] | None

    def planned_ms(self, margin: Margin = NEXUS_MARGIN) -> tuple[float, ...]:
        """Per-batch latencies with the planning margin applied."""
        return tuple(margin.apply(m, s) for m, s in zip(self.mean_ms, self.std_ms, strict=True))

    def to_profile(
        self, gpu_type: str | None = None, margin: Margin = NEXUS_MARGIN, linear: bool = False
    ) -> BatchingProfile:
        """A table (or fitted linear) BatchingProfile, memory at the largest batch."""
        gpu = gpu_type or self.gpu_name
        planned = self.planned_ms(margin)
        memory = max(self.memory_mib)
        if linear:
            fit = fit_linear(self.batches, planned)
            return BatchingProfile.linear(
                self.model, gpu, fit.alpha_ms, max(0.0, fit.beta_ms), memory, max(self.batches)
            )
        rows = list(zip(self.batches, planned, strict=True))
        return BatchingProfile.from_table(self.model, gpu, rows, memory)


def fit_linear(batches: Sequence[float], latencies_ms: Sequence[float]) -> LinearFit:
    """Least-squares line through (batch, latency); R^2 = 1 - SS_res/SS_tot."""
    n = len(batches)
    if n < 2 or n != len(latencies_ms):
        raise ProfileError("a linear fit needs at least two (batch, latency) points")
    mx, my = sum(batches) / n, sum(latencies_ms) / n
    sxx = sum((x - mx) ** 2 for x in batches)
    if sxx == 0:
        raise ProfileError("a linear fit needs at least two distinct batch sizes")
    sxy = sum((x - mx) * (y - my) for x, y in zip(batches, latencies_ms, strict=True))
    alpha = sxy / sxx
    beta = my - alpha * mx
    ss_tot = sum((y - my) ** 2 for y in latencies_ms)
    ss_res = sum((y - (alpha * x + beta)) ** 2 for x, y in zip(batches, latencies_ms, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LinearFit(alpha, beta, r2, n)


def parse_nexus(text: str, source: str = "<text>") -> NexusProfile:
    """Parse one Nexus profile file; ProfileError names the line of any problem."""
    lines = [line.strip() for line in text.splitlines()]
    if len(lines) < 4:
        raise ProfileError(f"{source}: too short for a Nexus profile")
    profile_id, gpu_name = lines[0], lines[1]
    parts = profile_id.split(":")
    if len(parts) < 3:
        raise ProfileError(f"{source}:1: profile id must be framework:model:version[:HxW]")
    sections: dict[str, list[tuple[int, str]]] = {}
    current = None
    for i, line in enumerate(lines[2:], start=3):
        if not line:
            continue
        if line[0].isalpha() and "," not in line:
            current = line.lower()
            sections[current] = []
        elif current is not None:
            sections[current].append((i, line))
    forward = sections.get("forward latency")
    if not forward:
        raise ProfileError(f"{source}: no 'Forward latency' section")
    batches, means, stds, mems = [], [], [], []
    for i, line in forward[1:]:
        cells = line.split(",")
        try:
            b, mean_us, std_us, mem_b = int(cells[0]), *(float(c) for c in cells[1:4])
        except (ValueError, IndexError) as exc:
            raise ProfileError(
                f"{source}:{i}: expected batch,latency(us),std(us),memory(B)"
            ) from exc
        if not all(math.isfinite(v) and v >= 0 for v in (mean_us, std_us, mem_b)) or b < 1:
            raise ProfileError(f"{source}:{i}: values must be finite, >= 0, batch >= 1")
        batches.append(b)
        means.append(mean_us / 1000.0)
        stds.append(std_us / 1000.0)
        mems.append(mem_b / (1 << 20))
    return NexusProfile(
        profile_id,
        parts[1],
        gpu_name,
        tuple(batches),
        tuple(means),
        tuple(stds),
        tuple(mems),
        _pair(sections.get("preprocess latency")),
        _pair(sections.get("postprocess latency")),
    )


def _pair(rows: list[tuple[int, str]] | None) -> tuple[float, float] | None:
    if not rows or len(rows) < 2:
        return None
    mean_us, std_us = (float(c) for c in rows[1][1].split(",")[:2])
    return mean_us / 1000.0, std_us / 1000.0


def load_nexus_dir(directory: Path) -> list[NexusProfile]:
    """Every ``*.txt`` Nexus profile in ``directory``, sorted by file name."""
    return [
        parse_nexus(p.read_text(encoding="utf-8"), str(p))
        for p in sorted(Path(directory).glob("*.txt"))
    ]


def build_profiles(entries: Iterable[ProfileEntry], problems: list[str],
                   read_text: Callable[[str], str] | None = None,
                   by_entry: dict[str, BatchingProfile] | None = None,
                   ) -> dict[tuple[str, str], BatchingProfile]:
    """The BatchingProfile of each checked entry (``contracts.profilefile``), keyed
    ``(model, gpu_type)``; each problem (a table's rows, a Nexus file, a second profile
    for one key) appended with the entry's path. ``read_text`` reads a ``nexus_profile``
    path as written; without it such an entry is a problem. ``by_entry`` receives each
    built profile under its entry's path."""
    out: dict[tuple[str, str], BatchingProfile] = {}
    for e in entries:
        try:
            if e.nexus_profile is not None:
                profile = _from_nexus(e, problems, read_text)
            elif e.linear is not None:
                assert e.model is not None and e.gpu_type is not None
                profile = BatchingProfile.linear(e.model, e.gpu_type, *e.linear,
                                                 e.memory_mib or 0.0, e.max_batch)
            else:
                assert e.model is not None and e.gpu_type is not None
                profile = BatchingProfile.from_table(e.model, e.gpu_type, list(e.table or ()),
                                                     e.memory_mib or 0.0)
        except (ProfileError, TypeError, ValueError) as exc:
            problems.append(f"{e.path}: {exc}")
            continue
        if profile is None:
            continue
        if by_entry is not None:
            by_entry[e.path] = profile
        key = (profile.model, profile.gpu_type)
        if key in out:
            problems.append(f"{e.path}: duplicate profile for ({key[0]}, {key[1]})")
        else:
            out[key] = profile
    return out


def _from_nexus(e: ProfileEntry, problems: list[str],
                read_text: Callable[[str], str] | None) -> BatchingProfile | None:
    """A ``nexus_profile: PATH`` entry through the one Nexus parser."""
    where = e.nexus_profile or ""
    if read_text is None:
        problems.append(f"{e.path}.nexus_profile: no file reader given to resolve {where!r}")
        return None
    try:
        text = read_text(where)
    except OSError as exc:
        problems.append(f"{e.path}.nexus_profile: cannot read {where} ({exc.strerror or exc})")
        return None
    try:
        profile = parse_nexus(text, where).to_profile(e.gpu_type)
    except ProfileError as exc:
        problems.append(f"{e.path}.nexus_profile: {exc}")
        return None
    memory = profile.memory_mib if e.memory_mib is None else e.memory_mib
    return replace(profile, model=e.model or profile.model, memory_mib=float(memory))


def profiles_from_document(doc: Any, where: str,
                           read_text: Callable[[str], str] | None = None,
                           ) -> dict[tuple[str, str], BatchingProfile]:
    """Every profile of a decoded ``profiles:`` document, keyed ``(model, gpu_type)``;
    ``ProfileFileError`` listing every problem."""
    problems: list[str] = []
    found = build_profiles(parse_document(doc, where), problems, read_text)
    if problems:
        raise ProfileFileError(where, problems)
    return found


def load_profile_file(path: Path | str) -> dict[tuple[str, str], BatchingProfile]:
    """Every profile of a ``profiles:`` YAML file (:func:`profiles_from_document`);
    ``nexus_profile`` paths are relative to the file's folder."""
    entries = read_profile_file(path)
    base = Path(path).parent

    def read_text(where: str) -> str:
        target = Path(where)
        return (target if target.is_absolute() else base / target).read_text("utf-8")

    problems: list[str] = []
    found = build_profiles(entries, problems, read_text)
    if problems:
        raise ProfileFileError(str(path), problems)
    return found


def profiles_from_batching_rows(
    rows: Iterable[Mapping[str, Any]], margin: Margin = NEXUS_MARGIN
) -> list[BatchingProfile]:
    """Table profiles from validated ``batching.csv`` rows (grouped by model and GPU)."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((str(row["model"]), str(row["gpu_product"])), []).append(row)
    out = []
    for (model, gpu), group in sorted(groups.items()):
        group = sorted(group, key=lambda r: int(r["batch_size"]))
        table = [
            [
                int(r["batch_size"]),
                margin.apply(float(r["latency_mean_ms"]), float(r["latency_std_ms"])),
            ]
            for r in group
        ]
        out.append(
            BatchingProfile.from_table(model, gpu, table, max(float(r["mem_mib"]) for r in group))
        )
    return out


class ProfileStore:
    """Profiles keyed by (model, gpu_type); ``get`` raises ProfileNotFound naming the gap."""

    def __init__(self, profiles: Iterable[BatchingProfile] = ()):
        self._profiles: dict[tuple[str, str], BatchingProfile] = {}
        for p in profiles:
            self.add(p)

    def add(self, profile: BatchingProfile) -> None:
        """Add or replace the profile for its (model, gpu_type)."""
        self._profiles[(profile.model, profile.gpu_type)] = profile

    def get(self, model: str, gpu_type: str) -> BatchingProfile:
        """The profile for (model, gpu_type)."""
        try:
            return self._profiles[(model, gpu_type)]
        except KeyError:
            raise ProfileNotFound(model, gpu_type, tuple(sorted(self._profiles))) from None

    def as_mapping(self) -> dict[tuple[str, str], BatchingProfile]:
        """A copy keyed (model, gpu_type), the form the planner takes."""
        return dict(self._profiles)

    def __len__(self) -> int:
        return len(self._profiles)

    def __contains__(self, key: object) -> bool:
        return key in self._profiles
