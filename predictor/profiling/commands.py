"""``tandem profile run|plan``: profiling campaigns that write ``training_data/<gpu>/``.

Imports only Typer at module level (the root CLI stays fast); the work is in
:mod:`.runner` and :mod:`.campaign`.
"""

from __future__ import annotations

import enum
import inspect
import json
import shlex
import sys
import typing
from pathlib import Path
from typing import Any

import typer


class Action(enum.StrEnum):
    """What ``tandem profile`` does."""

    run = "run"
    plan = "plan"


class PhaseChoice(enum.StrEnum):
    """Which phases a run executes."""

    all = "all"
    isolated = "isolated"
    colocated = "colocated"


def _split(values: list[str] | None) -> tuple[str, ...] | None:
    if not values:
        return None
    return tuple(v.strip() for item in values for v in item.split(",") if v.strip())


def _ints(values: list[str] | None) -> tuple[int, ...] | None:
    items = _split(values)
    if items is None:
        return None
    try:
        return tuple(int(v) for v in items)
    except ValueError as exc:
        raise typer.BadParameter(f"batch sizes must be integers: {exc}") from exc


def profile_command(
    action: Action = typer.Argument(..., help="run: profile and write rows; plan: print the plan"),
    backend: str = typer.Option("cuda", help="cuda (a real GPU) or sim:FILE (synthetic, tests)"),
    out: Path = typer.Option(Path("training_data"), help="root; rows go to OUT/<gpu-product>/"),
    spec: Path | None = typer.Option(None, help="campaign spec YAML (options override it)"),
    models: list[str] | None = typer.Option(None, help="model names (comma list or repeated)"),
    families: list[str] | None = typer.Option(None, help="keep only these families"),
    workloads: list[str] | None = typer.Option(None, help="training,inference"),
    batch_sizes: list[str] | None = typer.Option(None, help="batch sizes for every workload"),
    pairs: int | None = typer.Option(None, help="co-located pairs wanted in total"),
    triples: int | None = typer.Option(None, help="co-located triples wanted in total"),
    seed: int | None = typer.Option(None, help="seed of the combination choice"),
    budget_seconds: float | None = typer.Option(None, help="stop cleanly before this wall time"),
    warmup_seconds: float | None = typer.Option(None, help="warm-up before measuring"),
    measure_seconds: float | None = typer.Option(None, help="measured window per run"),
    sample_interval_ms: float | None = typer.Option(None, help="NVML polling period, 100-250"),
    optimizer: str | None = typer.Option(None, help="sgd or adam for training steps"),
    phase: PhaseChoice = typer.Option(PhaseChoice.all, help="run only one phase"),
    resume: bool = typer.Option(False, help="add to existing data, skipping what is there"),
    gpu_index: int = typer.Option(0, help="NVML index of the GPU to profile"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    progress: bool = typer.Option(True, help="show a progress bar on stderr"),
) -> None:
    """Profile models on a GPU in isolation and co-located; write training_data/<gpu>/."""
    from predictor.profiling.campaign import no_progress
    from predictor.profiling.errors import ProfilingError
    from predictor.profiling.runner import parse_backend, plan_report, run_campaign, tqdm_progress
    from predictor.profiling.spec import CampaignSpec, load_spec, with_overrides

    sizes = _ints(batch_sizes)
    try:
        base = load_spec(spec) if spec else CampaignSpec()
        campaign_spec = with_overrides(
            base, models=_split(models), families=_split(families),
            workloads=_split(workloads),
            batch_sizes=None if sizes is None else dict.fromkeys(("training", "inference"), sizes),
            pairs=pairs, triples=triples, seed=seed, budget_seconds=budget_seconds,
            warmup_seconds=warmup_seconds, measure_seconds=measure_seconds,
            sample_interval_ms=sample_interval_ms, optimizer=optimizer,
        )  # fmt: skip
        phases = ("isolated", "colocated") if phase is PhaseChoice.all else (phase.value,)
        command = _command_line(sys.argv)
        choice = parse_backend(backend)
        if action is Action.plan:
            result = plan_report(choice, out, campaign_spec, gpu_index)
        else:
            result = run_campaign(
                choice,
                out,
                campaign_spec,
                phases,
                resume=resume,
                command=command,
                gpu_index=gpu_index,
                progress=tqdm_progress if progress else no_progress,
            )
    except ProfilingError as exc:
        typer.echo(f"tandem profile: {exc}", err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
    else:
        typer.echo(_human(action, result))


def _subcommand(action: Action, doc: str):
    """``profile_command`` with ``action`` fixed: ``tandem profile run`` and ``plan`` are
    subcommands with the same options (one signature, so the two never drift)."""
    params = [p for p in inspect.signature(profile_command).parameters.values()
              if p.name != "action"]

    def command(**options: Any) -> None:
        profile_command(action, **options)

    hints = typing.get_type_hints(profile_command)
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [p.replace(annotation=hints[p.name]) for p in params])
    command.__annotations__ = {p.name: hints[p.name] for p in params}
    command.__doc__ = doc
    command.__name__ = action.value
    return command


profile_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="Profiling campaigns on a GPU; they write training_data/<gpu>/.")
profile_app.command("run")(_subcommand(
    Action.run, "Profile models in isolation and co-located; write training_data/<gpu>/."))
profile_app.command("plan")(_subcommand(
    Action.plan, "Print what a run would profile and about how long it takes."))


def _command_line(argv: list[str]) -> str:
    """The invocation as a shell line, for provenance."""
    if argv and argv[0].endswith("__main__.py"):
        return shlex.join(["python", "-m", "predictor.profiling", *argv[1:]])
    return shlex.join([Path(argv[0]).name if argv else "tandem", *argv[1:]])


def _human(action: Action, result: dict[str, Any]) -> str:
    if action is Action.plan:
        iso, colo = result["isolated"], result["colocated"]
        return (
            f"{result['gpu_dir'] or '(GPU unknown)'}: {iso['remaining']} isolated to run "
            f"({iso['done']} done), {len(colo['combos'])} co-located planned "
            f"({colo['done']} done); about {result['estimated_seconds']:.0f} s"
        )
    return (
        f"{result['gpu_dir']}: {result['state']}; isolated {result['isolated_run']} run, "
        f"{result['isolated_existing']} already there; co-located {result['colocated_run']} "
        f"run, {result['colocated_existing']} already there; statuses {result['statuses']}; "
        f"{len(result['skipped'])} skipped"
    )
