"""Plan files (``tandem plan FILE``): validate a parsed YAML document into planner inputs.

Pure: the caller reads and parses the file, and passes a ``read_text`` function
for the files a plan refers to (``nexus_profile: PATH`` entries, parsed with
``predictor.profiles.parse_nexus``). Every problem is collected with its
path (``profiles[2].linear.alpha_ms: must be > 0``) and raised at once as
``PlanFileError``, so a user fixes a file in one round.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from planner.options import SWITCHES, GpuType, HarpagonOptions
from planner.query import QueryModule, QuerySpec
from planner.types import PlanFileError, SessionSpec
from predictor.batching import BatchingProfile, ProfileError
from predictor.profiles import parse_nexus

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


def _number(value: Any, path: str, problems: list[str], *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        problems.append(f"{path}: expected a finite number, got {value!r}")
        return math.nan
    if positive and value <= 0:
        problems.append(f"{path}: must be > 0, got {value!r}")
    elif value < 0:
        problems.append(f"{path}: must be >= 0, got {value!r}")
    return float(value)


def _name(value: Any, path: str, problems: list[str]) -> str:
    if not isinstance(value, str) or not value:
        problems.append(f"{path}: expected a non-empty string, got {value!r}")
        return ""
    return value


def _mapping(value: Any, path: str, problems: list[str]) -> dict:
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a mapping, got {type(value).__name__}")
        return {}
    return value


def _list(value: Any, path: str, problems: list[str]) -> list:
    if not isinstance(value, list):
        problems.append(f"{path}: expected a list, got {type(value).__name__}")
        return []
    return value


def _unknown(entry: dict, allowed: set[str], path: str, problems: list[str]) -> None:
    for key in sorted(set(entry) - allowed, key=str):
        problems.append(f"{path}.{key}: unknown key (allowed: {', '.join(sorted(allowed))})")


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


def _nexus(
    entry: dict, path: str, problems: list[str], read_text: ReadText | None
) -> BatchingProfile | None:
    """A ``nexus_profile: PATH`` entry through the predictor's one Nexus parser."""
    where = entry.get("nexus_profile")
    if not isinstance(where, str) or not where:
        problems.append(f"{path}.nexus_profile: expected a file path, got {where!r}")
        return None
    if read_text is None:
        problems.append(f"{path}.nexus_profile: no file reader given to resolve {where!r}")
        return None
    try:
        text = read_text(where)
    except OSError as exc:
        problems.append(f"{path}.nexus_profile: cannot read {where} ({exc.strerror or exc})")
        return None
    try:
        nexus = parse_nexus(text, where)
        gpu = entry.get("gpu_type") if isinstance(entry.get("gpu_type"), str) else None
        profile = nexus.to_profile(gpu)
    except ProfileError as exc:
        problems.append(f"{path}.nexus_profile: {exc}")
        return None
    model = entry.get("model", profile.model)
    memory = entry.get("memory_mib", profile.memory_mib)
    if isinstance(memory, bool) or not isinstance(memory, int | float):
        memory = profile.memory_mib  # already reported by the caller
    return dataclasses.replace(profile, model=str(model), memory_mib=float(memory))


def _profiles(
    raw: Any, types: set[str], problems: list[str], read_text: ReadText | None = None
) -> tuple[dict[tuple[str, str], BatchingProfile], dict[tuple[str, str], tuple[int, ...]]]:
    profiles: dict[tuple[str, str], BatchingProfile] = {}
    allowed: dict[tuple[str, str], tuple[int, ...]] = {}
    keys = {"model", "gpu_type", "linear", "table", "memory_mib", "max_batch", "batches"}
    for i, entry in enumerate(_list(raw, "profiles", problems)):
        path = f"profiles[{i}]"
        entry = _mapping(entry, path, problems)
        if not entry:
            continue
        if "nexus_profile" in entry:
            _unknown(entry, {"model", "gpu_type", "memory_mib", "nexus_profile"}, path, problems)
            _number(entry.get("memory_mib", 1.0), f"{path}.memory_mib", problems, positive=False)
            nexus = _nexus(entry, path, problems, read_text)
            if nexus is not None:
                if nexus.gpu_type not in types:
                    problems.append(f"{path}.gpu_type: {nexus.gpu_type!r} is not in gpu_types")
                elif (nexus.model, nexus.gpu_type) in profiles:
                    problems.append(
                        f"{path}: duplicate profile for ({nexus.model}, {nexus.gpu_type})"
                    )
                else:
                    profiles[(nexus.model, nexus.gpu_type)] = nexus
            continue
        _unknown(entry, keys, path, problems)
        model = _name(entry.get("model"), f"{path}.model", problems)
        gpu = _name(entry.get("gpu_type"), f"{path}.gpu_type", problems)
        if gpu and gpu not in types:
            problems.append(f"{path}.gpu_type: {gpu!r} is not in gpu_types")
        memory = _number(entry.get("memory_mib", 0), f"{path}.memory_mib", problems, positive=False)
        if ("linear" in entry) == ("table" in entry):
            problems.append(f"{path}: give exactly one of linear or table")
            continue
        if (model, gpu) in profiles:
            problems.append(f"{path}: duplicate profile for ({model}, {gpu})")
        before = len(problems)
        try:
            if "linear" in entry:
                lin = _mapping(entry["linear"], f"{path}.linear", problems)
                _unknown(lin, {"alpha_ms", "beta_ms"}, f"{path}.linear", problems)
                alpha = _number(lin.get("alpha_ms"), f"{path}.linear.alpha_ms", problems)
                beta = _number(
                    lin.get("beta_ms"), f"{path}.linear.beta_ms", problems, positive=False
                )
                max_batch = entry.get("max_batch", 512)
                if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
                    problems.append(f"{path}.max_batch: expected an integer >= 1")
                if len(problems) == before:
                    profiles[(model, gpu)] = BatchingProfile.linear(
                        model, gpu, alpha, beta, memory, max_batch
                    )
            else:
                rows = _list(entry["table"], f"{path}.table", problems)
                if len(problems) == before:
                    profiles[(model, gpu)] = BatchingProfile.from_table(model, gpu, rows, memory)
        except ProfileError as exc:
            problems.append(f"{path}: {exc}")
        except (TypeError, ValueError) as exc:
            problems.append(f"{path}: {exc}")
        if "batches" in entry:
            batches = _list(entry["batches"], f"{path}.batches", problems)
            if not batches or not all(isinstance(b, int) and b >= 1 for b in batches):
                problems.append(f"{path}.batches: expected a non-empty list of integers >= 1")
            else:
                allowed[(model, gpu)] = tuple(sorted(set(batches)))
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
