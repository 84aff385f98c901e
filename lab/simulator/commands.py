"""``tandem simulate``: replay a trace through the extender's decisions under several policies.

Heavy imports happen inside the command so that ``tandem --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

POLICY_HELP = "fifo | obp | pab | horus | horus-f | tandem (repeatable; default: all)"


def simulate_command(
    trace: Annotated[Path | None, typer.Option(help="Trace file (.json, .yaml, .csv).")] = None,
    workload: Annotated[str | None, typer.Option(
        help="Generated workload: w-small | w-large | production.")] = None,
    policy: Annotated[list[str] | None, typer.Option(help=POLICY_HELP)] = None,
    cluster: Annotated[str | None, typer.Option(
        help="testbed | large | sim:FILE (default: testbed for w-*, large otherwise).")] = None,
    config: Annotated[Path | None, typer.Option(
        help="Extender config YAML for the tandem policy (default: the packaged one).")] = None,
    interference: Annotated[str, typer.Option(help="curve | linear (the paper's simulator).")]
    = "curve",
    jobs: Annotated[int, typer.Option(help="Jobs in the production workload.")] = 2000,
    seed: Annotated[int, typer.Option(help="Seed of the workload generator.")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    plots: Annotated[Path | None, typer.Option(help="Directory for PNG plots.")] = None,
    timeline: Annotated[Path | None, typer.Option(
        help="Write per-GPU timelines (CSV: policy,t_s,gpu,util_percent,mem_mib,jobs).")] = None,
    sweep: Annotated[bool, typer.Option(help="Grid-search the tandem policy's settings.")] = False,
    grid: Annotated[str | None, typer.Option(
        help="Sweep grid, e.g. 'w_util=1,2,4;max_pods_per_gpu=2,3' (default grid otherwise).")]
    = None,
    sweep_out: Annotated[Path, typer.Option(help="Where --sweep writes the best config.")]
    = Path("tandem-sweep-best.yaml"),
    truth: Annotated[Path | None, typer.Option(
        help="Ground truth YAML (true utilisation, memory, curves; docs/tuning.md): agents "
             "report it and the tandem policy learns it online.")] = None,
    models: Annotated[str, typer.Option(
        help="Group a generated workload's jobs into N models (model-00 ...), so a --truth "
             "can name them; 'truth': draw each job's model from the --truth file's models "
             "(seeded by --seed); 0: none.")] = "0",
    knowledge: Annotated[str, typer.Option(
        help="With --truth, what tandem knows of modelled jobs: online | prior | oracle.")]
    = "online",
    pods: Annotated[Path | None, typer.Option(
        help="A pod list in the public GPU-sharing trace format (with --nodes): run the "
             "inflation protocol (docs/tuning.md#packing-a-production-trace).")] = None,
    nodes: Annotated[Path | None, typer.Option(
        help="The trace's node list (with --pods).")] = None,
    seeds: Annotated[int, typer.Option(help="With --pods: arrival orders (seeds 0..N-1).")]
    = 1,
) -> None:
    """Simulate a GPU cluster replaying the extender's filter/score/bind under each policy."""
    from lab.simulator.cli_support import CommandError, run_command, run_trace_command

    try:
        if pods is not None or nodes is not None:
            output = run_trace_command(pods=pods, nodes=nodes, policies=policy or [],
                                       seeds=seeds, config=config, sweep=sweep, grid=grid)
        else:
            output = run_command(trace=trace, workload=workload, policies=policy or [],
                                 cluster=cluster, config=config, interference=interference,
                                 jobs=jobs, seed=seed, plots=plots, timeline=timeline, sweep=sweep,
                                 grid=grid, sweep_out=sweep_out, progress=not json_out,
                                 truth=truth, models=models, knowledge=knowledge)
    except CommandError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        typer.echo(json.dumps(output["json"], sort_keys=False))
    else:
        typer.echo(output["text"])


def import_interference_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Truth YAML to write.")],
    gavel: Annotated[Path | None, typer.Option(
        help="Gavel measurements JSON (gpus.<gpu>.<job>.alone / .with.<other>).")] = None,
    gpu: Annotated[str | None, typer.Option(
        help="With --gavel: which GPU of the file: p100 | k80 | ...")] = None,
    profiled: Annotated[Path | None, typer.Option(
        help="A profiling campaign's GPU directory (tandem profile run): its measured "
             "pairs and its models alone.")] = None,
) -> None:
    """Turn measured pairwise interference into a simulator truth file (interference: ...).

    The file also serves as a measured matrix for learning.pair_prior."""
    import yaml

    from lab.simulator.pairwise import GavelError, import_gavel
    from lab.simulator.profiled import ProfiledError, import_profiled
    from lab.simulator.truth import Truth, truth_document

    source = gavel if profiled is None else profiled
    if (gavel is None) == (profiled is None) or (gavel is not None and not gpu):
        typer.echo("tandem import-interference: give --gavel FILE --gpu NAME, or --profiled DIR",
                   err=True)
        raise typer.Exit(2)
    models = {}
    try:
        if profiled is not None:
            gpu_type, table, models = import_profiled(profiled)
        else:
            assert gavel is not None and gpu is not None
            gpu_type, table = import_gavel(json.loads(gavel.read_text()), gpu)
    except OSError as exc:
        typer.echo(f"tandem import-interference: cannot read {source}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    except (ValueError, GavelError, ProfiledError) as exc:
        typer.echo(f"tandem import-interference: {source}: {exc}", err=True)
        raise typer.Exit(2) from None
    doc = truth_document(Truth(models=models, interference={gpu_type: table}))
    out.write_text(yaml.safe_dump(doc, sort_keys=True))
    pairs = sum(len(row) for row in table.slowdown.values())
    typer.echo(f"wrote {out}: {gpu_type}, {len(table.models())} models, {pairs} measured "
               f"pairs, {len(table.cannot_share)} that cannot share")
