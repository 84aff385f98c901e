"""Assembles an ``Agent`` from command-line values and runs it (used by ``tandem agent run``)."""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from agent.errors import ConfigError
from agent.inference.http.auth import AdminToken, AdminTokenError, is_loopback
from agent.node.attribution import ProcAttributor
from agent.node.extender_view import PlacedJobs, StateClient, ViewHolder
from agent.node.gpus import GpuSource, parse_gpu_source
from agent.node.progress import ProgressScraper
from agent.node.reporter import Reporter, TokenSource
from agent.node.runner import Agent, AgentConfig
from agent.node.sessions import SessionSync
from agent.node.sim_gpus import SimGpuSource, SimJob, load_sim_gpus
from agent.node.supervisor import ServerSupervisor, SupervisorConfig
from contracts.agentreport import decode_report
from contracts.logs import setup_logging

log = logging.getLogger(__name__)


def open_gpu_source(gpus: str, node: str, jobs: Callable[[], Sequence[SimJob]] = tuple,
                    seed: int = 0) -> tuple[GpuSource, Callable[[], None]]:
    """The ``--gpus`` source (NVML, or an explicitly named sim file) and its close function;
    ``jobs`` is the simulated load (the sim source only)."""
    spec = parse_gpu_source(gpus)
    if spec.kind == "sim" and spec.path is not None:
        return SimGpuSource(load_sim_gpus(spec.path, node), jobs, seed=seed), lambda: None
    from agent.node.nvml import NvmlGpuSource

    nvml_source = NvmlGpuSource()
    return nvml_source, nvml_source.close


def build_agent(*, node: str, gpus: str, extender: str | None, interval_seconds: float,
                token_file: Path | None, proc_root: Path, session_host: str,
                session_base_port: int, sessions: bool, seed: int,
                registry: CollectorRegistry | None = None,
                serve: SupervisorConfig | None = None,
                admin_token_file: Path | None = None,
                environ: Mapping[str, str] | None = None,
                ) -> tuple[Agent, list[Callable[[], None]]]:
    """Build the agent and the close functions of what it opened; ``ConfigError`` if invalid.

    ``serve``: supervise one ``tandem agent serve`` child per GPU (started by ``run_forever``).
    ``admin_token_file``: the servers' admin bearer token (else ``$TANDEM_ADMIN_TOKEN``),
    sent by the session sync and handed to the supervised servers.
    """
    try:
        admin_token = AdminToken.configured(admin_token_file, environ=environ)
    except AdminTokenError as err:
        raise ConfigError(str(err)) from None
    if serve is not None:
        if admin_token is None and not is_loopback(serve.host):
            raise ConfigError(f"--serve-host {serve.host} publishes the servers beyond this "
                              "host: give --admin-token-file or set TANDEM_ADMIN_TOKEN")
        serve = replace(serve, admin_token_file=admin_token_file)
    config = AgentConfig(node=node, interval_seconds=interval_seconds)
    views = ViewHolder()
    source, close_source = open_gpu_source(gpus, node, PlacedJobs(views), seed)
    closers: list[Callable[[], None]] = [close_source]
    token = reporter = state = sync = None
    if extender is not None:
        token = TokenSource(token_file)
        reporter, state = Reporter(extender, token), StateClient(extender)
        closers += [reporter.close, state.close]
        if sessions:
            sync = SessionSync(lambda i: f"http://{session_host}:{session_base_port + i}",
                               admin_token=admin_token)
            closers.append(sync.close)
    elif token_file is not None:
        raise ConfigError("--token-file given without --extender")
    agent = Agent(config, source, registry=registry or CollectorRegistry(),
                  attributor=ProcAttributor(proc_root), reporter=reporter, state=state,
                  views=views, sessions=sync, token=token,
                  servers=ServerSupervisor(serve) if serve is not None else None,
                  progress=ProgressScraper() if extender is not None else None,
                  proc_root=proc_root)
    return agent, closers


def _mib(value: float | None) -> str:
    return "None" if value is None else f"{value:.0f}"


def run_once(agent: Agent, json_output: bool) -> int:
    """One step; prints the report (JSON with ``--json``); exit code 1 if the source failed."""
    result = agent.step()
    if result.report is None:
        print(json.dumps({"node": agent.config.node, "error": result.source_error}))
        return 1
    if json_output:
        print(json.dumps(result.report))
    else:
        for gpu in decode_report(result.report).gpus:
            print(f"gpu {gpu.index} {gpu.product} util={gpu.utilization_percent}% "
                  f"mem={_mib(gpu.memory_used_mib)}/{_mib(gpu.memory_total_mib)} MiB "
                  f"processes={len(gpu.processes)}")
    if result.push_error:
        print(f"push failed: {result.push_error}")
    return 0


def run_forever(agent: Agent, metrics_addr: str, metrics_port: int,
                stop: threading.Event | None = None) -> None:
    """Serve /metrics (``metrics_port`` 0: off, as for the queue gate) and step every
    interval until SIGTERM/SIGINT (or ``stop``)."""
    setup_logging()  # every logger of the process, JSON (contracts.logs)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    server = thread = None
    if metrics_port:
        server, thread = start_http_server(metrics_port, metrics_addr, registry=agent.registry)
    log.info("agent started", extra={"node": agent.config.node,
                                     "metrics_port": server.server_port if server else None,
                                     "interval_seconds": agent.config.interval_seconds})
    servers = agent.servers
    watcher = None
    if servers is not None:
        watcher = threading.Thread(target=servers.run, args=(stop,), name="server-supervisor",
                                   daemon=True)
        watcher.start()
    try:
        agent.run(stop)
    finally:
        stop.set()
        if watcher is not None and servers is not None:
            watcher.join(timeout=5)
            codes = servers.stop_children()  # SIGTERM reached only us: pass it on
            log.info("inference servers stopped", extra={"exit_codes": codes})
        if server is not None and thread is not None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        log.info("agent stopped", extra={"node": agent.config.node})
