"""``tandem extender webhook`` (Typer imports only; the server is imported when it runs)."""

from __future__ import annotations

from pathlib import Path

import typer


def webhook(
    config: Path | None = typer.Option(
        None, "--config", help="webhook YAML (default: translate nothing, no defaults)"),
    host: str = typer.Option("127.0.0.1", "--host", help="listen address"),
    port: int = typer.Option(8445, "--port", help="HTTPS port"),
    tls_cert_file: Path | None = typer.Option(None, "--tls-cert-file", help="PEM certificate"),
    tls_key_file: Path | None = typer.Option(None, "--tls-key-file", help="PEM private key"),
) -> None:
    """Serve the mutating admission webhook (POST /mutate) until SIGTERM."""
    import yaml

    from contracts.httpserve import stop_on_signals
    from contracts.listen import is_loopback
    from contracts.logs import setup_logging
    from extender.webhook.mutate import WebhookConfigError, parse_settings
    from extender.webhook.server import make_server

    try:
        settings = parse_settings(_read_yaml(config) if config else None)
    except (OSError, yaml.YAMLError, WebhookConfigError) as exc:
        typer.echo(f"error: {config}: {exc}", err=True)
        raise typer.Exit(2) from None
    if bool(tls_cert_file) != bool(tls_key_file):
        typer.echo("error: give --tls-cert-file and --tls-key-file together", err=True)
        raise typer.Exit(2)
    if not tls_cert_file and not is_loopback(host):
        typer.echo("error: the API server calls admission webhooks over HTTPS only: "
                   "give --tls-cert-file and --tls-key-file", err=True)
        raise typer.Exit(2)
    log = setup_logging("info")
    server = make_server(settings, host, port, str(tls_cert_file) if tls_cert_file else None,
                         str(tls_key_file) if tls_key_file else None)
    server.prepare()
    stopped = stop_on_signals(server)
    log.info("webhook serving", extra={"path": f"{host}:{port}"})
    server.serve()
    stopped.wait(10)  # serve() returns as stop() begins: let in-flight reviews finish
    log.info("webhook stopped")


def _read_yaml(path: Path) -> object:
    """The decoded file (read as a stream, so a YAML error names the file)."""
    import yaml

    with path.open(encoding="utf-8") as stream:
        return yaml.safe_load(stream)
