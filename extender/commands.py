"""``tandem extender ...`` commands (Typer imports only; heavy imports happen inside)."""

from __future__ import annotations

import errno
import os
import signal
import threading
from pathlib import Path

import typer

from extender.webhook.commands import webhook

app = typer.Typer(no_args_is_help=True)
app.command("webhook")(webhook)


@app.command("serve")
def serve(
    config: Path | None = typer.Option(None, "--config", help="YAML config (default: packaged)"),
    cluster: str = typer.Option(
        "kube", "--cluster", help="kube | sim:FILE (a simulated cluster: binds the pods the "
        "file declares under pending: and those POSTed to /v1/sim/pods from this machine)"),
    port: int | None = typer.Option(None, "--port", help="override server.port"),
    leadership: str = typer.Option(
        "single", "--leadership",
        help="single (one replica) | follow-scheduler (sidecar: follow kube-scheduler's Lease) "
             "| elect (standalone replicas elect on --lease-name)"),
    lease_name: str | None = typer.Option(
        None, "--lease-name", help="Lease to follow or elect on (POD_NAMESPACE's)"),
    insecure: bool = typer.Option(
        False, "--insecure",
        help="serve on a non-loopback server.host without TLS or an agent token"),
) -> None:
    """Run the kube-scheduler extender on cheroot until SIGTERM/SIGINT."""
    from contracts.clusterfile import ClusterFileError
    from contracts.logs import setup_logging
    from extender.config.loader import ConfigHolder, load_config
    from extender.config.schema import ConfigError
    from extender.exposure import exposure_problem
    from extender.ha.lifecycle import (
        Draining,
        GracefulShutdown,
        LeadershipSetupError,
        setup_leadership,
    )
    from extender.inference_profiles import ProfileFileError, load_profiles
    from extender.ops.metrics import Metrics
    from extender.queue import QueueError
    from extender.queue.metrics import QueueMetrics
    from extender.scheduler_auth import ask_for_client_certificates, scheduler_only
    from extender.transport.server import make_server, reload_loop
    from extender.wiring import (
        PredictorSetupError,
        QueueGateThread,
        SourceSpecError,
        build_predictor,
        build_queue_gate,
        build_source,
        create_app,
        default_planner,
        predictor_demand_fn,
    )

    gate = None
    try:
        cfg = load_config(config)
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
        if cfg.queue.enabled:
            gate = build_queue_gate(cfg.queue, demand_fn=predictor_demand_fn(predictor))
    except (ConfigError, ClusterFileError, SourceSpecError, ProfileFileError,
            LeadershipSetupError, PredictorSetupError, QueueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    holder = ConfigHolder(cfg, loader=lambda: load_config(config))
    draining = Draining()
    metrics = Metrics()
    app_ = create_app(holder, source, predictor=predictor,
                      profiles=profiles, planner=default_planner(), readiness=[draining],
                      may_bind=leader.is_leader, metrics=metrics)
    mutual_tls = bool(cfg.server.tls_client_ca_file and cfg.server.tls_cert_file)
    if mutual_tls:
        app_ = scheduler_only(app_, cfg.server.scheduler_client_names)
    server = make_server(app_, cfg.server, port)
    if mutual_tls:
        try:
            ask_for_client_certificates(server.ssl_adapter, cfg.server.tls_client_ca_file)
        except ConfigError as exc:
            source.stop()
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    address = f"{cfg.server.host}:{port or cfg.server.port}"
    try:
        server.prepare()  # bind now, so a busy port fails before we claim to serve
    except OSError as exc:
        source.stop()
        # cheroot re-raises bind failures without errno; its message keeps the cause.
        code = exc.errno or next((c for c in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)
                                  if os.strerror(c) in str(exc)), None)
        reason = os.strerror(code) if code else str(exc)
        raise OSError(code, f"cannot listen on {address}: {reason}") from exc
    stop = threading.Event()
    reload_loop(holder, stop)
    shutdown = GracefulShutdown(draining, server, loop, stop)
    signal.signal(signal.SIGTERM, shutdown.on_signal)
    if loop is not None:
        loop.start()
    # The gate shares `stop` with the shutdown sequence and releases only while
    # this replica leads, so standbys never release pods.
    gate_thread = QueueGateThread(
        gate, leader.is_leader, stop, on_round=QueueMetrics(metrics.registry).observe,
    ).start() if gate else None
    log.info("serving", extra={"path": address,
                               "leadership": leadership, "queue_gate": gate is not None})
    try:
        server.serve()
    finally:
        if draining.active:
            # cheroot's accept loop returns as soon as stop() begins; wait for the drain.
            shutdown.wait(shutdown.shutdown_timeout_seconds + 5)
        else:
            shutdown.run()
        if gate_thread is not None:
            gate_thread.stop()
        source.stop()


@app.command("queue-gate")
def queue_gate(
    config: Path | None = typer.Option(None, "--config", help="YAML config (default: packaged)"),
    interval_seconds: float | None = typer.Option(
        None, "--interval-seconds", help="override queue.interval_seconds"),
    beta: int | None = typer.Option(None, "--beta", help="override queue.beta"),
    k: int | None = typer.Option(None, "--k", help="override queue.k"),
    leadership: str = typer.Option(
        "single", "--leadership",
        help="single (one replica) | elect (replicas elect on --lease-name) | "
             "follow-scheduler (beside kube-scheduler: follow its Lease)"),
    lease_name: str | None = typer.Option(
        None, "--lease-name", help="Lease to elect on or follow (POD_NAMESPACE's)"),
    once: bool = typer.Option(
        False, "--once", help="run one round, print its report as JSON, exit"),
    metrics_port: int = typer.Option(
        9402, "--metrics-port", help="serve Prometheus /metrics here (0: off)"),
    metrics_addr: str = typer.Option("0.0.0.0", "--metrics-addr", help="address for /metrics"),
) -> None:
    """Release pods held by the queue's scheduling gate in Horus's weighted-fair order."""
    import json
    from dataclasses import asdict

    from contracts.logs import setup_logging
    from extender.config.loader import load_config
    from extender.config.schema import ConfigError
    from extender.ha.lifecycle import LeadershipSetupError, setup_leadership
    from extender.queue import QueueError
    from extender.queue.metrics import QueueMetrics
    from extender.wiring import (
        PredictorSetupError,
        build_predictor,
        build_queue_gate,
        predictor_demand_fn,
    )

    try:
        cfg = load_config(config)
        log = setup_logging(cfg.log_level)
        predictor = build_predictor(cfg.predictor)
        leader, loop = setup_leadership(leadership, lease_name)
        controller = build_queue_gate(
            cfg.queue, demand_fn=predictor_demand_fn(predictor),
            k=k, beta=beta, interval_seconds=interval_seconds)
    except (ConfigError, LeadershipSetupError, PredictorSetupError, QueueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if once:
        report = controller.reconcile()
        typer.echo(json.dumps(asdict(report), sort_keys=True))
        raise typer.Exit(1 if report.error else 0)
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        stop.set()  # the round in progress finishes; its patches are atomic per pod

    metrics = QueueMetrics()
    metrics_server = None
    if metrics_port:
        from prometheus_client import start_http_server

        try:
            metrics_server, _ = start_http_server(metrics_port, metrics_addr, metrics.registry)
        except OSError as exc:
            typer.echo(f"error: cannot serve /metrics on {metrics_addr}:{metrics_port}: {exc}",
                       err=True)  # fmt: skip
            raise typer.Exit(2) from None
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if loop is not None:
        loop.start()
    log.info("queue gate running", extra={"leadership": leadership,
                                          "gate": controller.config.gate_name,
                                          "metrics_port": metrics_port})
    try:
        controller.run(stop, leader.is_leader, metrics.observe)
    finally:
        if loop is not None:
            loop.stop()  # releases an elected Lease so a standby takes over at once
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        log.info("queue gate stopped")
