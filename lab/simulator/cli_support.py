"""The work behind ``tandem simulate`` (kept apart from Typer so it is easy to test)."""

from __future__ import annotations

import contextlib
import csv
import io
import platform
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from contracts.clusterfile import ClusterFileError
from contracts.extras import missing_extra
from lab.simulator.cluster import load_cluster
from lab.simulator.engine import EngineConfig
from lab.simulator.interference import InterferenceError
from lab.simulator.jobs import TraceError, load_trace
from lab.simulator.metrics import SimulationResult
from lab.simulator.policies import POLICIES, PolicyError, PolicyOptions, make_policy
from lab.simulator.progress import ProgressPolicy, bar, wanted
from lab.simulator.sweep import SweepError, best_snippet, grid_size, parse_grid, run_sweep
from lab.simulator.workloads import (
    DEFAULT_CLUSTER,
    WorkloadError,
    generate,
    production,
    with_models,
    with_named_models,
)

HEADLINE = ("makespan_s", "avg_gpu_util", "avg_jct_s", "avg_run_s", "avg_wait_s")


class CommandError(ValueError):
    """Bad command-line input, rendered as one line on stderr (exit code 2)."""


def _models_option(models: int | str, truth: Path | None) -> int | list[str]:
    """``--models``: a number of groups, or the truth file's model names (``truth``)."""
    if isinstance(models, int):
        count = models
    elif str(models).strip() == "truth":
        if truth is None:
            raise CommandError("--models truth needs --truth FILE")
        from lab.simulator.truth import TruthError, load_truth, truth_models

        try:
            names = truth_models(load_truth(truth))
        except TruthError as exc:
            raise CommandError(f"--truth: {exc}") from None
        if not names:
            raise CommandError(f"--models truth: {truth} names no models")
        return names
    else:
        try:
            count = int(str(models))
        except ValueError:
            raise CommandError(f"--models must be a number >= 0 or 'truth', got {models!r}") \
                from None
    if count < 0:
        raise CommandError("--models must be >= 0")
    return count


def _load_inputs(trace: Path | None, workload: str | None, cluster: str | None, jobs: int,
                 seed: int, models: int | list[str] = 0) -> tuple[list[Any], list[Any], str]:
    if (trace is None) == (workload is None):
        raise CommandError("give exactly one of --trace FILE or --workload NAME")
    try:
        if trace is not None:
            job_list = load_trace(trace)
            label = str(trace)
        elif workload == "production":
            nodes_for_size = load_cluster(cluster or "large")
            job_list = production(seed, jobs=jobs, gpus=sum(len(n.gpus) for n in nodes_for_size))
            label = f"production ({jobs} jobs, seed {seed})"
        else:
            job_list = generate(str(workload), seed)
            label = f"{workload} (seed {seed})"
        if models:
            if trace is not None:
                raise CommandError("--models groups a generated workload; a trace names its "
                                   "jobs' models itself")
            if isinstance(models, list):
                job_list = with_named_models(job_list, models, seed)
                label += f", {len(models)} models of the truth"
            else:
                job_list = with_models(job_list, models)
                label += f", {models} models"
        nodes = load_cluster(cluster or DEFAULT_CLUSTER.get(str(workload), "large"))
    except (TraceError, WorkloadError, ClusterFileError) as exc:
        raise CommandError(str(exc)) from None
    return job_list, nodes, label


def _options(config: Path | None) -> PolicyOptions:
    if config is None:
        return PolicyOptions()
    from extender.config.loader import load_config
    from extender.config.schema import ConfigError
    from lab.simulator.policies import tandem_queue

    try:
        cfg = load_config(config, environ={})
    except ConfigError as exc:
        raise CommandError(f"--config {config}: {exc}") from None
    # The sweep's base queue comes from the file too; the simulator keeps its refit cadence.
    queue = replace(tandem_queue(), k=cfg.queue.k, beta=cfg.queue.beta,
                    starvation_seconds=cfg.queue.starvation_seconds)
    return PolicyOptions(cost=cfg.policy, queue=queue)


def _table(results: dict[str, SimulationResult]) -> str:
    lines = [f"{'policy':<8}{'makespan_s':>11}{'util_%':>7}{'avg_jct_s':>10}{'avg_run_s':>10}"
             f"{'avg_wait_s':>11}{'p95_wait_s':>11}{'ooms':>5}{'evict':>6}"]
    for name, r in results.items():
        lines.append(f"{name:<8}{r.makespan_s:>11.0f}{r.avg_gpu_util:>7.1f}{r.avg_jct_s:>10.0f}"
                     f"{r.avg_run_s:>10.0f}{r.avg_wait_s:>11.0f}{r.p95_wait_s:>11.0f}"
                     f"{r.oom_events:>5}{r.evictions:>6}")
    unfinished = {n: r for n, r in results.items() if r.unfinished}
    lines += [f"{n}: {r.unfinished} of {r.jobs} jobs never finished (no GPU set holds them)"
              for n, r in unfinished.items()]
    return "\n".join(lines)


def _timeline_csv(results: dict[str, SimulationResult]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["policy", "t_s", "gpu", "util_percent", "mem_mib", "jobs"])
    for name, r in results.items():
        for t, gpu, util, mem, n in r.gpu_timeline:
            writer.writerow([name, f"{t:.3f}", gpu, f"{util:.2f}", f"{mem:.1f}", n])
    return buf.getvalue()


def run_command(*, trace: Path | None, workload: str | None, policies: Sequence[str],
                cluster: str | None, config: Path | None, interference: str, jobs: int,
                seed: int, plots: Path | None, timeline: Path | None, sweep: bool,
                grid: str | None, sweep_out: Path, progress: bool = False,
                truth: Path | None = None, models: int | str = 0,
                knowledge: str = "online") -> dict[str, Any]:
    """Run the simulation(s); returns {"json": object, "text": str}.

    ``progress`` shows bars on stderr (only where it is a terminal)."""
    if plots is not None and (problem := missing_extra("plots", "--plots")):
        raise CommandError(problem)  # before the simulation, not after it
    job_list, nodes, label = _load_inputs(trace, workload, cluster, jobs, seed,
                                          _models_option(models, truth))
    options = _options(config)
    worlds = _world_factory(truth, knowledge, config, nodes, sweep)
    engine_config = EngineConfig(interference=interference,
                                 record_gpu_timeline=timeline is not None)
    show = wanted(progress)
    learned: dict[str, dict[str, int]] = {}
    try:
        if sweep:
            return _sweep(job_list, nodes, label, options, engine_config, grid, sweep_out, show)
        names = list(policies) or list(POLICIES)
        for name in names:
            make_policy(name, options)
        results = {}
        for n in names:
            world = worlds() if worlds else None
            results[n] = _simulate(job_list, nodes, n, options, engine_config, show, world)
            if world is not None:
                pairs = world.agents.learner.pairs
                learned[n] = {"reports": world.agents.reports, "samples": world.agents.samples,
                              "pair_samples": pairs.samples_total - pairs.group_samples_total,
                              "group_samples": pairs.group_samples_total}
    except (PolicyError, InterferenceError, SweepError) as exc:
        raise CommandError(str(exc)) from None
    extra: dict[str, Any] = {}
    if worlds is not None:
        extra["truth"] = {"file": str(truth), "knowledge": knowledge, "learning": learned}
    written = []
    if plots is not None:
        from lab.simulator.plots import write_plots

        title = f"{label}, interference {interference}"
        extra["plots"] = [str(p) for p in write_plots(results, plots, title)]
        written += [f"plot written to {p}" for p in extra["plots"]]
    if timeline is not None:
        timeline.write_text(_timeline_csv(results))
        extra["timeline"] = str(timeline)
        written.append(f"timeline written to {timeline}")
    meta = {"trace": label, "gpus": sum(len(n.gpus) for n in nodes), "jobs": len(job_list),
            "interference": interference, "python": platform.python_version(), **extra}
    if len(results) == 1:
        body: dict[str, Any] = {**next(iter(results.values())).summary(), **meta}
    else:
        body = {"policies": {n: r.summary() for n, r in results.items()}, **meta}
    text = f"{label}: {meta['jobs']} jobs on {meta['gpus']} GPUs, interference={interference}\n"
    if worlds is not None:
        text += f"truth {truth}; tandem's knowledge: {knowledge}; agent reports (samples):" \
            + "".join(f" {n} {v['reports']} ({v['samples']})" for n, v in learned.items()) + "\n"
    return {"json": body, "text": "\n".join([text + _table(results), *written])}


def _world_factory(truth: Path | None, knowledge: str, config: Path | None,
                   nodes: list[Any], sweep: bool) -> Callable[[], Any] | None:
    """A maker of fresh worlds (one per policy: each learns from scratch), or None."""
    if truth is None:
        if knowledge != "online":
            raise CommandError("--knowledge needs --truth")
        return None
    if sweep:
        raise CommandError("--sweep does not take --truth")
    from extender.config.loader import load_config
    from lab.simulator.belief import MODES, SimWorld
    from lab.simulator.truth import TruthError, load_truth

    if knowledge not in MODES:
        raise CommandError(f"--knowledge {knowledge!r} (valid: {', '.join(MODES)})")
    try:
        world_truth = load_truth(truth)
    except TruthError as exc:
        raise CommandError(f"--truth: {exc}") from None
    learning = load_config(config, environ={}).learning  # _options already validated it
    types = sorted({g.gpu_type for n in nodes for g in n.gpus})
    return lambda: SimWorld.build(world_truth, knowledge, learning, types)


def _simulate(job_list: list[Any], nodes: list[Any], name: str, options: PolicyOptions,
              engine_config: EngineConfig, show: bool, world: Any = None) -> SimulationResult:
    from lab.simulator.runner import simulate

    if not show:
        return simulate(job_list, nodes, name, options, engine_config, world=world)
    with bar(len(job_list), f"simulate {name}", "job") as b:
        return simulate(job_list, nodes, name, options, engine_config,
                        wrap=lambda policy: ProgressPolicy(policy, b.update), world=world)


def _setting(value: float | None) -> str:
    return "off" if value is None else f"{value:g}"


def _sweep(job_list: list[Any], nodes: list[Any], label: str, options: PolicyOptions,
           engine_config: EngineConfig, grid_text: str | None, out: Path,
           show: bool) -> dict[str, Any]:
    from lab.simulator.policies import tandem_cost, tandem_queue

    base_cost = options.cost or tandem_cost()
    base_queue = options.queue or tandem_queue()
    grid = parse_grid(grid_text)
    with contextlib.ExitStack() as stack:
        tick = None
        if show:
            tick = stack.enter_context(bar(grid_size(grid), "sweep", "setting")).update
        rows = run_sweep(job_list, nodes, base_cost, base_queue, grid, engine_config,
                         on_setting=tick)
    snippet = best_snippet(rows[0], base_cost, base_queue, label)
    out.write_text(snippet)
    keys = list(rows[0].setting)
    width = max(8, *(len(k) + 1 for k in keys))
    header = "".join(f"{k:>{width}}" for k in keys) + f"{'makespan_s':>11}{'avg_wait_s':>11}" \
        f"{'util_%':>7}{'avg_jct_s':>10}{'avg_run_s':>10}"
    lines = [header]
    for row in rows:
        r = row.result
        lines.append("".join(f"{_setting(row.setting[k]):>{width}}" for k in keys)
                     + f"{r.makespan_s:>11.0f}{r.avg_wait_s:>11.0f}{r.avg_gpu_util:>7.1f}"
                     f"{r.avg_jct_s:>10.0f}{r.avg_run_s:>10.0f}")
    body = {"trace": label, "best": {**rows[0].setting, **{k: rows[0].result.summary()[k]
                                                          for k in HEADLINE}},
            "settings": [{**row.setting, **{k: row.result.summary()[k] for k in HEADLINE}}
                         for row in rows], "snippet_file": str(out)}
    return {"json": body, "text": "\n".join(lines) + f"\nbest setting written to {out}\n"
            + snippet}


def run_trace_command(*, pods: Path | None, nodes: Path | None, policies: Sequence[str],
                      seeds: int, config: Path | None, sweep: bool,
                      grid: str | None) -> dict[str, Any]:
    """``--pods``/``--nodes``: the inflation protocol on a trace (``packing_command``)."""
    from lab.simulator.packing_command import render, run_packing
    from lab.simulator.policies import tandem_cost
    from lab.simulator.trace_csv import TraceError

    if pods is None or nodes is None:
        raise CommandError("give both --pods and --nodes (the trace's pod and node lists)")
    if seeds < 1:
        raise CommandError("--seeds must be at least 1")
    policy = _options(config).cost or tandem_cost()
    try:
        doc = run_packing(pods, nodes, policies, seeds, policy, sweep, grid)
    except TraceError as exc:
        raise CommandError(str(exc)) from None
    except ValueError as exc:
        raise CommandError(f"--grid/--policy: {exc}") from None
    return {"json": doc, "text": render(doc)}

