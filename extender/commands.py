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
    leadership: str = typer.Option(
        "single", "--leadership",
        help="single (one replica) | follow-scheduler (sidecar: follow kube-scheduler's Lease) "
             "| elect (standalone replicas elect on --lease-name)"),
    lease_name: str | None = typer.Option(
        None, "--lease-name", help="Lease to follow or elect on (POD_NAMESPACE's)"),
) -> None:
    """Run the kube-scheduler extender on cheroot until SIGTERM/SIGINT."""
    from extender.config import ConfigError, ConfigHolder, load_config
    from extender.lifecycle import (
        Draining,
        GracefulShutdown,
        LeadershipSetupError,
        setup_leadership,
    )
    from extender.logs import setup_logging
    from extender.profiles import ProfileFileError, load_profiles
    from extender.routes import create_app
    from extender.runtime import (
        PredictorSetupError,
        SourceSpecError,
        build_predictor,
        build_source,
        default_planner,
    )
    from extender.server import make_server, reload_loop
    from extender.sim import SimFileError

    try:
        cfg = load_config(config)
        log = setup_logging(cfg.log_level)
        predictor = build_predictor(cfg.predictor)
        profiles = load_profiles(cfg.profile_files, cfg.nexus_profiles)
        leader, loop = setup_leadership(leadership, lease_name)
        source = build_source(cluster)
    except (ConfigError, SimFileError, SourceSpecError, ProfileFileError,
            LeadershipSetupError, PredictorSetupError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    holder = ConfigHolder(cfg, loader=lambda: load_config(config))
    draining = Draining()
    app_ = create_app(holder, source, predictor=predictor,
                      profiles=profiles, planner=default_planner(), readiness=[draining],
                      may_bind=leader.is_leader)
    server = make_server(app_, cfg.server, port)
    stop = threading.Event()
    reload_loop(holder, stop)
    shutdown = GracefulShutdown(draining, server, loop, stop)
    signal.signal(signal.SIGTERM, shutdown.on_signal)
    if loop is not None:
        loop.start()
    log.info("serving", extra={"path": f"{cfg.server.host}:{port or cfg.server.port}",
                               "leadership": leadership})
    try:
        server.safe_start()
    finally:
        if draining.active:
            # cheroot's accept loop returns as soon as stop() begins; wait for the drain.
            shutdown.wait(shutdown.shutdown_timeout_seconds + 5)
        else:
            shutdown.run()
        source.stop()
