"""Batching profiles for the server, read and fitted with the predictor's one implementation.

Nexus plans with ``(mean + std) * 1.15`` (``predictor.profiles.NEXUS_MARGIN``). The
server plans with a margin given explicitly, and the simulated executor can
execute the unmargined mean with the measured spread as noise, so the margin has
real noise to absorb and every run records what it used.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from contracts.profilefile import ProfileFileError
from predictor.batching import BatchingProfile, ProfileError
from predictor.profiles import (
    Margin,
    NexusProfile,
    fit_linear,
    load_nexus_dir,
    load_profile_file,
    parse_nexus,
)

__all__ = ["ProfileFileError", "fit_linear_profile", "load_nexus", "load_profiles"]


def load_nexus(path: Path) -> list[NexusProfile]:
    """Nexus profiles from a directory of ``*.txt`` files or one file."""
    try:
        if path.is_dir():
            found = load_nexus_dir(path)
        else:
            found = [parse_nexus(path.read_text(encoding="utf-8"), str(path))]
    except (OSError, ProfileError) as exc:
        raise ProfileFileError("", [str(exc)]) from exc
    if not found:
        raise ProfileFileError(str(path), ["no Nexus profiles"])
    return found


def load_profiles(path: Path, gpu_type: str, margin: Margin) -> dict[str, BatchingProfile]:
    """This GPU type's profiles keyed by model, from a Nexus directory/file (planned with
    ``margin``) or a ``profiles:`` YAML file (checked whole, by the one strict parser)."""
    if path.is_dir() or path.suffix == ".txt":
        return {p.model: p.to_profile(gpu_type, margin) for p in load_nexus(path)}
    return {model: p for (model, gpu), p in load_profile_file(path).items() if gpu == gpu_type}


def fit_linear_profile(
    model: str,
    gpu_type: str,
    samples: Sequence[tuple[int, float]],
    max_batch: int,
    memory_mib: float = 0.0,
) -> BatchingProfile:
    """``l(b) = alpha*b + beta`` through measured ``(batch, latency_ms)``, kept pessimistic.

    CPU measurements can be flat or noisy: alpha is clamped to a small positive
    value and beta raised until no measured point lies above the line, so the
    planner never sees a profile faster than what was measured.
    """
    fit = fit_linear([b for b, _ in samples], [lat for _, lat in samples])
    alpha = max(fit.alpha_ms, 1e-6)
    beta = max([max(fit.beta_ms, 0.0)] + [lat - alpha * b for b, lat in samples])
    return BatchingProfile.linear(model, gpu_type, alpha, beta, memory_mib, max_batch)
