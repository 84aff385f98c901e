"""Wiring shared by ``tandem extender serve`` and ``tandem demo``: sources, predictor, planner."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from extender.config import PredictorConfig
from extender.core.decide import PlannerFn
from extender.logs import get_logger


class SourceSpecError(ValueError):
    """``--cluster`` is neither ``kube`` nor ``sim:FILE``."""


def build_source(spec: str) -> Any:
    """The cluster source for ``--cluster kube|sim:FILE``."""
    if spec == "kube":
        from extender.kube import KubeSource

        return KubeSource.from_environment()
    if spec.startswith("sim:") and len(spec) > 4:
        from extender.sim import SimSource

        return SimSource.from_file(spec[4:])
    raise SourceSpecError(f"--cluster must be 'kube' or 'sim:FILE', got {spec!r}")


def default_planner() -> PlannerFn | None:
    """``extender.planner.plan_gpu`` (None if the planner is not installed)."""
    try:
        from extender.planner import plan_gpu
    except ImportError:
        return None
    return plan_gpu


class PredictorSetupError(ValueError):
    """The configured predictor artifacts exist but cannot be loaded."""


def build_predictor(cfg: PredictorConfig) -> Any:
    """The predictor facade from ``predictor.artifacts_dir``/``model_store``; None if disabled.

    A missing or empty artifacts directory is not fatal: pods that name
    ``tandem.io/model`` without asserted values are then rejected per GPU type
    with ``DemandUnknown`` and the predictor's ``NoTrainedModel`` text, which
    tells the operator to run ``tandem predictor train``. Artifacts that exist
    but do not load (digest mismatch, corrupt JSON) are a configuration error.
    """
    if not cfg.enabled:
        return None
    try:
        api = importlib.import_module("predictor.api")
    except ImportError as exc:  # extender installed without the predictor's dependencies
        get_logger().warning("predictor unavailable", extra={"error": repr(exc)})
        return None
    artifacts = Path(cfg.artifacts_dir) if cfg.artifacts_dir else None
    store = Path(cfg.model_store) if cfg.model_store else None
    try:
        predictor = api.Predictor.from_dirs(artifacts, store)
    except (OSError, ValueError, KeyError) as exc:
        raise PredictorSetupError(
            f"predictor.artifacts_dir {cfg.artifacts_dir}: cannot load: {exc}") from None
    if predictor.artifacts is None:
        get_logger().warning(
            "no trained utilisation model: pods naming tandem.io/model without "
            "tandem.io/gpu-util are rejected until `tandem predictor train` output is "
            "configured", extra={"path": cfg.artifacts_dir})
    return predictor
