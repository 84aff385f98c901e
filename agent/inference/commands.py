"""``tandem agent serve``: the per-GPU inference server (imports its libraries lazily)."""

from __future__ import annotations

from pathlib import Path

import typer

DEFAULT_BASE_PORT = 8700  # GPU i listens on base + i, as the agent's session sync expects


def serve_command(
    gpu: int = typer.Option(0, "--gpu", help="GPU index this server owns."),
    executor: str = typer.Option(
        ..., "--executor", help="'onnxruntime', 'torch' (ONNX graphs run by torch) or 'sim'."
    ),
    device: str = typer.Option(
        "cuda", "--device", help="onnxruntime/torch device: 'cuda' or 'cpu' (never a fallback)."
    ),
    port: int | None = typer.Option(None, "--port", help="Listen port (default 8700 + GPU index)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Listen address (node-local by default)."),
    profiles: Path | None = typer.Option(
        None, "--profiles", help="Batching profiles: Nexus dir/file or YAML list."
    ),
    profile_margin: float = typer.Option(1.15, help="Multiplier on Nexus (mean+std) latencies."),
    gpu_type: str | None = typer.Option(None, help="Profile GPU type (sim: required)."),
    memory_mib: float = typer.Option(1e12, help="GPU memory the planner may give to models."),
    model_store: Path | None = typer.Option(None, help="Models must lie under this directory."),
    drop_policy: str = typer.Option("early", help="'early' (sliding window) or 'lazy'."),
    overhead_tolerance_percent: float = typer.Option(2.0, help="Quanta overhead tolerance."),
    quantum_ms: float | None = typer.Option(None, help="Fixed quantum instead of the curve."),
    max_body_mib: int = typer.Option(64, help="Largest accepted request body."),
    max_input_bytes: int = typer.Option(
        2**30, min=1, help="Refuse (422) a model whose declared input, at batch 64, is larger."
    ),
    max_tensor_bytes: int = typer.Option(
        4 * 2**30, min=1, help="Refuse (422) a model with a larger tensor at batch 64 "
        "(ONNX shape inference, before loading or profiling)."
    ),
    post_workers: int = typer.Option(4, help="Post-processing threads beside the GPU thread."),
    threads: int = typer.Option(
        64, help="HTTP worker threads; each holds a request until it is answered, so "
        "admission refuses sessions whose requests in flight would need more."),
    read_deadline_seconds: float = typer.Option(
        30.0, help="A request (inputs up to --max-body-mib) must arrive in full within this "
        "of its first byte (0.1..600)."),
    admin_token_file: Path | None = typer.Option(
        None, help="Bearer token of POST/DELETE /v1/sessions (else $TANDEM_ADMIN_TOKEN); "
        "required unless --host is loopback."
    ),
) -> None:
    """Run the per-GPU inference server: Nexus duty cycles and Olympian quanta."""
    from agent.inference.http.serve import ServeOptions, admin_guard, build_runtime, serve_forever

    options = ServeOptions(
        gpu_index=gpu,
        executor=executor,
        device=device,
        port=DEFAULT_BASE_PORT + gpu if port is None else port,
        host=host,
        profiles_path=profiles,
        profile_margin=profile_margin,
        gpu_type=gpu_type,
        memory_mib=memory_mib,
        model_store=model_store,
        drop_policy=drop_policy,
        overhead_tolerance_percent=overhead_tolerance_percent,
        quantum_ms=quantum_ms,
        max_body_bytes=max_body_mib * 2**20,
        max_input_bytes=max_input_bytes,
        max_tensor_bytes=max_tensor_bytes,
        post_workers=post_workers,
        http_threads=threads,
        admin_token_file=admin_token_file,
        read_deadline_seconds=read_deadline_seconds,
    )
    try:
        admin = admin_guard(options)  # first: a missing token must not wait for model loads
        runtime = build_runtime(options)
    except (ValueError, RuntimeError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        code = serve_forever(runtime, options, admin)
    except OSError as exc:  # the port is taken or not allowed
        typer.echo(f"error: cannot listen on {options.host}:{options.port}: {exc}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)
