"""Plan files (``tandem plan FILE``): validate a parsed YAML document into planner inputs.

Pure: the caller reads and parses the file, and passes a ``read_text`` function
for the files a plan refers to (``nexus_profile: PATH`` entries, parsed with
``predictor.profiles.parse_nexus``). Every problem is collected with its
path (``profiles[2].linear.alpha_ms: must be > 0``) and raised at once as
``PlanFileError``, so a user fixes a file in one round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from contracts import profilefile as pf
from lab.planning.options import SWITCHES, GpuType, HarpagonOptions
from lab.planning.query import QueryModule, QuerySpec
from planner.types import PlanFileError, SessionSpec
from predictor.batching import BatchingProfile
from predictor.profiles import build_profiles

ReadText = Callable[[str], str]
"""Reads a file a plan refers to (path as written); raises OSError if it cannot."""

_TOP_KEYS = {"gpu_types", "profiles", "sessions", "queries", "options"}


@dataclass(frozen=True)
class PlanSpec:
    """Everything a plan file describes."""

    gpu_types: tuple[GpuType, ...]
    profiles: Mapping[tuple[str, str], BatchingProfile]
    sessions: tuple[SessionSpec, ...]
    queries: tuple[QuerySpec, ...]
    allowed_batches: Mapping[tuple[str, str], tuple[int, ...]]
    options: HarpagonOptions


_number, _name, _mapping, _list, _unknown = pf.number, pf.name, pf.mapping, pf.listing, pf.unknown


def parse_plan(
    doc: Any, base_options: HarpagonOptions | None = None, read_text: ReadText | None = None
) -> PlanSpec:
    """Validate a parsed plan document; raises PlanFileError listing every problem.

    Without ``read_text``, a ``nexus_profile`` entry is a problem (nothing to read with).
    """
    problems: list[str] = []
    doc = _mapping(doc, "plan", problems)
    _unknown(doc, _TOP_KEYS, "plan", problems)
    gpu_types = _gpu_types(doc.get("gpu_types"), problems)
    profiles, allowed = _profiles(
        doc.get("profiles", []), {g.name for g in gpu_types}, problems, read_text
    )
    sessions = _sessions(doc.get("sessions", []), problems)
    queries = _queries(doc.get("queries", []), problems)
    options = _options(doc.get("options", {}), base_options or HarpagonOptions(), problems)
    names = [s.name for s in sessions] + [f"{q.name}/{m.name}" for q in queries for m in q.modules]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"sessions: duplicate session name {dup!r}")
    if problems:
        raise PlanFileError(problems)
    return PlanSpec(gpu_types, profiles, tuple(sessions), tuple(queries), allowed, options)


def _gpu_types(raw: Any, problems: list[str]) -> tuple[GpuType, ...]:
    if raw is None:
        problems.append("plan.gpu_types: required (a mapping of name to {memory_mib, cost})")
        return ()
    out = []
    for name, entry in _mapping(raw, "gpu_types", problems).items():
        path = f"gpu_types.{name}"
        entry = _mapping(entry, path, problems)
        _unknown(entry, {"memory_mib", "cost"}, path, problems)
        memory = _number(entry.get("memory_mib"), f"{path}.memory_mib", problems)
        cost = _number(entry.get("cost", 1.0), f"{path}.cost", problems)
        if isinstance(name, str) and name and math.isfinite(memory) and memory > 0 and cost > 0:
            out.append(GpuType(name, memory, cost))
    return tuple(out)


def _profiles(
    raw: Any, types: set[str], problems: list[str], read_text: ReadText | None = None
) -> tuple[dict[tuple[str, str], BatchingProfile], dict[tuple[str, str], tuple[int, ...]]]:
    """The ``profiles:`` section through the one strict profile parser; a plan also checks
    each GPU type against ``gpu_types`` and keeps the ``batches`` restrictions."""
    entries = pf.parse_entries(raw, problems)
    built: dict[str, BatchingProfile] = {}
    profiles = build_profiles(entries, problems, read_text, built)
    allowed: dict[tuple[str, str], tuple[int, ...]] = {}
    for e in entries:
        gpu = built[e.path].gpu_type if e.path in built else e.gpu_type
        if gpu and gpu not in types:
            problems.append(f"{e.path}.gpu_type: {gpu!r} is not in gpu_types")
        if e.batches is not None and e.model and gpu:
            allowed[(e.model, gpu)] = e.batches
    return profiles, allowed


def _entries(raw: Any, section: str, allowed: set[str], problems: list[str]
             ) -> Iterator[tuple[str, dict]]:
    """Each entry of a list section as (path, mapping), its shape and keys checked."""
    for i, entry in enumerate(_list(raw, section, problems)):
        path = f"{section}[{i}]"
        entry = _mapping(entry, path, problems)
        _unknown(entry, allowed, path, problems)
        yield path, entry


def _target(entry: dict, path: str, problems: list[str]) -> tuple[str, float, float]:
    """The ``name``, ``slo_ms`` and ``rate_rps`` a session and a query both declare."""
    return (
        _name(entry.get("name"), f"{path}.name", problems),
        _number(entry.get("slo_ms"), f"{path}.slo_ms", problems),
        _number(entry.get("rate_rps"), f"{path}.rate_rps", problems),
    )


def _sessions(raw: Any, problems: list[str]) -> list[SessionSpec]:
    out = []
    for path, entry in _entries(raw, "sessions", {"name", "model", "slo_ms", "rate_rps"}, problems):
        before = len(problems)
        name, slo, rate = _target(entry, path, problems)
        model = _name(entry.get("model"), f"{path}.model", problems)
        if len(problems) == before:
            out.append(SessionSpec(name, model, slo, rate))
    return out


def _queries(raw: Any, problems: list[str]) -> list[QuerySpec]:
    out = []
    keys = {"name", "slo_ms", "rate_rps", "modules"}
    for path, entry in _entries(raw, "queries", keys, problems):
        before = len(problems)
        name, slo, rate = _target(entry, path, problems)
        modules = []
        for j, mod in enumerate(_list(entry.get("modules"), f"{path}.modules", problems)):
            mpath = f"{path}.modules[{j}]"
            mod = _mapping(mod, mpath, problems)
            _unknown(mod, {"name", "model", "after", "fanout"}, mpath, problems)
            after = mod.get("after", {})
            if isinstance(after, list):  # a plain list of parents means fan-out 1
                after = {p: 1.0 for p in after}
            after = _mapping(after, f"{mpath}.after", problems)
            parents = {str(p): _number(f, f"{mpath}.after.{p}", problems) for p, f in after.items()}
            modules.append(
                QueryModule(
                    _name(mod.get("name"), f"{mpath}.name", problems),
                    _name(mod.get("model"), f"{mpath}.model", problems),
                    parents,
                )
            )
        if len(problems) == before:
            try:
                out.append(QuerySpec(name, slo, rate, tuple(modules)))
            except ValueError as exc:
                problems.append(f"{path}: {exc}")
    return out


def _options(raw: Any, base: HarpagonOptions, problems: list[str]) -> HarpagonOptions:
    raw = _mapping(raw, "options", problems)
    _unknown(raw, set(SWITCHES), "options", problems)
    values = {f.name: getattr(base, f.name) for f in fields(HarpagonOptions)}
    for key in SWITCHES:
        if key in raw:
            if not isinstance(raw[key], bool):
                problems.append(f"options.{key}: expected true or false")
            else:
                values[key] = raw[key]
    return HarpagonOptions(**values)
