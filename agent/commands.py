"""``tandem agent``: the node agent (``run``), the per-GPU inference server (``serve``) and
the thin session process of an inference pod (``session``).

Heavy imports (NVML, httpx, prometheus_client) happen inside the command so
``tandem --help`` stays fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from agent.inference.commands import serve_command

app = typer.Typer(no_args_is_help=True)
app.command("serve")(serve_command)

DEFAULT_METRICS_PORT = 9401  # beside dcgm-exporter's 9400, so both can run on a node
DEFAULT_SESSION_BASE_PORT = 8700  # GPU i's inference server listens on base + i


@app.command("run")
def run_command(
    extender: str | None = typer.Option(None, help="Extender base URL; omit to report nowhere."),
    gpus: str = typer.Option("nvml", help="GPU source: 'nvml' or 'sim:FILE' (explicit)."),
    interval_seconds: float = typer.Option(1.0, help="Sampling and report period."),
    metrics_port: int = typer.Option(DEFAULT_METRICS_PORT, help="Prometheus port (0: off)."),
    metrics_addr: str = typer.Option("0.0.0.0", help="Prometheus listen address."),
    token_file: Path | None = typer.Option(None, help="Bearer token file (else "
                                           "$TANDEM_AGENT_TOKEN)."),
    node: str | None = typer.Option(None, help="Node name (default: $NODE_NAME)."),
    proc_root: Path = typer.Option(Path("/proc"), help="Host /proc for pod attribution."),
    session_host: str = typer.Option("127.0.0.1", help="Host of the per-GPU servers."),
    session_base_port: int = typer.Option(DEFAULT_SESSION_BASE_PORT,
                                          help="GPU i's inference server port is base + i."),
    sessions: bool = typer.Option(True, help="Sync inference sessions to the GPU servers."),
    serve_gpus: bool = typer.Option(False, "--serve-gpus/--no-serve-gpus",
                                    help="Run and restart one 'tandem agent serve' per GPU."),
    serve_host: str = typer.Option("127.0.0.1", help="Listen address of the supervised servers "
                                   "(0.0.0.0 where the pod publishes them as hostPorts)."),
    serve_arg: list[str] = typer.Option([], "--serve-arg", help="Extra 'tandem agent serve' "
                                        "argument, repeatable (e.g. --serve-arg=--executor=sim)."),
    admin_token_file: Path | None = typer.Option(
        None, help="Bearer token of the servers' session endpoints (else $TANDEM_ADMIN_TOKEN); "
        "sent by the session sync and passed to the --serve-gpus servers."),
    seed: int = typer.Option(0, help="Noise seed of the sim backend."),
    once: bool = typer.Option(False, help="Take one sample, push it, print it, exit."),
    json_output: bool = typer.Option(False, "--json", help="With --once: print the report."),
    mps: bool = typer.Option(False, "--mps", envvar="TANDEM_MPS",
                             help="Run and keep running one MPS control daemon per GPU "
                             "(nvidia-cuda-mps-control -d), for the device plugin's "
                             "--mps-root."),
    mps_root: Path = typer.Option(Path("/run/tandem/mps"), envvar="TANDEM_MPS_ROOT",
                                  help="Pipe, log and shm directories of the MPS daemons "
                                  "(a host path)."),
) -> None:
    """Run the node agent: NVML (or sim) metrics, reports, /metrics, session sync."""
    import threading

    from agent.errors import ConfigError
    from agent.node.main import build_agent, run_forever, run_once
    from agent.node.mps import MpsDaemonConfig, start_mps_daemons
    from agent.node.supervisor import SupervisorConfig

    node_name = node or os.environ.get("NODE_NAME", "")
    try:
        serve = SupervisorConfig(base_port=session_base_port, host=serve_host,
                                 serve_args=tuple(serve_arg)) if serve_gpus and not once else None
        agent, closers = build_agent(
            node=node_name, gpus=gpus, extender=extender, interval_seconds=interval_seconds,
            token_file=token_file, proc_root=proc_root, session_host=session_host,
            session_base_port=session_base_port, sessions=sessions and not once, seed=seed,
            serve=serve, admin_token_file=admin_token_file)
    except ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        if once:
            raise typer.Exit(run_once(agent, json_output))
        stop = threading.Event()
        daemons = start_mps_daemons(MpsDaemonConfig(root=mps_root), agent.gpu_uuids,
                                    stop) if mps else None
        run_forever(agent, metrics_addr, metrics_port, stop)
        if daemons is not None:
            daemons.join(timeout=30)  # the daemons are told to quit
    finally:
        for close in closers:
            close()


@app.command("session")
def session_command(
    model: str = typer.Option(..., envvar="TANDEM_MODEL",
                              help="Model reference (annotation tandem.io/model)."),
    name: str | None = typer.Option(None, envvar="TANDEM_SESSION_NAME", help="Session name "
                                    "(default: $POD_NAMESPACE.$POD_NAME, as the agent names it)."),
    slo_ms: float | None = typer.Option(None, envvar="TANDEM_SLO_MS", help="Latency SLO."),
    rate_rps: float | None = typer.Option(None, envvar="TANDEM_RATE_RPS",
                                          help="Expected request rate (with --slo-ms)."),
    weight: int | None = typer.Option(None, envvar="TANDEM_WEIGHT",
                                      help="Best effort: integer share (default 1)."),
    priority: int | None = typer.Option(None, envvar="TANDEM_PRIORITY",
                                        help="Best effort: priority class."),
    server: str | None = typer.Option(None, envvar="TANDEM_SERVER_URL",
                                      help="Inference server URL (default: from the next two)."),
    gpu_index: str | None = typer.Option(None, envvar="TANDEM_GPU_INDEX",
                                         help="Annotation tandem.io/gpu-index (one GPU)."),
    server_host: str = typer.Option("127.0.0.1", envvar="TANDEM_SERVER_HOST",
                                    help="Node address of the servers (status.hostIP)."),
    server_base_port: int = typer.Option(DEFAULT_SESSION_BASE_PORT,
                                         help="GPU i's server port is base + i."),
    listen: int = typer.Option(8080, help="Port this process serves the inference API on."),
    listen_host: str = typer.Option("0.0.0.0", help="Listen address."),
    max_body_mib: int = typer.Option(64, help="Largest request body forwarded."),
    read_deadline_seconds: float = typer.Option(
        10.0, help="A request must arrive in full within this of its first byte (0.1..600)."),
    threads: int = typer.Option(16, help="HTTP worker threads."),
    check_interval_seconds: float = typer.Option(5.0, help="Registration re-check period."),
    shutdown_delay_seconds: float = typer.Option(3.0, help="Serve this long after SIGTERM "
                                                 "while not ready (endpoint removal lag)."),
    deregister: bool = typer.Option(True, help="Delete the session on shutdown."),
    admin_token_file: Path | None = typer.Option(
        None, help="The servers' admin bearer token, sent when registering and deleting "
        "the session (else $TANDEM_ADMIN_TOKEN)."),
) -> None:
    """Register this pod's session with its GPU's server and forward requests to it."""
    from agent.inference.http.auth import AdminToken, AdminTokenError
    from agent.session.http import ProxyConfig, ProxyServer, serve_forever
    from agent.session.proxy import (
        ProxyConfigError,
        SessionLink,
        parse_gpu_index,
        server_url,
        session_request,
    )
    from contracts.logs import setup_logging

    setup_logging()
    try:
        if name is None:
            pod, namespace = os.environ.get("POD_NAME", ""), os.environ.get("POD_NAMESPACE", "")
            name = f"{namespace}.{pod}"
        index = parse_gpu_index(gpu_index) if server is None or gpu_index else 0
        url = server or server_url(server_host, index, server_base_port)
        request = session_request(name, model, index, slo_ms=slo_ms, rate_rps=rate_rps,
                                  weight=weight, priority=priority)
        config = ProxyConfig(listen_host=listen_host, listen_port=listen,
                             max_body_bytes=max_body_mib * 2**20,
                             check_interval_seconds=check_interval_seconds,
                             shutdown_delay_seconds=shutdown_delay_seconds,
                             deregister=deregister, http_threads=threads,
                             read_deadline_seconds=read_deadline_seconds)
        token = AdminToken.configured(admin_token_file)
        proxy = ProxyServer(SessionLink(url, request, admin_token=token), config)
    except (ProxyConfigError, AdminTokenError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        serve_forever(proxy)
    except OSError as err:  # the listen port is taken or not allowed
        typer.echo(f"error: cannot listen on {listen_host}:{listen}: {err}", err=True)
        raise typer.Exit(1) from None


@app.command("device-plugin")
def device_plugin_command(
    extender: str | None = typer.Option(None, help="Extender base URL: its /v1/state says "
                                        "which GPUs each pod was bound to (required unless "
                                        "--list)."),
    gpus: str = typer.Option("nvml", help="GPU source for inventory and health: 'nvml' or "
                             "'sim:FILE' (explicit)."),
    node: str | None = typer.Option(None, help="Node name (default: $NODE_NAME)."),
    token_file: Path | None = typer.Option(None, help="Bearer token file for the extender "
                                           "(else $TANDEM_AGENT_TOKEN)."),
    shares: int = typer.Option(8, help="Devices advertised per GPU: the co-location limit "
                               "(the extender's max_pods_per_gpu)."),
    plugin_dir: Path = typer.Option(Path("/var/lib/kubelet/device-plugins"),
                                    help="The kubelet's device plugin directory."),
    pod_resources_socket: Path = typer.Option(
        Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        help="The kubelet's pod resources API (which pods already hold devices)."),
    cdi_dir: list[Path] = typer.Option([], "--cdi-dir", help="CDI spec directory, repeatable "
                                       "(default: /etc/cdi and /var/run/cdi)."),
    health_interval_seconds: float = typer.Option(5.0, help="GPU health poll period."),
    list_devices: bool = typer.Option(False, "--list", help="Print, as JSON, the GPUs that "
                                      "would be advertised (health after one poll, shares, "
                                      "CDI name found) and exit; needs no kubelet or "
                                      "extender."),
    mps_root: Path | None = typer.Option(
        None, envvar="TANDEM_MPS_ROOT", help="Where the node runs MPS (the agent's "
        "--mps-root): each container gets its GPU's MPS pipe and a memory limit equal to "
        "its reservation."),
    mps_thread_percentage: bool = typer.Option(
        False, "--mps-thread-percentage", envvar="TANDEM_MPS_THREAD_PERCENTAGE",
        help="With --mps-root: also cap each container's SMs at its predicted utilisation "
        "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)."),
) -> None:
    """Serve tandem.io/gpu to the kubelet: each container gets the GPUs its pod was bound to."""
    import threading

    from agent.device_plugin.main import build_runner, device_listing, run_plugin
    from agent.device_plugin.mps import MpsSettings
    from agent.device_plugin.server import PluginConfig
    from agent.errors import ConfigError
    from agent.node.extender_view import StateClient
    from agent.node.main import open_gpu_source
    from agent.node.reporter import TokenSource
    from contracts.logs import setup_logging

    setup_logging()
    node_name = node or os.environ.get("NODE_NAME", "")
    stop = threading.Event()
    close_source = None
    try:
        if not node_name:
            raise ConfigError("no node name: pass --node or set NODE_NAME")
        config = PluginConfig(node=node_name, plugin_dir=plugin_dir, shares_per_gpu=shares,
                              health_interval_seconds=health_interval_seconds)
        if list_devices:
            source, close_list = open_gpu_source(gpus, node_name)
            try:
                typer.echo(json.dumps(device_listing(source, config, cdi_dir), indent=2))
            finally:
                close_list()
            return
        if not extender:
            raise ConfigError("--extender is required (its /v1/state says where pods go)")
        token = TokenSource(token_file)
        state = StateClient(extender)
        source, close_source = open_gpu_source(gpus, node_name)
        runner = build_runner(config, source,
                              lambda: state.fetch(node_name, token.get()),
                              pod_resources_socket, cdi_dir, stop,
                              mps=MpsSettings(mps_root, mps_thread_percentage)
                              if mps_root is not None else None)
    except ConfigError as err:
        if close_source is not None:
            close_source()
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        run_plugin(runner, stop)
    finally:
        state.close()
        close_source()
