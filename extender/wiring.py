"""Wiring shared by ``tandem extender serve``, ``queue-gate`` and ``tandem demo``.

The one place each extender process is assembled: :func:`assemble_extender` (what
``tandem extender serve`` runs: config, exposure check, leadership, source,
predictor, profiles, queue gate, the app from :func:`create_app`, the server bound,
then :meth:`ExtenderProcess.run`), :func:`assemble_queue_gate` (``tandem extender
queue-gate``: config, predictor, leadership, the controller, then
:class:`QueueGateProcess`), :func:`create_app` (learner, state, verbs, signer,
metrics, routes, then the source starts), the predictor (with the guard against
simulated artifacts), the planner, and the weighted-fair queue gate's controller thread.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.logs import get_logger
from extender.cluster.source import ClusterSource
from extender.cluster.spec import SourceSpecError, build_source
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


def setup_errors() -> tuple[type[Exception], ...]:
    """What :func:`assemble_extender` raises for a configuration the operator must fix."""
    from contracts.clusterfile import ClusterFileError
    from extender.config.schema import ConfigError
    from extender.ha.lifecycle import LeadershipSetupError
    from extender.inference_profiles import ProfileFileError
    from extender.queue import QueueError

    return (ConfigError, ClusterFileError, SourceSpecError, ProfileFileError,
            LeadershipSetupError, PredictorSetupError, QueueError)



class ExtenderProcess:
    """A bound, not yet serving extender and what its shutdown stops."""

    def __init__(self, holder: ConfigHolder, source: ClusterSource, server: Any, address: str,
                 leadership: str, leader: Any, loop: Any, gate: Any, draining: Any,
                 metrics: Metrics):
        self.holder, self.source, self.server, self.address = holder, source, server, address
        self.leadership, self.leader, self.loop, self.gate = leadership, leader, loop, gate
        self.draining, self.metrics = draining, metrics

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT, then drain, stop the gate and the source."""
        from extender.ha.lifecycle import GracefulShutdown
        from extender.queue.metrics import QueueMetrics
        from extender.transport.server import reload_loop

        stop = threading.Event()
        reload_loop(self.holder, stop)
        shutdown = GracefulShutdown(self.draining, self.server, self.loop, stop)
        signal.signal(signal.SIGTERM, shutdown.on_signal)
        if self.loop is not None:
            self.loop.start()
        # The gate shares `stop` with the shutdown sequence and releases only while
        # this replica leads, so standbys never release pods.
        gate_thread = QueueGateThread(
            self.gate, self.leader.is_leader, stop,
            on_round=QueueMetrics(self.metrics.registry).observe,
        ).start() if self.gate else None
        get_logger().info("serving", extra={"path": self.address, "leadership": self.leadership,
                                            "queue_gate": self.gate is not None})
        try:
            self.server.serve()
        finally:
            if self.draining.active:
                # cheroot's accept loop returns as soon as stop() begins; wait for the drain.
                shutdown.wait(shutdown.shutdown_timeout_seconds + 5)
            else:
                shutdown.run()
            if gate_thread is not None:
                gate_thread.stop()
            self.source.stop()


def assemble_extender(config_path: Path | None, cluster: str, port: int | None,
                      leadership: str, lease_name: str | None,
                      insecure: bool) -> ExtenderProcess:
    """``tandem extender serve``'s process, bound to its address; raises one of
    :func:`setup_errors` for a configuration to fix, OSError when it cannot listen."""
    from contracts.logs import setup_logging
    from extender.config.loader import load_config
    from extender.config.schema import ConfigError
    from extender.exposure import exposure_problem
    from extender.ha.lifecycle import Draining, setup_leadership
    from extender.inference_profiles import load_profiles
    from extender.ops.metrics import Metrics

    cfg = load_config(config_path)
    log = setup_logging(cfg.log_level)
    exposed = exposure_problem(cfg, os.environ)
    if exposed and not insecure:
        raise ConfigError([exposed])
    if exposed:
        log.warning("serving without TLS or an agent token (--insecure)",
                    extra={"path": cfg.server.host})
    if cfg.queue.enabled and cluster != "kube":
        raise SourceSpecError("queue.enabled needs --cluster kube (the gate patches real pods)")
    leader, loop = setup_leadership(leadership, lease_name)
    source = build_source(cluster)  # before the predictor, which may log a warning
    predictor = build_predictor(cfg.predictor)
    profiles = load_profiles(cfg.profile_files, cfg.nexus_profiles)
    gate = (build_queue_gate(cfg.queue, demand_fn=predictor_demand_fn(predictor))
            if cfg.queue.enabled else None)
    holder = ConfigHolder(cfg, loader=lambda: load_config(config_path))
    draining, metrics = Draining(), Metrics()
    app = create_app(holder, source, predictor=predictor, profiles=profiles,
                     planner=default_planner(), readiness=[draining],
                     may_bind=leader.is_leader, metrics=metrics)
    address = f"{cfg.server.host}:{port or cfg.server.port}"
    server = _bound_server(app, cfg.server, port, source, address)
    return ExtenderProcess(holder, source, server, address, leadership, leader, loop, gate,
                           draining, metrics)


class QueueGateProcess:
    """``tandem extender queue-gate``'s assembled process: one round (``--once``) or rounds
    until SIGTERM/SIGINT, with ``/metrics`` served beside them."""

    def __init__(self, controller: Any, leadership: str, leader: Any, loop: Any):
        self.controller, self.leadership, self.leader, self.loop = (
            controller, leadership, leader, loop)

    def once(self) -> Any:
        """One round; its report (``error`` set when it failed)."""
        return self.controller.reconcile()

    def run(self, metrics_port: int, metrics_addr: str) -> None:
        """Serve ``/metrics`` (port 0: off) and release pods until SIGTERM/SIGINT; OSError
        (with the address in its message) when ``/metrics`` cannot listen."""
        from extender.queue.metrics import QueueMetrics

        metrics = QueueMetrics()
        metrics_server = None
        if metrics_port:
            from prometheus_client import start_http_server

            try:
                metrics_server, _ = start_http_server(metrics_port, metrics_addr,
                                                      metrics.registry)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot serve /metrics on {metrics_addr}:"
                                         f"{metrics_port}: {exc}") from exc
        stop = threading.Event()

        def on_signal(*_: object) -> None:
            stop.set()  # the round in progress finishes; its patches are atomic per pod

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if self.loop is not None:
            self.loop.start()
        log = get_logger()
        log.info("queue gate running", extra={"leadership": self.leadership,
                                              "gate": self.controller.config.gate_name,
                                              "metrics_port": metrics_port})
        try:
            self.controller.run(stop, self.leader.is_leader, metrics.observe)
        finally:
            if self.loop is not None:
                self.loop.stop()  # releases an elected Lease so a standby takes over at once
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
            log.info("queue gate stopped")


def assemble_queue_gate(config_path: Path | None, leadership: str, lease_name: str | None,
                        **overrides: Any) -> QueueGateProcess:
    """``tandem extender queue-gate``'s process (``overrides``: ``k``, ``beta``,
    ``interval_seconds`` from its flags); raises one of :func:`setup_errors`."""
    from contracts.logs import setup_logging
    from extender.config.loader import load_config
    from extender.ha.lifecycle import setup_leadership

    cfg = load_config(config_path)
    setup_logging(cfg.log_level)
    predictor = build_predictor(cfg.predictor)
    leader, loop = setup_leadership(leadership, lease_name)
    controller = build_queue_gate(cfg.queue, demand_fn=predictor_demand_fn(predictor),
                                  **overrides)
    return QueueGateProcess(controller, leadership, leader, loop)


def _bound_server(app: Flask, server_cfg: Any, port: int | None, source: ClusterSource,
                  address: str) -> Any:
    """The cheroot server over ``app`` (scheduler-only behind mutual TLS), bound now so a
    busy port fails before we claim to serve; the source is stopped on failure."""
    from extender.config.schema import ConfigError
    from extender.scheduler_auth import ask_for_client_certificates, scheduler_only
    from extender.transport.server import make_server

    mutual_tls = bool(server_cfg.tls_client_ca_file and server_cfg.tls_cert_file)
    if mutual_tls:
        app = scheduler_only(app, server_cfg.scheduler_client_names)
    server = make_server(app, server_cfg, port)
    if mutual_tls:
        try:
            ask_for_client_certificates(server.ssl_adapter, server_cfg.tls_client_ca_file)
        except ConfigError:
            source.stop()
            raise
    try:
        server.prepare()
    except OSError as exc:
        source.stop()
        # cheroot re-raises bind failures without errno; its message keeps the cause.
        code = exc.errno or next((c for c in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)
                                  if os.strerror(c) in str(exc)), None)
        reason = os.strerror(code) if code else str(exc)
        raise OSError(code, f"cannot listen on {address}: {reason}") from exc
    return server
