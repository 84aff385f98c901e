"""Batching profiles for inference pods, loaded from the files the config lists.

Two forms, both parsed by the predictor's one implementation so that the
extender, ``tandem plan`` and the agent read the same numbers:

- ``profiles.files``: YAML in the plan-file form (DESIGN ``tandem plan``), a
  ``profiles:`` list of ``{model, gpu_type, linear: {alpha_ms, beta_ms} | table:
  [[b, ms], ...], memory_mib}``, read by the one strict parser
  (``contracts.profilefile``, built by ``predictor.profiles.load_profile_file``);
- ``profiles.nexus``: Nexus profile files (or directories of ``*.txt``), read by
  ``parse_nexus``. A Nexus file names its GPU as the profiling host printed it
  (``TITAN X (Pascal)``), which is not the type the extender sees, so each entry
  says which canonical GPU type it describes. Latencies are planned with Nexus's
  margin ``(mean + std) * 1.15`` (``NEXUS_MARGIN``).

``gpu_type`` must be the canonical GPU type the extender sees (the product name
with spaces as dashes, e.g. ``NVIDIA-A100-SXM4-40GB``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from contracts.profilefile import ProfileFileError
from extender.config.sections import NexusProfileSource
from predictor.batching import BatchingProfile, ProfileError
from predictor.profiles import (
    load_nexus_dir,
    load_profile_file,
    parse_nexus,
    profiles_from_document,
)

__all__ = ["ProfileFileError", "load_nexus_profiles", "load_profiles", "parse_profiles"]

parse_profiles = profiles_from_document
"""Profiles from a decoded ``{profiles: [...]}`` document, keyed (model, gpu_type)."""


def load_nexus_profiles(source: NexusProfileSource) -> dict[tuple[str, str], BatchingProfile]:
    """Table profiles from one Nexus file or directory, keyed (model, ``source.gpu_type``)."""
    path = Path(source.path)
    try:
        found = (load_nexus_dir(path) if path.is_dir()
                 else [parse_nexus(path.read_text(encoding="utf-8"), str(path))])
    except (OSError, ProfileError, ValueError) as exc:
        raise ProfileFileError(str(path), [str(exc)]) from None
    if not found:
        raise ProfileFileError(str(path), ["no Nexus profiles (*.txt) found"])
    out: dict[tuple[str, str], BatchingProfile] = {}
    for nexus in found:
        try:
            prof = nexus.to_profile(source.gpu_type)
        except (ProfileError, ValueError) as exc:
            raise ProfileFileError(str(path), [f"{nexus.profile_id}: {exc}"]) from None
        out[(prof.model, prof.gpu_type)] = prof
    return out


def load_profiles(files: Iterable[str], nexus: Iterable[NexusProfileSource] = (),
                  ) -> dict[tuple[str, str], BatchingProfile]:
    """All profiles keyed ``(model, gpu_type)``: Nexus first, then YAML files (later win)."""
    out: dict[tuple[str, str], BatchingProfile] = {}
    for source in nexus:
        out.update(load_nexus_profiles(source))
    for f in files:
        out.update(load_profile_file(f))
    return out
