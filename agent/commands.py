"""``tandem agent``: the node agent (``run``) and the per-GPU inference server (``serve``).

Heavy imports (NVML, httpx, prometheus_client) happen inside the command so
``tandem --help`` stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from agent.server.commands import serve_command

app = typer.Typer(no_args_is_help=True)
app.command("serve")(serve_command)

DEFAULT_METRICS_PORT = 9401  # beside dcgm-exporter's 9400, so both can run on a node
DEFAULT_SESSION_BASE_PORT = 8700  # GPU i's inference server listens on base + i


@app.command("run")
def run_command(
    extender: str | None = typer.Option(None, help="Extender base URL; omit to report nowhere."),
    gpus: str = typer.Option("nvml", help="GPU source: 'nvml' or 'sim:FILE' (explicit)."),
    interval_seconds: float = typer.Option(1.0, help="Sampling and report period."),
    metrics_port: int = typer.Option(DEFAULT_METRICS_PORT, help="Prometheus port (0: any)."),
    metrics_addr: str = typer.Option("0.0.0.0", help="Prometheus listen address."),
    token_file: Path | None = typer.Option(None, help="Bearer token file (else "
                                           "$TANDEM_AGENT_TOKEN)."),
    node: str | None = typer.Option(None, help="Node name (default: $NODE_NAME)."),
    proc_root: Path = typer.Option(Path("/proc"), help="Host /proc for pod attribution."),
    session_host: str = typer.Option("127.0.0.1", help="Host of the per-GPU servers."),
    session_base_port: int = typer.Option(DEFAULT_SESSION_BASE_PORT,
                                          help="GPU i's inference server port is base + i."),
    sessions: bool = typer.Option(True, help="Sync inference sessions to the GPU servers."),
    seed: int = typer.Option(0, help="Noise seed of the sim backend."),
    once: bool = typer.Option(False, help="Take one sample, push it, print it, exit."),
    json_output: bool = typer.Option(False, "--json", help="With --once: print the report."),
) -> None:
    """Run the node agent: NVML (or sim) metrics, reports, /metrics, session sync."""
    from agent.errors import ConfigError
    from agent.main import build_agent, run_forever, run_once

    node_name = node or os.environ.get("NODE_NAME", "")
    try:
        agent, closers = build_agent(
            node=node_name, gpus=gpus, extender=extender, interval_seconds=interval_seconds,
            token_file=token_file, proc_root=proc_root, session_host=session_host,
            session_base_port=session_base_port, sessions=sessions and not once, seed=seed)
    except ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        if once:
            raise typer.Exit(run_once(agent, json_output))
        run_forever(agent, metrics_addr, metrics_port)
    finally:
        for close in closers:
            close()
