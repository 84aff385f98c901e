"""Complex queries (Nexus Section 6.2): split one end-to-end SLO over a DAG of models.

Each module ``v`` runs at rate ``R_v`` (the query rate at roots, else the sum of
parent rates times the edge fan-out) and costs ``R_v / T_v(k)`` GPUs when given a
budget ``k``, where ``T_v(k)`` is the best per-GPU throughput whose worst case fits
in ``k``. Budgets along every root-to-leaf path must sum to at most ``L``.

Nexus's dynamic program ``f(u, t) = min_k cost_u(k) + sum_children f(v, t - k)`` is
evaluated on a grid of ``L/step`` budgets, generalised from trees to fork-join
(series-parallel) graphs by reducing the graph: a module in series with what
follows is a min-plus convolution, parallel branches add. Re-splitting when
fan-outs change is calling it again with the new fan-outs.

Harpagon's Algorithm 2 (``lcsplit``, latency-cost efficiency) is the switchable
alternative (``HarpagonOptions.latency_cost_split``); it returns the same ``QuerySplit``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.types import PlannerError


class QueryError(PlannerError):
    """The query graph is malformed or not series-parallel."""


@dataclass(frozen=True)
class QueryModule:
    """One model invocation in a query; ``after`` maps parent module -> fan-out."""

    name: str
    model: str
    after: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class QuerySpec:
    """A DAG of modules with one end-to-end SLO and the rate at its roots."""

    name: str
    slo_ms: float
    rate_rps: float
    modules: tuple[QueryModule, ...]

    def __post_init__(self) -> None:
        names = [m.name for m in self.modules]
        if not names:
            raise QueryError("a query needs at least one module")
        if len(set(names)) != len(names):
            raise QueryError("module names must be unique")
        for m in self.modules:
            for parent, fanout in m.after.items():
                if parent not in names:
                    raise QueryError(f"module {m.name}: unknown parent {parent!r}")
                if not (math.isfinite(fanout) and fanout > 0):
                    raise QueryError(f"module {m.name}: fan-out must be > 0")
        self.order()  # raises on a cycle

    def order(self) -> list[QueryModule]:
        """Modules in topological order; raises QueryError on a cycle."""
        done: list[QueryModule] = []
        placed: set[str] = set()
        pending = list(self.modules)
        while pending:
            ready = [m for m in pending if set(m.after) <= placed]
            if not ready:
                raise QueryError(f"query {self.name}: modules form a cycle")
            for m in ready:
                done.append(m)
                placed.add(m.name)
            pending = [m for m in pending if m.name not in placed]
        return done

    def rates(self) -> dict[str, float]:
        """Request rate of each module: roots get the query rate, children the fan-out."""
        out: dict[str, float] = {}
        for m in self.order():
            if not m.after:
                out[m.name] = self.rate_rps
            else:
                out[m.name] = sum(out[p] * f for p, f in m.after.items())
        return out

    def with_fanouts(self, fanouts: Mapping[tuple[str, str], float]) -> QuerySpec:
        """The same query with new (parent, child) fan-outs (for re-splitting)."""
        modules = tuple(
            QueryModule(
                m.name, m.model, {p: fanouts.get((p, m.name), f) for p, f in m.after.items()}
            )
            for m in self.modules
        )
        return QuerySpec(self.name, self.slo_ms, self.rate_rps, modules)


@dataclass(frozen=True)
class QuerySplit:
    """Per-module latency budgets and the GPUs the split needs (fractional)."""

    budgets_ms: Mapping[str, float]
    gpus: Mapping[str, float]
    rates_rps: Mapping[str, float]

    @property
    def total_gpus(self) -> float:
        """Sum of the modules' GPUs (the objective)."""
        return sum(self.gpus.values())


ThroughputFn = Callable[[QueryModule, float, float], float]
"""(module, budget_ms, module_rate_rps) -> best per-GPU throughput (0 if none fits)."""


def split_latency(query: QuerySpec, throughput: ThroughputFn, step_ms: float = 1.0) -> QuerySplit:
    """Minimum-GPU split of ``query.slo_ms`` over the modules on a ``step_ms`` grid."""
    if not (math.isfinite(step_ms) and step_ms > 0):
        raise QueryError("step_ms must be > 0")
    n = int(math.floor(query.slo_ms / step_ms + 1e-9))
    rates = query.rates()
    costs: dict[str, np.ndarray] = {}
    for m in query.modules:
        col = np.full(n + 1, np.inf)
        for k in range(1, n + 1):
            t = throughput(m, k * step_ms, rates[m.name])
            if t > 0:
                col[k] = rates[m.name] / t
        costs[m.name] = np.minimum.accumulate(col)  # a larger budget never costs more
    tree = _reduce(query)
    f = _evaluate(tree, costs, n)
    if not math.isfinite(f[n]):
        raise QueryError(f"query {query.name}: no split meets {query.slo_ms} ms")
    budgets: dict[str, float] = {}
    _assign(tree, n, budgets, step_ms, costs, n)
    gpus = {m: float(costs[m][int(round(b / step_ms))]) for m, b in budgets.items()}
    return QuerySplit(budgets, gpus, rates)


# --- series-parallel reduction -------------------------------------------------------
# A composite is ("node", name) | ("zero",) | ("series", a, b) | ("parallel", a, b).
# Evaluated arrays are memoised on id() for the duration of one split.


def _reduce(query: QuerySpec) -> tuple:
    edges: list[list] = []  # [src, dst, composite]
    children = {m.name: [c.name for c in query.modules if m.name in c.after] for m in query.modules}
    for m in query.modules:
        edges.append([f"{m.name}>in", f"{m.name}>out", ("node", m.name)])
        if not m.after:
            edges.append(["S", f"{m.name}>in", ("zero",)])
        for p in m.after:
            edges.append([f"{p}>out", f"{m.name}>in", ("zero",)])
        if not children[m.name]:
            edges.append([f"{m.name}>out", "Z", ("zero",)])
    changed = True
    while changed and len(edges) > 1:
        changed = False
        seen: dict[tuple[str, str], int] = {}
        for i, (src, dst, comp) in enumerate(edges):
            j = seen.get((src, dst))
            if j is not None:
                edges[j][2] = ("parallel", edges[j][2], comp)
                del edges[i]
                changed = True
                break
            seen[(src, dst)] = i
        if changed:
            continue
        ins: dict[str, list[int]] = {}
        outs: dict[str, list[int]] = {}
        for i, (src, dst, _) in enumerate(edges):
            outs.setdefault(src, []).append(i)
            ins.setdefault(dst, []).append(i)
        for v in ins:
            if v not in ("S", "Z") and len(ins[v]) == 1 and len(outs.get(v, [])) == 1:
                a, b = ins[v][0], outs[v][0]
                merged = [edges[a][0], edges[b][1], _series(edges[a][2], edges[b][2])]
                edges = [e for k, e in enumerate(edges) if k not in (a, b)] + [merged]
                changed = True
                break
    if len(edges) != 1 or edges[0][:2] != ["S", "Z"]:
        raise QueryError(f"query {query.name}: not a tree or fork-join (series-parallel) graph")
    return edges[0][2]


def _series(a: tuple, b: tuple) -> tuple:
    if a == ("zero",):
        return b
    if b == ("zero",):
        return a
    return ("series", a, b)


def _evaluate(comp: tuple, costs: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    kind = comp[0]
    if kind == "zero":
        return np.zeros(n + 1)
    if kind == "node":
        return costs[comp[1]]
    fa, fb = _evaluate(comp[1], costs, n), _evaluate(comp[2], costs, n)
    if kind == "parallel":
        return fa + fb
    out = np.empty(n + 1)
    for t in range(n + 1):
        out[t] = np.min(fa[: t + 1] + fb[t::-1])
    return out


def _assign(
    comp: tuple,
    t: int,
    budgets: dict[str, float],
    step_ms: float,
    costs: Mapping[str, np.ndarray],
    n: int,
) -> None:
    """Walk the reduction back down, splitting the budget ``t`` where the DP did."""
    kind = comp[0]
    if kind == "zero":
        return
    if kind == "node":
        budgets[comp[1]] = t * step_ms
        return
    if kind == "parallel":
        _assign(comp[1], t, budgets, step_ms, costs, n)
        _assign(comp[2], t, budgets, step_ms, costs, n)
        return
    fa, fb = _evaluate(comp[1], costs, n), _evaluate(comp[2], costs, n)
    k = int(np.argmin(fa[: t + 1] + fb[t::-1]))
    _assign(comp[1], k, budgets, step_ms, costs, n)
    _assign(comp[2], t - k, budgets, step_ms, costs, n)


def module_throughput_table(table: Mapping[str, Sequence[tuple[float, float]]]) -> ThroughputFn:
    """Throughput from (budget_ms, rps) steps per model, as in Nexus Figure 3."""

    def fn(module: QueryModule, budget_ms: float, _rate: float) -> float:
        best = 0.0
        for lat, rps in table[module.model]:
            if lat <= budget_ms + 1e-9:
                best = max(best, rps)
        return best

    return fn
