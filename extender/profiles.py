"""Batching profiles for inference pods, loaded from the files the config lists.

Profile files use the plan-file form (DESIGN ``tandem plan``): a ``profiles:``
list of ``{model, gpu_type, linear: {alpha_ms, beta_ms} | table: [[b, ms], ...],
memory_mib}``, parsed by the predictor's ``profile_from_entry`` so that the
extender, ``tandem plan`` and the agent read one format. ``gpu_type`` must be the
canonical GPU type the extender sees (the product name with spaces as dashes,
e.g. ``NVIDIA-A100-SXM4-40GB``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from predictor.batching import BatchingProfile, ProfileError
from predictor.profiles import profile_from_entry


class ProfileFileError(ValueError):
    """A profile file is unreadable or invalid."""


def parse_profiles(raw: Any, where: str) -> dict[tuple[str, str], BatchingProfile]:
    """Profiles from a decoded ``{profiles: [...]}`` document, keyed (model, gpu_type)."""
    entries = raw.get("profiles") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ProfileFileError(f"{where}: expected a 'profiles' list")
    out: dict[tuple[str, str], BatchingProfile] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ProfileFileError(f"{where}: profiles[{i}]: must be a mapping")
        try:
            prof = profile_from_entry(entry, f"{where}: profiles[{i}]")
        except (TypeError, ValueError, ProfileError) as exc:
            raise ProfileFileError(str(exc)) from None
        out[(prof.model, prof.gpu_type)] = prof
    return out


def load_profiles(files: Iterable[str]) -> dict[tuple[str, str], BatchingProfile]:
    """All profiles from ``files`` keyed ``(model, gpu_type)``; later files win."""
    out: dict[tuple[str, str], BatchingProfile] = {}
    for f in files:
        try:
            raw = yaml.safe_load(Path(f).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ProfileFileError(f"{f}: {exc}") from None
        out.update(parse_profiles(raw, f))
    return out
