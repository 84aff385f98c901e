"""Wiring shared by ``tandem extender serve``, ``queue-gate`` and ``tandem demo``.

The one place an extender process is assembled (:func:`create_app`: learner,
state, verbs, signer, metrics, routes, then the source starts), sources, the
predictor (with the guard against simulated artifacts), the planner, and the
weighted-fair queue gate's controller thread.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.logs import get_logger
from extender.cluster.source import ClusterSource
from extender.config.loader import ConfigHolder
from extender.config.sections import PredictorConfig, QueueSettings
from extender.core.session_rules import PlannerFn

if TYPE_CHECKING:
    from flask import Flask

    from extender.ops.metrics import Metrics
    from extender.service.demand_cache import DemandPredictor


def create_app(
    config: ConfigHolder, source: ClusterSource, clock: Callable[[], float] = time.monotonic, *,
    predictor: DemandPredictor | None = None,
    profiles: Mapping[tuple[str, str], Any] | None = None, planner: PlannerFn | None = None,
    readiness: Iterable[Callable[[], bool]] = (), may_bind: Callable[[], bool] = lambda: True,
    metrics: Metrics | None = None, environ: Mapping[str, str] | None = None,
    start_source: bool = True,
) -> Flask:
    """One extender process over ``source``: learner, state, the verbs, the placement signer,
    metrics and routes; starts the source unless told not to."""
    from extender.learning.knowledge import Beliefs
    from extender.learning.learner import build_learner
    from extender.ops.metrics import Metrics
    from extender.service.verbs import Extender
    from extender.state.ledger import ClusterState
    from extender.state.signing import load_signer
    from extender.state.view import metric_rows
    from extender.transport.routes import build_routes

    current = config.current()
    learner = build_learner(current.learning, source, may_bind, current.policy,
                            predictor.known_digest if predictor is not None else None)
    # The one door from config and learner to decisions: merged once per reload or refit.
    state = ClusterState(Beliefs(config, learner), clock, current.state.assume_ttl_seconds)
    ext = Extender(state, source, config, clock, predictor, profiles, planner, may_bind, learner,
                   environ)
    metrics = metrics or Metrics()
    metrics.watch_state(lambda: metric_rows(state.snapshot()), lambda: state.snapshot().synced)
    metrics.watch_learning(learner.curves.view, learner.stats)
    if source.signs_placements:
        source.use_signer(load_signer(current.state, environ, current.reports),
                          lambda problem: metrics.untrusted_placements.labels(problem).inc())
    app = build_routes(ext, metrics, config, readiness)
    if start_source:
        source.start(state)
    return app


class SourceSpecError(ValueError):
    """``--cluster`` is neither ``kube`` nor ``sim:FILE``."""


def build_source(spec: str) -> ClusterSource:
    """The cluster source for ``--cluster kube|sim:FILE``."""
    if spec == "kube":
        from extender.cluster.kube import KubeSource

        return KubeSource.from_environment()
    if spec.startswith("sim:") and len(spec) > 4:
        from extender.cluster.sim import SimSource

        return SimSource.from_file(spec[4:])
    raise SourceSpecError(f"--cluster must be 'kube' or 'sim:FILE', got {spec!r}")


def default_planner() -> PlannerFn | None:
    """``planner.plan_gpu`` (None if the planner is not installed)."""
    try:
        from planner import plan_gpu
    except ImportError:
        return None
    return plan_gpu


class PredictorSetupError(ValueError):
    """The configured predictor artifacts exist but cannot (or must not) be loaded."""


CARD_FILE = "model_card.json"
"""The model card ``tandem predictor train`` writes beside the model (predictor.training)."""


def check_not_simulated(cfg: PredictorConfig) -> None:
    """Refuse artifacts whose model card says ``simulated: true`` unless allowed.

    Read from the card before loading the model, so the refusal does not depend
    on the predictor's dependencies. A model fitted on the profiler's ``sim:``
    rows predicts made-up numbers; placing real pods on them must be a choice.
    """
    if not cfg.artifacts_dir or cfg.allow_simulated:
        return
    card_path = Path(cfg.artifacts_dir) / CARD_FILE
    try:
        card = json.loads(card_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return  # no trained model: handled (with a warning) by build_predictor
    except (OSError, ValueError) as exc:
        raise PredictorSetupError(f"predictor.artifacts_dir {cfg.artifacts_dir}: "
                                  f"cannot read {CARD_FILE}: {exc}") from None
    if isinstance(card, Mapping) and card.get("simulated") is True:
        raise PredictorSetupError(
            f"predictor.artifacts_dir {cfg.artifacts_dir}: the model card says "
            '"simulated": true (trained on the profiler\'s sim: backend, not on measurements); '
            "train on real profiling data, or set predictor.allow_simulated: true "
            "for a dry run")


def build_predictor(cfg: PredictorConfig) -> Any:
    """The predictor facade from ``predictor.artifacts_dir``/``model_store``; None if disabled.

    A missing or empty artifacts directory is not fatal: pods that name
    ``tandem.io/model`` without asserted values then get the memory estimate
    and an observed or cold-start utilisation (``extender.core.demand``). Artifacts that exist
    but do not load (digest mismatch, corrupt JSON) are a configuration error,
    and so are simulated artifacts unless ``predictor.allow_simulated``.
    """
    if not cfg.enabled:
        return None
    check_not_simulated(cfg)
    try:
        api = importlib.import_module("predictor.api")
    except ImportError as exc:  # extender installed without the predictor's dependencies
        get_logger().warning("predictor unavailable", extra={"error": repr(exc)})
        return None
    artifacts = Path(cfg.artifacts_dir) if cfg.artifacts_dir else None
    store = Path(cfg.model_store) if cfg.model_store else None
    try:
        predictor = api.Predictor.from_dirs(artifacts, store, background_fetch=True,
                                            allowed_sources=cfg.allowed_model_sources)
    except (OSError, ValueError, KeyError) as exc:
        raise PredictorSetupError(
            f"predictor.artifacts_dir {cfg.artifacts_dir}: cannot load: {exc}") from None
    if getattr(predictor.artifacts, "simulated", False):
        if not cfg.allow_simulated:  # the card changed between the check and the load
            raise PredictorSetupError(
                f"predictor.artifacts_dir {cfg.artifacts_dir}: simulated artifacts "
                "(set predictor.allow_simulated: true for a dry run)")
        get_logger().warning("predictor artifacts are simulated (predictor.allow_simulated): "
                             "predictions are not measurements", extra={"path": cfg.artifacts_dir})
    if predictor.artifacts is None:
        get_logger().warning(
            "no trained utilisation model: pods naming tandem.io/model without "
            "tandem.io/gpu-util get the memory estimate and what the agents observed of "
            "their model, else the cold-start utilisation (learning.cold_start_util_percent)",
            extra={"path": cfg.artifacts_dir})
    return predictor


def gate_config(settings: QueueSettings, *, k: int | None = None, beta: int | None = None,
                interval_seconds: float | None = None) -> Any:
    """The controller's ``GateConfig`` from the ``queue:`` section plus command-line overrides.

    Raises ``extender.queue.QueueError`` when an override is out of range.
    """
    from extender.queue.gate import GateConfig

    queue = replace(settings.fair, k=settings.k if k is None else k,
                    beta=settings.beta if beta is None else beta)
    return GateConfig(queue=queue, gate_name=settings.gate_name,
                      namespaces=settings.namespaces,
                      interval_seconds=(settings.interval_seconds if interval_seconds is None
                                        else interval_seconds))


def predictor_demand_fn(
        predictor: Any) -> Callable[[Mapping[str, Any]], tuple[float, float]] | None:
    """``pod -> (util %, mem MiB)`` from the predictor, for gated pods that name a model.

    None without a predictor or a trained model (the gate then counts such pods
    as (0, 0) without a warning per pod and round). The GPU type is not known
    before placement, so the predictor answers with its largest prediction over
    the trained types (the conservative class). Pods without a model count as
    (0, 0); predictor errors are logged by the gate, which queues the pod with (0, 0).
    """
    from extender.core.demand import parse_demand

    if predictor is None or getattr(predictor, "artifacts", None) is None:
        return None

    def demand(pod: Mapping[str, Any]) -> tuple[float, float]:
        job = parse_demand(pod)
        if job.inputs.model is None:
            return 0.0, 0.0
        answer = predictor.predict(job.inputs.model, job.batch_size, None, job.workload.value)
        return float(answer.gpu_util_percent), float(answer.gpu_mem_mib)

    return demand


def build_queue_gate(settings: QueueSettings, *, api: Any = None,
                     demand_fn: Callable[[Mapping[str, Any]], tuple[float, float]] | None = None,
                     **overrides: Any) -> Any:
    """A ``GateController`` on ``api`` (default: in-cluster service account, else kubeconfig)."""
    from extender.queue.gate import GateController, controller_from_kube

    config = gate_config(settings, **overrides)
    if api is None:
        return controller_from_kube(config, demand_fn=demand_fn)
    return GateController(api, config, demand_fn=demand_fn)


class QueueGateThread:
    """The gate controller on a daemon thread, releasing only while ``is_leader()``."""

    def __init__(self, controller: Any, is_leader: Callable[[], bool],
                 stop: threading.Event | None = None,
                 on_round: Callable[[Any], None] | None = None):
        self.controller = controller
        self.stop_event = stop or threading.Event()
        self._thread = threading.Thread(
            target=controller.run, args=(self.stop_event, is_leader, on_round),
            name="tandem-queue-gate", daemon=True)

    def start(self) -> QueueGateThread:
        """Start the rounds; returns self."""
        self._thread.start()
        return self

    def stop(self, timeout_seconds: float = 5.0) -> None:
        """Ask the loop to stop and wait for the round in progress."""
        self.stop_event.set()
        if self._thread.is_alive():
            self._thread.join(timeout_seconds)
