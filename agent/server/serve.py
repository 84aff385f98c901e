"""Build the runtime from command-line options and serve it with cheroot."""

from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from agent.server.clock import MonotonicClock
from agent.server.dispatch import DropPolicy
from agent.server.executors import Executor, ModelLimits, OrtExecutor, SimExecutor
from agent.server.profiles import load_profiles
from agent.server.runtime import RuntimeConfig, ServingRuntime
from predictor.profiles import NO_MARGIN, Margin


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


def build_runtime(options: ServeOptions) -> ServingRuntime:
    """The runtime with the explicitly chosen executor; raises ValueError on bad options."""
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
    elif options.executor == "onnxruntime":
        limits = ModelLimits(store_root=options.model_store)
        executor = OrtExecutor(options.device, options.gpu_index, options.gpu_type, limits)
        gpu_type = executor.gpu_type
        profiles = (
            load_profiles(options.profiles_path, gpu_type, Margin(1.0, options.profile_margin))
            if options.profiles_path
            else {}
        )
    else:
        raise ValueError("--executor must be 'onnxruntime' or 'sim'")
    config = RuntimeConfig(
        gpu_type=gpu_type,
        memory_mib=options.memory_mib,
        drop_policy=policy,
        overhead_tolerance_percent=options.overhead_tolerance_percent,
        quantum_ms=options.quantum_ms,
    )
    return ServingRuntime(executor, clock, config, profiles, post_workers=options.post_workers)


def serve_forever(runtime: ServingRuntime, options: ServeOptions) -> None:
    """Start the executor thread and the HTTP server; stop both on SIGTERM/SIGINT."""
    from cheroot import wsgi

    from agent.server.app import create_app

    app = create_app(runtime, max_body_bytes=options.max_body_bytes)
    server = wsgi.Server((options.host, options.port), app, numthreads=options.http_threads)
    stop = threading.Event()

    def _stop(_signum: int, _frame: object) -> None:
        stop.set()
        server.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    runtime.start()
    print(
        json.dumps(
            {
                "event": "serving",
                "host": options.host,
                "port": options.port,
                "gpu": options.gpu_index,
                "executor": runtime.executor.kind,
                "gpu_type": runtime.config.gpu_type,
            }
        ),
        file=sys.stderr,
        flush=True,
    )
    try:
        server.start()
    finally:
        runtime.stop()
