"""Wiring shared by ``tandem extender serve`` and ``tandem demo``: sources, predictor, planner."""

from __future__ import annotations

import importlib
from typing import Any

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


def default_predictor() -> Any:
    """The predictor facade (``predictor.api.Predictor()``), or None when unavailable.

    Pods that name ``tandem.io/model`` without asserted values are then rejected
    with a clear reason instead of guessed.
    """
    try:
        api = importlib.import_module("predictor.api")
        return api.Predictor()
    except Exception as exc:  # missing module, no trained model store: run without it
        get_logger().warning("predictor unavailable", extra={"error": repr(exc)})
        return None
