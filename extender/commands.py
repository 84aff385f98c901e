"""``tandem extender ...`` commands (Typer imports only; heavy imports happen inside)."""

from __future__ import annotations

from pathlib import Path

import typer

from extender.webhook.commands import webhook

app = typer.Typer(no_args_is_help=True)
app.command("webhook")(webhook)

_CONFIG = typer.Option(None, "--config", help="YAML config (default: packaged)")
_LEADERSHIP = typer.Option(
    "single", "--leadership",
    help="single (one replica) | follow-scheduler (beside kube-scheduler: follow its Lease) "
         "| elect (standalone replicas elect on --lease-name)")
_LEASE_NAME = typer.Option(
    None, "--lease-name", help="Lease to follow or elect on (POD_NAMESPACE's)")


@app.command("serve")
def serve(
    config: Path | None = _CONFIG,
    cluster: str = typer.Option(
        "kube", "--cluster", help="kube | sim:FILE (a simulated cluster: binds the pods the "
        "file declares under pending: and those POSTed to /v1/sim/pods from this machine)"),
    port: int | None = typer.Option(None, "--port", help="override server.port"),
    leadership: str = _LEADERSHIP,
    lease_name: str | None = _LEASE_NAME,
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
    config: Path | None = _CONFIG,
    interval_seconds: float | None = typer.Option(
        None, "--interval-seconds", help="override queue.interval_seconds"),
    beta: int | None = typer.Option(None, "--beta", help="override queue.beta"),
    k: int | None = typer.Option(None, "--k", help="override queue.k"),
    leadership: str = _LEADERSHIP,
    lease_name: str | None = _LEASE_NAME,
    once: bool = typer.Option(
        False, "--once", help="run one round, print its report as JSON, exit"),
    metrics_port: int = typer.Option(
        9402, "--metrics-port", help="serve Prometheus /metrics here (0: off)"),
    metrics_addr: str = typer.Option("0.0.0.0", "--metrics-addr", help="address for /metrics"),
) -> None:
    """Release pods held by the queue's scheduling gate in Horus's weighted-fair order."""
    import json
    from dataclasses import asdict

    from extender.wiring import assemble_queue_gate, setup_errors

    try:
        process = assemble_queue_gate(config, leadership, lease_name, k=k, beta=beta,
                                      interval_seconds=interval_seconds)
    except setup_errors() as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if once:
        report = process.once()
        typer.echo(json.dumps(asdict(report), sort_keys=True))
        raise typer.Exit(1 if report.error else 0)
    try:
        process.run(metrics_port, metrics_addr)
    except OSError as exc:  # /metrics cannot listen: the message names the address
        typer.echo(f"error: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
