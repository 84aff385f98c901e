"""``tandem plan FILE``: squishy bin packing of the sessions and queries in a plan file.

Exit codes: 0 every session placed; 1 some session cannot be placed (listed with
its reason) or would miss its SLO under the deployed round-robin dispatch (a plan
made with ``--batch-aware-dispatch`` needs a batch-aware dispatcher; listed under
``dispatch.deployed_slo_misses``); 2 the file is missing, not YAML, or invalid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

_SWITCH_HELP = "Harpagon switch (overrides the file's options and --harpagon)."


def plan_command(
    file: Path = typer.Argument(
        ..., help="Plan file (YAML): gpu_types, profiles, sessions, queries."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    harpagon: bool = typer.Option(
        False, "--harpagon/--no-harpagon", help="Every Harpagon switch on."
    ),
    batch_aware_dispatch: bool | None = typer.Option(
        None, "--batch-aware-dispatch/--no-batch-aware-dispatch", help=_SWITCH_HELP
    ),
    multi_tuple: bool | None = typer.Option(
        None, "--multi-tuple/--no-multi-tuple", help=_SWITCH_HELP
    ),
    dummy_requests: bool | None = typer.Option(
        None, "--dummy-requests/--no-dummy-requests", help=_SWITCH_HELP
    ),
    latency_reassignment: bool | None = typer.Option(
        None, "--latency-reassignment/--no-latency-reassignment", help=_SWITCH_HELP
    ),
    cost_per_gpu_type: bool | None = typer.Option(
        None, "--cost-per-gpu-type/--no-cost-per-gpu-type", help=_SWITCH_HELP
    ),
    latency_cost_split: bool | None = typer.Option(
        None, "--latency-cost-split/--no-latency-cost-split", help=_SWITCH_HELP
    ),
    step_ms: float = typer.Option(1.0, "--step-ms", min=0.01, help="Latency-split grid (ms)."),
) -> None:
    """Plan GPUs for inference sessions: gpu_count, duty cycles, batches, occupancy."""
    import dataclasses

    from contracts.profilefile import ProfileFileError, load_yaml
    from lab.planning.options import HarpagonOptions
    from lab.planning.plan import plan
    from lab.planning.planfile import parse_plan
    from planner.types import PlanFileError

    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        _fail([f"{file}: cannot read ({exc.strerror or exc})"])
    try:
        doc = load_yaml(text, str(file))  # the profile files' loader: a key twice is refused
    except ProfileFileError as exc:
        _fail([f"{file}: not valid YAML: {p}" for p in exc.problems])
    base = HarpagonOptions.harpagon() if harpagon else HarpagonOptions()

    def read_text(where: str) -> str:
        # Paths in a plan file are relative to the plan file, as a user reads them.
        target = Path(where)
        return (target if target.is_absolute() else file.parent / target).read_text("utf-8")

    try:
        spec = parse_plan(doc, base, read_text)
    except PlanFileError as exc:
        _fail([f"{file}: {p}" for p in exc.problems])
    overrides = {
        "batch_aware_dispatch": batch_aware_dispatch,
        "multi_tuple": multi_tuple,
        "dummy_requests": dummy_requests,
        "latency_reassignment": latency_reassignment,
        "cost_per_gpu_type": cost_per_gpu_type,
        "latency_cost_split": latency_cost_split,
    }
    options = dataclasses.replace(
        spec.options, **{k: v for k, v in overrides.items() if v is not None}
    )
    try:
        result, splits = plan(
            spec.sessions,
            spec.queries,
            spec.profiles,
            spec.gpu_types,
            options,
            allowed_batches=spec.allowed_batches,
            step_ms=step_ms,
        )
    except ValueError as exc:  # QueryError: no split meets a query's SLO
        _fail([f"{file}: {exc}"])
    out = render(result, splits, options)
    if as_json:
        typer.echo(json.dumps(out, sort_keys=False))
    else:
        typer.echo(render_table(out))
    # A plan the deployed request path cannot keep is not a placement of those sessions.
    if result.unplaced or out["dispatch"]["deployed_slo_misses"]:
        raise typer.Exit(1)


def _fail(problems: list[str]) -> None:
    for p in problems:
        typer.echo(f"error: {p}", err=True)
    raise typer.Exit(2)


def render(result: Any, splits: Any, options: Any) -> dict[str, Any]:
    """The ``--json`` object (DESIGN.md keys first, extra keys after)."""
    import dataclasses

    from planner.dispatch import DEPLOYED_DISPATCH, deployed_worst_case_ms

    gpus = []
    misses = []
    for g in result.gpus:
        for a in g.plan.allocations:
            deployed = deployed_worst_case_ms(g.plan, a)
            # Against the SLO, or the promise where latency reassignment raised a budget.
            if deployed > max(a.session.slo_ms, a.latency_ms) + 1e-6:
                misses.append({"session": a.session.name, "gpu_id": g.gpu_id,
                               "slo_ms": a.session.slo_ms,
                               "worst_case_ms": round(a.latency_ms, 6),
                               "deployed_worst_case_ms": round(deployed, 6)})
        gpus.append(
            {
                "gpu_type": g.plan.gpu_type,
                "duty_cycle_ms": round(g.plan.duty_cycle_ms, 6),
                "occupancy": round(g.plan.occupancy, 6),
                "sessions": [
                    {
                        "name": a.session.name,
                        "batch": int(a.batch),
                        "rate_rps": round(a.rate_rps, 6),
                        "model": a.session.model,
                        "slo_ms": a.session.slo_ms,
                        "worst_case_ms": round(a.latency_ms, 6),
                        "batch_latency_ms": round(a.batch_latency_ms, 6),
                        "deployed_worst_case_ms": round(deployed_worst_case_ms(g.plan, a), 6),
                    }
                    for a in g.plan.allocations
                ],
                "gpu_id": g.gpu_id,
                "cost": g.cost,
                "memory_mib": g.plan.memory_mib,
            }
        )
    return {
        "gpu_count": result.gpu_count,
        "gpus": gpus,
        "total_cost": round(result.total_cost, 6),
        "unplaced": [
            {
                "session": u.session,
                "reason": u.reason.value,
                "required": u.required,
                "available": u.available,
                "message": u.message(),
            }
            for u in result.unplaced
        ],
        "dummy_rps": {k: round(v, 6) for k, v in sorted(result.dummy_rps.items())},
        "queries": {
            name: {"budgets_ms": dict(s.budgets_ms), "gpus": round(s.total_gpus, 6)}
            for name, s in splits.items()
        },
        "options": dataclasses.asdict(options),
        "dispatch": {
            "planned": options.dispatch.value,
            "deployed": DEPLOYED_DISPATCH.value,
            "requires_dispatcher": options.dispatch is not DEPLOYED_DISPATCH,
            "deployed_slo_misses": misses,
        },
    }


def render_table(out: dict[str, Any]) -> str:
    """A readable table of the plan."""
    lines = [f"GPUs: {out['gpu_count']}   total cost: {out['total_cost']:g}"]
    header = f"{'gpu':<8} {'type':<12} {'duty ms':>9} {'occ':>6}  sessions"
    lines.append(header)
    for g in out["gpus"]:
        sessions = ", ".join(
            f"{s['name']} b{s['batch']} {s['rate_rps']:.4g}rps {s['worst_case_ms']:.4g}ms"
            for s in g["sessions"]
        )
        lines.append(
            f"{g['gpu_id']:<8} {g['gpu_type']:<12} {g['duty_cycle_ms']:>9.2f} "
            f"{g['occupancy']:>6.2f}  {sessions}"
        )
    for name, q in out["queries"].items():
        budgets = ", ".join(f"{m}={b:g}ms" for m, b in q["budgets_ms"].items())
        lines.append(f"query {name}: {budgets}")
    for name, rps in out["dummy_rps"].items():
        lines.append(f"dummy requests: {name} +{rps:g} rps")
    for u in out["unplaced"]:
        lines.append(f"UNPLACED {u['message']}")
    dispatch = out["dispatch"]
    if dispatch["requires_dispatcher"]:
        lines.append(f"dispatch: planned {dispatch['planned']}; the deployed request path is "
                     f"{dispatch['deployed']} (a Service over the session's pods)")
    for m in dispatch["deployed_slo_misses"]:
        lines.append(f"MISSES SLO WHEN DEPLOYED {m['session']} on {m['gpu_id']}: "
                     f"{m['deployed_worst_case_ms']:g} ms under {dispatch['deployed']} > "
                     f"SLO {m['slo_ms']:g} ms (planned {m['worst_case_ms']:g} ms)")
    return "\n".join(lines)
