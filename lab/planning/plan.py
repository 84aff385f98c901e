"""One planning run: split queries into per-module sessions, then pack everything.

This is what ``tandem plan`` and the benchmarks call. Latency reassignment
(Harpagon B.3.3b) gives a query module's residual the end-to-end slack the other
modules' dedicated GPUs leave unused, module by module, greedily.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lab.planning.lcsplit import ModuleOption, OptionsFn, lc_split
from lab.planning.options import GpuType, HarpagonOptions
from lab.planning.packing import ClusterPlan, pack_configs
from lab.planning.query import QueryModule, QuerySpec, QuerySplit, split_latency
from lab.planning.saturate import ConfigPlanner, SessionConfig
from planner.dispatch import dedicated_worst_case_ms
from planner.types import SessionSpec
from predictor.batching import BatchingProfile

DEFAULT_STEP_MS = 1.0


def module_session_name(query: QuerySpec, module: QueryModule) -> str:
    """Name of the session that serves one module of a query."""
    return f"{query.name}/{module.name}"


def profile_throughput(planner: ConfigPlanner):
    """Per-GPU throughput per price of a module at a budget, under the planner's rules."""

    def fn(module: QueryModule, budget_ms: float, rate_rps: float) -> float:
        best = 0.0
        for gpu in planner.gpu_types:
            idx = planner.index(module.model, gpu.name)
            if idx is None or idx.profile.memory_mib > gpu.memory_mib:
                continue
            if planner.options.batch_aware_dispatch:
                b = idx.best_batch_dispatch(budget_ms, rate_rps)
            else:
                b = idx.best_batch_rr(budget_ms)
            if b:
                thr = b * 1000.0 / idx.latencies[b - 1]
                best = max(best, thr / planner.options.price(gpu))
        return best

    return fn


def profile_options(planner: ConfigPlanner) -> OptionsFn:
    """Every (GPU type, batch) a module may run, as Algorithm 2's configurations.

    ``L_wc`` is ``l(b) + b/R`` under batch-aware dispatch (``w`` = the module rate,
    as in Harpagon's LC example), else ``2*l(b)``; cost is price times ``R/t``.
    """

    def fn(module: QueryModule, rate_rps: float) -> list[ModuleOption]:
        out = []
        for gpu in planner.gpu_types:
            idx = planner.index(module.model, gpu.name)
            if idx is None or idx.profile.memory_mib > gpu.memory_mib:
                continue
            price = planner.options.price(gpu)
            for b, lat in enumerate(idx.latencies, start=1):
                if idx.allowed is not None and b not in idx.allowed:
                    continue
                worst = dedicated_worst_case_ms(planner.options.dispatch, lat, b, rate_rps)
                out.append(
                    ModuleOption(gpu.name, b, worst, price * rate_rps * lat / (b * 1000.0), price)
                )
        return out

    return fn


def split_query(
    query: QuerySpec, planner: ConfigPlanner, step_ms: float = DEFAULT_STEP_MS
) -> QuerySplit:
    """One query's split under the planner's profiles, dispatch rule and split switch.

    Nexus's DP on a ``step_ms`` grid, or Harpagon's Algorithm 2 with
    ``latency_cost_split`` (which needs no grid).
    """
    if planner.options.latency_cost_split:
        return lc_split(query, profile_options(planner)).split
    return split_latency(query, profile_throughput(planner), step_ms)


def plan(
    sessions: Sequence[SessionSpec],
    queries: Sequence[QuerySpec],
    profiles: Mapping[tuple[str, str], BatchingProfile],
    gpu_types: Sequence[GpuType],
    options: HarpagonOptions | None = None,
    *,
    allowed_batches: Mapping[tuple[str, str], Sequence[int]] | None = None,
    step_ms: float = DEFAULT_STEP_MS,
) -> tuple[ClusterPlan, dict[str, QuerySplit]]:
    """Plan sessions and queries together; returns the cluster plan and each query's split."""
    options = options or HarpagonOptions()
    planner = ConfigPlanner(profiles, gpu_types, options, allowed_batches)
    configs = [planner.configure(s) for s in sessions]
    residual_slo: dict[str, float] = {}
    splits: dict[str, QuerySplit] = {}
    for query in queries:
        split = split_query(query, planner, step_ms)
        splits[query.name] = split
        module_configs = {
            m.name: planner.configure(
                SessionSpec(
                    module_session_name(query, m),
                    m.model,
                    split.budgets_ms[m.name],
                    split.rates_rps[m.name],
                )
            )
            for m in query.modules
        }
        if options.latency_reassignment:
            for name, slo in _reassign(query, split, module_configs).items():
                residual_slo[module_session_name(query, _module(query, name))] = slo
                module_configs[name] = planner.configure(
                    module_configs[name].session, residual_slo_ms=slo
                )
        configs.extend(module_configs.values())
    return pack_configs(configs, planner, residual_slo), splits


def _module(query: QuerySpec, name: str) -> QueryModule:
    return next(m for m in query.modules if m.name == name)


def _achieved(config: SessionConfig, residual_ms: float) -> float:
    worst = max((t.worst_case_ms for t in config.tiers), default=0.0)
    return max(worst, residual_ms if config.residual_rps > 0 else 0.0)


def _reassign(
    query: QuerySpec, split: QuerySplit, configs: Mapping[str, SessionConfig]
) -> dict[str, float]:
    """Residual budgets raised by the end-to-end slack, largest residual first."""
    achieved = {m: _achieved(c, split.budgets_ms[m]) for m, c in configs.items()}
    order = query.order()
    granted: dict[str, float] = {}
    for name in sorted(configs, key=lambda m: (-configs[m].residual_rps, m)):
        if configs[name].residual_rps <= 0:
            continue
        longest = _longest_path_through(order, achieved, name)
        budget = query.slo_ms - (longest - achieved[name])
        if budget > split.budgets_ms[name] + 1e-9:
            granted[name] = budget
            achieved[name] = max(achieved[name], budget)
    return granted


def _longest_path_through(
    order: Sequence[QueryModule], weight: Mapping[str, float], via: str
) -> float:
    """Longest root-to-leaf path (sum of weights) among paths through ``via``."""
    to: dict[str, float] = {}
    for m in order:
        to[m.name] = weight[m.name] + max((to[p] for p in m.after), default=0.0)
    frm: dict[str, float] = {}
    for m in reversed(order):
        kids = [c.name for c in order if m.name in c.after]
        frm[m.name] = weight[m.name] + max((frm[k] for k in kids), default=0.0)
    return to[via] + frm[via] - weight[via]
