"""``tandem extender ...`` commands (Typer imports only; heavy imports happen inside)."""

from __future__ import annotations

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
    from extender.wiring import assemble_extender, setup_errors

    try:
        process = assemble_extender(config, cluster, port, leadership, lease_name, insecure)
    except setup_errors() as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    process.run()


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
