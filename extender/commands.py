"""``tandem extender ...`` commands (Typer imports only; heavy imports happen inside)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("serve")
def serve(
    config: Path | None = typer.Option(None, "--config", help="YAML config (default: packaged)"),
    cluster: str = typer.Option("kube", "--cluster", help="kube | sim:FILE"),
    port: int | None = typer.Option(None, "--port", help="override server.port"),
) -> None:
    """Run the kube-scheduler extender on cheroot until SIGTERM/SIGINT."""
    from extender.config import ConfigError, ConfigHolder, load_config
    from extender.logs import setup_logging
    from extender.profiles import ProfileFileError, load_profiles
    from extender.routes import create_app
    from extender.runtime import SourceSpecError, build_source, default_planner, default_predictor
    from extender.server import make_server, reload_loop
    from extender.sim import SimFileError

    try:
        cfg = load_config(config)
        source = build_source(cluster)
        profiles = load_profiles(cfg.profile_files)
    except (ConfigError, SimFileError, SourceSpecError, ProfileFileError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    log = setup_logging(cfg.log_level)
    holder = ConfigHolder(cfg, loader=lambda: load_config(config))
    predictor = default_predictor() if cfg.predictor_enabled else None
    app_ = create_app(holder, source, predictor=predictor, profiles=profiles,
                      planner=default_planner())
    server = make_server(app_, cfg.server, port)
    stop = threading.Event()
    reload_loop(holder, stop)

    def shutdown(*_: object) -> None:
        stop.set()
        server.stop()

    signal.signal(signal.SIGTERM, shutdown)
    log.info("serving", extra={"path": f"{cfg.server.host}:{port or cfg.server.port}"})
    try:
        server.safe_start()
    finally:
        stop.set()
        source.stop()
