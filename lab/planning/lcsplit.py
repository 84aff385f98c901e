"""Harpagon's latency splitter (Algorithm 2): spend the end-to-end SLO by latency-cost efficiency.

Every module starts at its least cost-efficient configuration (batch 1 on the
most expensive hardware). Each iteration applies the one move with the highest
latency-cost efficiency

    LC = (C(prev) - C(new)) / (L_wc(new) - L_wc(prev)),    C = price * rate / throughput

whose end-to-end latency (the longest root-to-leaf path of ``L_wc``) stays within
the SLO, until no move fits. The two split optimisers of the paper are switchable:

- node merger: modules with the same parents and the same children are parallel
  and should get one budget, so they move together and their savings add up;
- cost-direct: undo the last ``R`` moves and redo the end greedily by cost saved
  (late in the split little latency is left, and LC may spend it on a small
  saving); the cheapest of the variants is kept.

Edge cases the paper leaves open, decided here: a move that is cheaper and no
slower has LC = +inf; a move that saves nothing is skipped (every applied move
lowers the cost, so the loop ends). If the paper's start already breaks the SLO,
every module starts at its fastest configuration instead. ``R`` is not stated in
the paper; the default here is 3. The returned budgets are the chosen
configurations' ``L_wc`` plus the end-to-end slack, handed out in topological
order so that every path still fits in the SLO (the residual packing uses it).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lab.planning.query import QueryError, QueryModule, QuerySpec, QuerySplit

_EPS = 1e-9

DEFAULT_COST_DIRECT_WINDOW = 3
MAX_ITERATIONS = 100_000
"""Every move lowers the cost, so the loop ends; this only bounds a pathological input."""


@dataclass(frozen=True)
class ModuleOption:
    """One configuration of a module at its rate: worst-case latency and cost (price x GPUs)."""

    gpu_type: str
    batch: int
    worst_case_ms: float
    cost: float
    price: float = 1.0


OptionsFn = Callable[[QueryModule, float], Sequence[ModuleOption]]
"""(module, module rate rps) -> the configurations the module may use."""


@dataclass(frozen=True)
class LcSplit:
    """Algorithm 2's answer: the split, each module's configuration, and how it was found."""

    split: QuerySplit
    choices: Mapping[str, ModuleOption]
    iterations: int
    """Moves applied by the latency-cost phase."""
    cost_direct_undone: int
    """Moves cost-direct undid in the kept result (0: the LC result was kept)."""


def latency_cost_efficiency(prev: ModuleOption, new: ModuleOption) -> float:
    """Cost saved per ms of extra worst-case latency; +inf if ``new`` dominates, -inf if no gain."""
    saved = prev.cost - new.cost
    spent = new.worst_case_ms - prev.worst_case_ms
    if saved <= _EPS:
        return -math.inf
    if spent <= _EPS:
        return math.inf
    return saved / spent


class _Module:
    """A module's options by latency, with the cheapest option up to each latency."""

    def __init__(self, name: str, options: Sequence[ModuleOption]):
        self.name = name
        self.options = sorted(options, key=lambda o: (o.worst_case_ms, o.cost))
        self.latencies = [o.worst_case_ms for o in self.options]
        self.cheapest_upto: list[int] = []
        self.frontier: list[float] = []
        """Latencies of the options cheaper than every faster one: the only budgets
        worth trying (any other budget buys what the frontier point below it buys)."""
        best = 0
        for i, o in enumerate(self.options):
            if o.cost < self.options[best].cost - _EPS or i == 0:
                best = i
                self.frontier.append(o.worst_case_ms)
            self.cheapest_upto.append(best)

    def cheapest_within(self, budget_ms: float) -> int | None:
        """Index of the cheapest option with ``L_wc <= budget_ms`` (None if none)."""
        k = bisect.bisect_right(self.latencies, budget_ms + _EPS)
        return self.cheapest_upto[k - 1] if k else None


def lc_split(
    query: QuerySpec,
    options_fn: OptionsFn,
    *,
    node_merger: bool = True,
    cost_direct_window: int = DEFAULT_COST_DIRECT_WINDOW,
) -> LcSplit:
    """Harpagon Algorithm 2 (with the optional node merger and cost-direct) for one query."""
    if cost_direct_window < 0:
        raise QueryError("cost_direct_window must be >= 0")
    order = query.order()
    rates = query.rates()
    modules = {}
    for m in order:
        opts = [o for o in options_fn(m, rates[m.name]) if o.worst_case_ms <= query.slo_ms + _EPS]
        if not opts:
            raise QueryError(f"query {query.name}: module {m.name} has no configuration within SLO")
        modules[m.name] = _Module(m.name, opts)
    graph = _Graph(order, node_merger)
    state = _start(modules, graph, query)
    history = [state]
    while len(history) <= MAX_ITERATIONS:
        move = _best_move(state, modules, graph, query.slo_ms, by_cost=False)
        if move is None:
            break
        state = move
        history.append(state)
    best, undone = state, 0
    for r in range(1, min(cost_direct_window, len(history) - 1) + 1):
        candidate = history[-1 - r]
        for _ in range(MAX_ITERATIONS):
            move = _best_move(candidate, modules, graph, query.slo_ms, by_cost=True)
            if move is None:
                break
            candidate = move
        if _cost(candidate, modules) < _cost(best, modules) - _EPS:
            best, undone = candidate, r
    choices = {name: modules[name].options[i] for name, i in best.items()}
    budgets = _spend_slack(graph, {n: c.worst_case_ms for n, c in choices.items()}, query.slo_ms)
    split = QuerySplit(budgets, {n: c.cost for n, c in choices.items()}, rates)
    return LcSplit(split, choices, len(history) - 1, undone)


class _Graph:
    """Parents, children and move groups (merged parallel modules) of a query."""

    def __init__(self, order: Sequence[QueryModule], node_merger: bool):
        self.order = [m.name for m in order]
        self.parents = {m.name: tuple(sorted(m.after)) for m in order}
        self.children = {
            m.name: tuple(sorted(c.name for c in order if m.name in c.after)) for m in order
        }
        groups: dict[object, list[str]] = {}
        for name in self.order:
            key = (self.parents[name], self.children[name]) if node_merger else name
            groups.setdefault(key, []).append(name)
        self.groups = list(groups.values())

    def paths(self, weight: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        """Longest path from a root to the end of each module, and from its start to a leaf."""
        to: dict[str, float] = {}
        for n in self.order:
            to[n] = weight[n] + max((to[p] for p in self.parents[n]), default=0.0)
        frm: dict[str, float] = {}
        for n in reversed(self.order):
            frm[n] = weight[n] + max((frm[c] for c in self.children[n]), default=0.0)
        return to, frm


State = dict[str, int]


def _latency(state: State, modules: Mapping[str, _Module]) -> dict[str, float]:
    return {n: modules[n].latencies[i] for n, i in state.items()}


def _cost(state: State, modules: Mapping[str, _Module]) -> float:
    return sum(modules[n].options[i].cost for n, i in state.items())


def _longest(graph: _Graph, weight: Mapping[str, float]) -> float:
    to, _ = graph.paths(weight)
    return max(to[n] for n in graph.order if not graph.children[n])


def _start(modules: Mapping[str, _Module], graph: _Graph, query: QuerySpec) -> State:
    """Batch 1 (the smallest) on the priciest hardware; the fastest options if that misses."""
    state: State = {}
    for name, mod in modules.items():
        smallest = min(o.batch for o in mod.options)
        state[name] = min(
            (i for i, o in enumerate(mod.options) if o.batch == smallest),
            key=lambda i: (-mod.options[i].price, mod.latencies[i]),
        )
    if _longest(graph, _latency(state, modules)) <= query.slo_ms + _EPS:
        return state
    fastest = {name: 0 for name in modules}  # options are sorted by latency
    if _longest(graph, _latency(fastest, modules)) > query.slo_ms + _EPS:
        raise QueryError(f"query {query.name}: no split meets {query.slo_ms} ms")
    return fastest


def _best_move(
    state: State, modules: Mapping[str, _Module], graph: _Graph, slo_ms: float, *, by_cost: bool
) -> State | None:
    """The feasible group move with the highest LC (or saving, ``by_cost``); None if none."""
    weight = _latency(state, modules)
    to, frm = graph.paths(weight)
    best: State | None = None
    best_key: tuple[float, float] | None = None
    for group in graph.groups:
        # Members share parents and children: one prefix and suffix for the group.
        head = group[0]
        before = to[head] - weight[head]
        after = frm[head] - weight[head]
        current = max(weight[n] for n in group)
        current_cost = sum(modules[n].options[state[n]].cost for n in group)
        budgets = sorted({lat for n in group for lat in modules[n].frontier})
        for budget in budgets:
            if before + budget + after > slo_ms + _EPS:
                break  # budgets ascend; every later one breaks the SLO too
            found = [modules[n].cheapest_within(budget) for n in group]
            picks = [p for p in found if p is not None]
            if len(picks) != len(group):
                continue
            new_latency = max(modules[n].latencies[p] for n, p in zip(group, picks, strict=True))
            saved = current_cost - sum(
                modules[n].options[p].cost for n, p in zip(group, picks, strict=True)
            )
            if saved <= _EPS:
                continue
            spent = new_latency - current
            lc = math.inf if spent <= _EPS else saved / spent
            key = (saved, lc) if by_cost else (lc, saved)
            if best_key is None or key > best_key:
                best_key = key
                best = {**state, **dict(zip(group, picks, strict=True))}
    return best


def _spend_slack(graph: _Graph, budgets: Mapping[str, float], slo_ms: float) -> dict[str, float]:
    """Raise each budget, in topological order, by the slack of the longest path through it."""
    out = dict(budgets)
    for name in graph.order:
        to, frm = graph.paths(out)
        slack = slo_ms - (to[name] + frm[name] - out[name])
        if slack > _EPS:
            out[name] += slack
    return out
