"""The batching-profile YAML (``profiles:`` entries): one strict parser for every reader.

The same entries are read by ``tandem plan`` (a plan file's ``profiles:`` section),
the extender (``profiles.files``) and the inference server (``--profiles``)::

    profiles:
      - {model: M, gpu_type: T, linear: {alpha_ms: A, beta_ms: B}, memory_mib: N,
         max_batch: 512, batches: [1, 4, 8]}
      - {model: M, gpu_type: T, table: [[1, 2.5], [8, 9.0]], memory_mib: N}
      - {nexus_profile: PATH, gpu_type: T, model: M, memory_mib: N}

Strict everywhere, one way: an unknown key, a YAML mapping key written twice, two
profiles for one (model, GPU type), a wrong type or range is a problem naming its path
(``profiles[2].linear.alpha_ms: must be > 0, got 0``), and all of a file's problems
are raised at once (:class:`ProfileFileError`). ``batches`` restricts the batch sizes a
plan may use; only ``tandem plan`` plans with such a restriction, so a profile file the
extender or the inference server reads refuses it rather than ignore it.

This module checks the document's shape and numbers; the predictor builds the
``BatchingProfile`` of each entry (``predictor.profiles.build_profiles``), which
adds its own checks (a table's rows) to the same problem list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from contracts.annotations import BATCH_SIZE_RANGE

ENTRY_KEYS = frozenset({"model", "gpu_type", "linear", "table", "memory_mib", "max_batch",
                        "batches"})
NEXUS_KEYS = frozenset({"model", "gpu_type", "memory_mib", "nexus_profile"})
LINEAR_KEYS = frozenset({"alpha_ms", "beta_ms"})
DEFAULT_MAX_BATCH = 512
MAX_FILE_BYTES = 16 << 20


class ProfileFileError(ValueError):
    """A profile document is unreadable or invalid; ``problems`` lists each as ``path: why``."""

    def __init__(self, where: str, problems: Sequence[str]):
        self.where = where
        self.problems = tuple(problems)
        head = f"{where}: " if where else ""
        super().__init__(head + "; ".join(self.problems))


@dataclass(frozen=True)
class ProfileEntry:
    """One checked ``profiles:`` entry; ``path`` (``profiles[i]``) prefixes its problems."""

    path: str
    model: str | None
    """None only for a ``nexus_profile`` entry that takes the file's model name."""
    gpu_type: str | None
    """None only for a ``nexus_profile`` entry that takes the file's GPU name."""
    memory_mib: float | None
    linear: tuple[float, float] | None = None
    """``(alpha_ms, beta_ms)``."""
    max_batch: int = DEFAULT_MAX_BATCH
    table: tuple[Any, ...] | None = None
    """Rows as written; the predictor checks them when it builds the table."""
    nexus_profile: str | None = None
    batches: tuple[int, ...] | None = None


# ---- checks that append ``path: problem`` (plan files use them for their other sections) --

def number(value: Any, path: str, problems: list[str], *, positive: bool = True) -> float:
    """A finite number (> 0, or >= 0 when not ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        problems.append(f"{path}: expected a finite number, got {value!r}")
        return math.nan
    if positive and value <= 0:
        problems.append(f"{path}: must be > 0, got {value!r}")
    elif value < 0:
        problems.append(f"{path}: must be >= 0, got {value!r}")
    return float(value)


def name(value: Any, path: str, problems: list[str]) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        problems.append(f"{path}: expected a non-empty string, got {value!r}")
        return ""
    return value


def mapping(value: Any, path: str, problems: list[str]) -> dict:
    """A mapping (``{}`` after a problem)."""
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a mapping, got {type(value).__name__}")
        return {}
    return value


def listing(value: Any, path: str, problems: list[str]) -> list:
    """A list (``[]`` after a problem)."""
    if not isinstance(value, list):
        problems.append(f"{path}: expected a list, got {type(value).__name__}")
        return []
    return value


def unknown(entry: dict, allowed: frozenset[str] | set[str], path: str,
            problems: list[str]) -> None:
    """A problem per key of ``entry`` outside ``allowed``."""
    for key in sorted(set(entry) - allowed, key=str):
        problems.append(f"{path}.{key}: unknown key (allowed: {', '.join(sorted(allowed))})")


# ---- the entries ---------------------------------------------------------------------------

def parse_entries(raw: Any, problems: list[str], section: str = "profiles",
                  ) -> list[ProfileEntry]:
    """The checked entries of a ``profiles:`` list; each problem appended with its path."""
    out = []
    for i, entry in enumerate(listing(raw, section, problems)):
        path = f"{section}[{i}]"
        entry = mapping(entry, path, problems)
        if entry:
            parsed = _entry(entry, path, problems)
            if parsed is not None:
                out.append(parsed)
    return out


def _entry(entry: dict, path: str, problems: list[str]) -> ProfileEntry | None:
    before = len(problems)
    if "nexus_profile" in entry:
        unknown(entry, NEXUS_KEYS, path, problems)
        where = entry.get("nexus_profile")
        if not isinstance(where, str) or not where:
            problems.append(f"{path}.nexus_profile: expected a file path, got {where!r}")
        model = name(entry["model"], f"{path}.model", problems) if "model" in entry else None
        gpu = name(entry["gpu_type"], f"{path}.gpu_type", problems) \
            if "gpu_type" in entry else None
        memory = number(entry["memory_mib"], f"{path}.memory_mib", problems, positive=False) \
            if "memory_mib" in entry else None
        return None if len(problems) > before else \
            ProfileEntry(path, model, gpu, memory, nexus_profile=where)
    unknown(entry, ENTRY_KEYS, path, problems)
    model = name(entry.get("model"), f"{path}.model", problems)
    gpu = name(entry.get("gpu_type"), f"{path}.gpu_type", problems)
    memory = number(entry.get("memory_mib", 0), f"{path}.memory_mib", problems, positive=False)
    batches = _batches(entry, path, problems)
    if ("linear" in entry) == ("table" in entry):
        problems.append(f"{path}: give exactly one of linear or table")
        return None
    if "table" in entry:
        rows = listing(entry["table"], f"{path}.table", problems)
        return None if len(problems) > before else \
            ProfileEntry(path, model, gpu, memory, table=tuple(rows), batches=batches)
    lin = mapping(entry["linear"], f"{path}.linear", problems)
    unknown(lin, LINEAR_KEYS, f"{path}.linear", problems)
    alpha = number(lin.get("alpha_ms"), f"{path}.linear.alpha_ms", problems)
    beta = number(lin.get("beta_ms"), f"{path}.linear.beta_ms", problems, positive=False)
    max_batch = entry.get("max_batch", DEFAULT_MAX_BATCH)
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) \
            or not 1 <= max_batch <= BATCH_SIZE_RANGE.high:
        problems.append(f"{path}.max_batch: expected an integer in 1..{BATCH_SIZE_RANGE.high}")
    return None if len(problems) > before else ProfileEntry(
        path, model, gpu, memory, linear=(alpha, beta), max_batch=max_batch, batches=batches)


def _batches(entry: dict, path: str, problems: list[str]) -> tuple[int, ...] | None:
    if "batches" not in entry:
        return None
    batches = listing(entry["batches"], f"{path}.batches", problems)
    if not batches or not all(isinstance(b, int) and not isinstance(b, bool)
                              and 1 <= b <= BATCH_SIZE_RANGE.high for b in batches):
        problems.append(f"{path}.batches: expected a non-empty list of integers in "
                        f"1..{BATCH_SIZE_RANGE.high}")
        return None
    return tuple(sorted(set(batches)))


# ---- files ---------------------------------------------------------------------------------

class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a mapping key written twice (it keeps the last)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, list | dict):
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"mapping key {key!r} written twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml(text: str, where: str) -> Any:
    """A YAML document, a key written twice in one mapping refused; ProfileFileError."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        # the parser saw a string: its marks say "<unicode string>" where the file is meant
        text = str(exc).replace('"<unicode string>"', f'"{where}"')
        raise ProfileFileError(where, [text.replace("\n", " ")]) from None


def read_profile_file(path: Path | str) -> list[ProfileEntry]:
    """The entries of a profile file (:func:`parse_document`); ProfileFileError."""
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ProfileFileError(where, [f"cannot read: {exc.strerror or exc}"]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ProfileFileError(where, [f"larger than {MAX_FILE_BYTES >> 20} MiB"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileFileError(where, ["not UTF-8"]) from None
    return parse_document(load_yaml(text, where), where)


def parse_document(doc: Any, where: str) -> list[ProfileEntry]:
    """The entries of a decoded profile document (``profiles:`` and nothing else);
    ProfileFileError listing every problem. ``batches`` is refused: only ``tandem plan``
    honours it."""
    problems: list[str] = []
    doc = mapping(doc, "file", problems)
    if doc:
        unknown(doc, {"profiles"}, "file", problems)
    if "profiles" not in doc:
        problems.append("file: expected a 'profiles' list")
    entries = parse_entries(doc.get("profiles", []), problems)
    for e in entries:
        if e.batches is not None:
            problems.append(f"{e.path}.batches: only tandem plan restricts batch sizes; the "
                            "extender and the inference server plan every size the profile "
                            "gives (remove it, or give a table of those sizes)")
    if problems:
        raise ProfileFileError(where, problems)
    return entries
