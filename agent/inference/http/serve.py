"""Build the runtime from command-line options and serve it with cheroot."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.inference.clock import MonotonicClock
from agent.inference.executors.executors import Executor, OrtExecutor, SimExecutor
from agent.inference.http.auth import ADMIN_TOKEN_ENV, AdminGuard, AdminToken, is_loopback
from agent.inference.preparation.batching_profiles import load_profiles
from agent.inference.preparation.limits import ModelLimits
from agent.inference.runtime.batch_formation import DropPolicy
from agent.inference.runtime.executor_tail import (
    ExecutorHost,
    elementwise,
    measure_host,
    steady_host,
)
from agent.inference.runtime.pathcost import (
    HostLimits,
    RequestPathCost,
    RequestPathLimits,
    core_share,
)
from agent.inference.runtime.runtime import RuntimeConfig, ServingRuntime
from predictor.profiles import NO_MARGIN, Margin

if TYPE_CHECKING:
    from agent.inference.executors.torch_executor import TorchExecutor


@dataclass(frozen=True)
class ServeOptions:
    """Validated settings of one inference server."""

    gpu_index: int
    executor: str
    device: str
    port: int
    host: str
    profiles_path: Path | None
    profile_margin: float
    gpu_type: str | None
    memory_mib: float
    model_store: Path | None
    drop_policy: str
    overhead_tolerance_percent: float
    quantum_ms: float | None
    max_body_bytes: int
    post_workers: int
    http_threads: int
    admin_token_file: Path | None = None
    """bearer token of the session endpoints (else $TANDEM_ADMIN_TOKEN)"""
    read_deadline_seconds: float = 30.0
    """a request (inputs up to ``max_body_bytes``) must arrive within this of its first byte"""
    max_input_bytes: int = ModelLimits.max_input_bytes
    """a model's declared input at the largest batch, checked before it is loaded"""
    max_tensor_bytes: int = ModelLimits.max_tensor_bytes
    """a model's largest tensor (shape inference) at the largest batch, checked likewise"""


_POLL_SECONDS = 0.2
_JOIN_SECONDS = 10.0


def build_runtime(options: ServeOptions) -> ServingRuntime:
    """The runtime with the explicitly chosen executor; raises ValueError on bad options."""
    if not 0.1 <= options.read_deadline_seconds <= 600:
        raise ValueError("--read-deadline-seconds must be in 0.1..600")
    try:
        policy = DropPolicy(options.drop_policy)
    except ValueError:
        raise ValueError(f"--drop-policy must be one of {[p.value for p in DropPolicy]}") from None
    clock = MonotonicClock()
    executor: Executor
    if options.executor == "sim":
        if options.profiles_path is None or options.gpu_type is None:
            raise ValueError("--executor sim needs --profiles and --gpu-type")
        gpu_type = options.gpu_type
        # Plan with the margin, execute the measured mean: the margin absorbs real spread.
        profiles = load_profiles(
            options.profiles_path, gpu_type, Margin(1.0, options.profile_margin)
        )
        executed = load_profiles(options.profiles_path, gpu_type, NO_MARGIN)
        executor = SimExecutor(executed, clock, gpu_type)
    elif options.executor in ("onnxruntime", "torch"):
        limits = ModelLimits(store_root=options.model_store,
                             max_input_bytes=options.max_input_bytes,
                             max_tensor_bytes=options.max_tensor_bytes)
        if options.executor == "torch":
            from agent.inference.executors.torch_executor import TorchExecutor

            real: OrtExecutor | TorchExecutor = TorchExecutor(
                options.device, options.gpu_index, options.gpu_type, limits)
        else:
            real = OrtExecutor(options.device, options.gpu_index, options.gpu_type, limits)
        real.preparer.start()  # the model worker's start-up is not met by a registration
        executor, gpu_type = real, real.gpu_type
        profiles = (
            load_profiles(options.profiles_path, gpu_type, Margin(1.0, options.profile_margin))
            if options.profiles_path
            else {}
        )
    else:
        raise ValueError("--executor must be 'onnxruntime', 'torch' or 'sim'")
    config = RuntimeConfig(
        gpu_type=gpu_type,
        memory_mib=options.memory_mib,
        drop_policy=policy,
        overhead_tolerance_percent=options.overhead_tolerance_percent,
        quantum_ms=options.quantum_ms,
        # A real executor's latency varies with the machine: admission learns the headroom.
        learn_latency_margin=options.executor != "sim",
    )
    return ServingRuntime(executor, clock, config, profiles, post_workers=options.post_workers,
                          path_cost=RequestPathCost(),
                          path_limits=HostLimits(lambda: path_limits(options)),
                          executor_probe=executor_probe(executor, config))


def executor_probe(executor: Executor, config: RuntimeConfig
                   ) -> Callable[[], ExecutorHost] | None:
    """How a CPU executor's priority finds the host (``executor_tail``), for start-up and
    each SLO registration; None where the executor's time is not this host's CPU."""
    if not config.learn_latency_margin or getattr(executor, "device", None) != "cpu":
        return None
    return lambda: steady_host(lambda: measure_host(executor, config.latency_quantile))


def path_limits(options: ServeOptions) -> RequestPathLimits:
    """What the request path may hold: the HTTP workers, and the host's cores less the
    one a CPU executor runs on (its one intra-op thread), so neither starves the other.
    The path is Python under one interpreter lock, so at most one core, times the
    share of a core this process gets on the host as it is now (busy or quiet)."""
    cores = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                  else os.cpu_count() or 1)
    executor_cores = 1.0 if options.executor != "sim" and options.device == "cpu" else 0.0
    usable = min(max(cores - executor_cores, 0.5), 1.0) * core_share()
    return RequestPathLimits(workers=options.http_threads, cores=max(usable, 0.05))


def admin_guard(options: ServeOptions, environ: Mapping[str, str] | None = None
                ) -> AdminGuard | None:
    """The admin endpoints' guard; ValueError when a non-loopback listener would have none.

    Without a token the session endpoints are open, which is safe only where no one
    else can connect: a server on the node's address (hostPorts) must have a token.
    """
    token = AdminToken.configured(options.admin_token_file, environ=environ)
    if token is not None:
        return AdminGuard(token)
    if not is_loopback(options.host):
        raise ValueError(f"--host {options.host} is reachable from other hosts: give "
                         f"--admin-token-file or set {ADMIN_TOKEN_ENV}")
    return None


def serve_forever(runtime: ServingRuntime, options: ServeOptions,
                  admin: AdminGuard | None = None,
                  stop: threading.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop``), then shut down; the exit status.

    cheroot serves on a thread; the signal handler only sets ``stop``, and the
    main thread does the shutdown, because stopping cheroot from inside its own
    ``start()`` (the handler runs on the thread that called it) hangs it. Order:
    the runtime stops first, so the batch running finishes and is answered while
    queued and later requests get 503 ``shutdown``; then cheroot stops after its
    workers sent those answers. 1 if the HTTP thread died on its own.
    """
    from agent.inference.http.app import create_app, settle_heap
    from agent.inference.http.calibration import measure, probe_at

    app = create_app(runtime, max_body_bytes=options.max_body_bytes, admin=admin,
                     freeze_gc=True)
    server = http_server(app, options)
    # Python's own 5 ms interpreter-lock switch interval is kept: 1 ms made the clients'
    # request path p99 235 ms against 55 ms on a 2-core host (issue #43's client check).
    warm_up(app)
    probe = executor_probe(runtime.execution.executor, runtime.config)
    settle_heap()  # a full collection during the calibration would stall its requests
    # A CPU executor computes in this process beside the request path: the calibration's
    # stand-in does too (outside the interpreter lock, at the executor's priority).
    runtime.path_cost.recalibrate(measure(options.http_threads,
                                          work=elementwise() if probe else None)[0])
    if probe is not None:
        # Each SLO registration before requests were served measures the path again,
        # beside the sessions' own models on this executor (``registration``).
        runtime.path_cost.probe = lambda rate, work, cycle: probe_at(options.http_threads,
                                                                     rate, work, cycle)
        host = probe()
        runtime.planning.margin.observe_host(host.delay_ms, host.share)
    settle_heap()
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    server.prepare()  # bind here, so a taken port fails before anything starts
    runtime.start()
    http = threading.Thread(target=server.serve, name="tandem-http", daemon=True)
    http.start()
    _event("serving", host=options.host, port=int(server.bind_addr[1]), gpu=options.gpu_index,
           executor=runtime.execution.executor.kind, gpu_type=runtime.config.gpu_type,
           admin_auth=admin is not None)
    # Poll rather than wait forever, so a dead HTTP thread also ends the process.
    while not stop.wait(_POLL_SECONDS) and http.is_alive():
        pass
    crashed = not stop.is_set()
    runtime.stop()
    server.stop()
    http.join(timeout=_JOIN_SECONDS)
    _event("stopped", gpu=options.gpu_index, reason="http thread died" if crashed else "signal")
    return 1 if crashed else 0


def warm_up(app: Any, repeats: int = 10) -> None:
    """Requests through ``app`` before it listens, for a session that does not exist
    (none does yet): a fresh app's first requests import and cache what later ones
    reuse (the first of the start-up calibration's took 4-10 ms, the next 2-3 ms), and
    a client's first request must not pay for it."""
    from agent.inference.runtime.tensors import encode_npy

    client = app.test_client()
    body = encode_npy(np.zeros((1, 4), np.float32))
    for _ in range(repeats):
        client.post("/v1/sessions/warm-up/infer", data=body, content_type="application/x-npy")
        client.get("/v1/sessions")


def http_server(app: Any, options: ServeOptions) -> Any:
    """The cheroot server; requests are gathered before a worker takes them, so slow
    clients cannot take the ``http_threads`` workers (``contracts.httpserve``), and read
    and answered through ``contracts.httpfront.DirectFiles``."""
    from cheroot import wsgi

    from contracts.httpfront import direct_files
    from contracts.httpserve import harden

    server = wsgi.Server((options.host, options.port), app, numthreads=options.http_threads,
                         request_queue_size=128)
    return direct_files(harden(server, options.read_deadline_seconds, options.max_body_bytes))


def _event(name: str, **fields: object) -> None:
    print(json.dumps({"event": name, **fields}), file=sys.stderr, flush=True)
