"""Harpagon's latency splitter (Algorithm 2): the digest's worked examples and its wiring."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lab.planning.lcsplit import ModuleOption, latency_cost_efficiency, lc_split
from lab.planning.options import GpuType, HarpagonOptions
from lab.planning.plan import plan, profile_options, split_query
from lab.planning.query import QueryError, QueryModule, QuerySpec
from lab.planning.saturate import ConfigPlanner
from predictor.batching import BatchingProfile
from tandem.cli import app

# Harpagon Table I, module M1: (batch, duration s); throughput b/d = 12.5, 20, 25 rps.
M1 = [(2, 0.160), (4, 0.200), (8, 0.320)]


def m1_options(rate_rps: float, batch_aware: bool) -> list[ModuleOption]:
    """M1's configurations in ms: ``L_wc = d + b/T`` (batch-aware) or ``2d`` (round-robin)."""
    out = []
    for b, d in M1:
        worst = (d + b / rate_rps if batch_aware else 2 * d) * 1000.0
        out.append(ModuleOption("gpu", b, worst, rate_rps * d / b))
    return out


def fixed(options: dict[str, list[tuple[float, float]]]):
    """An OptionsFn from (worst_case_ms, cost) per model, batches numbered from 1."""

    def fn(module: QueryModule, _rate: float) -> list[ModuleOption]:
        return [
            ModuleOption("gpu", i, lat, cost)
            for i, (lat, cost) in enumerate(options[module.model], 1)
        ]

    return fn


@pytest.mark.parametrize(
    ("batch", "lc_per_second"), [(4, 50.0), (8, 18.2)], ids=["b2-to-b4", "b2-to-b8"]
)
def test_lc_of_m1_from_batch_2_at_100_rps(batch: int, lc_per_second: float) -> None:
    options = {o.batch: o for o in m1_options(100.0, batch_aware=True)}
    lc = latency_cost_efficiency(options[2], options[batch])
    assert lc * 1000.0 == pytest.approx(lc_per_second, abs=0.05)


@pytest.mark.parametrize(
    ("batch_aware", "batch", "machines"),
    [(True, 8, 4.0), (False, 4, 5.0)],
    ids=["batch-aware-picks-b8", "round-robin-picks-b4"],
)
def test_example1_m1_single_module_split(batch_aware: bool, batch: int, machines: float) -> None:
    query = QuerySpec("q", 400.0, 100.0, (QueryModule("m1", "M1"),))
    result = lc_split(query, lambda _m, rate: m1_options(rate, batch_aware))
    assert result.choices["m1"].batch == batch
    assert result.split.total_gpus == pytest.approx(machines)
    assert result.split.budgets_ms["m1"] == pytest.approx(400.0)  # the slack goes to the module


def test_lc_edge_cases_dominating_and_useless_moves() -> None:
    slow_dear = ModuleOption("gpu", 1, 100.0, 5.0)
    assert latency_cost_efficiency(slow_dear, ModuleOption("gpu", 2, 90.0, 4.0)) == math.inf
    assert latency_cost_efficiency(slow_dear, ModuleOption("gpu", 2, 150.0, 5.0)) == -math.inf
    assert latency_cost_efficiency(slow_dear, ModuleOption("gpu", 2, 80.0, 6.0)) == -math.inf


FIG3 = {"X": [(40, 200), (50, 250), (60, 300)], "Y": [(40, 300), (50, 400), (60, 500)]}


@pytest.mark.parametrize(
    ("gamma", "budgets"),
    [(0.1, (60, 40)), (1.0, (50, 50)), (10.0, (40, 60))],
    ids=["gamma-0.1", "gamma-1", "gamma-10"],
)
def test_figure4_split_matches_the_nexus_optimum(gamma: float, budgets: tuple) -> None:
    """Nexus Figure 3/4: LC's greedy reaches the DP's optimum on this two-module chain."""
    query = QuerySpec("q", 100, 1000, (QueryModule("x", "X"), QueryModule("y", "Y", {"x": gamma})))

    def fn(module: QueryModule, rate: float) -> list[ModuleOption]:
        rows = FIG3[module.model]
        return [ModuleOption("gpu", i, lat, rate / rps) for i, (lat, rps) in enumerate(rows, 1)]

    split = lc_split(query, fn).split
    assert (split.budgets_ms["x"], split.budgets_ms["y"]) == budgets


# Node merger (digest B.3.4): Mx feeds My and Mz; the SLO leaves room for one 100 ms
# step. Alone the moves have LC 20, 10 and 15 per second; My+Mz together 25.
MERGER = {
    "X": [(100.0, 5.0), (200.0, 3.0)],  # saves 2.0 over 0.1 s: LC 20/s
    "Y": [(100.0, 5.0), (200.0, 4.0)],  # saves 1.0: LC 10/s
    "Z": [(100.0, 5.0), (200.0, 3.5)],  # saves 1.5: LC 15/s
}
FORK = QuerySpec(
    "q",
    300.0,
    10.0,
    (QueryModule("x", "X"), QueryModule("y", "Y", {"x": 1}), QueryModule("z", "Z", {"x": 1})),
)


@pytest.mark.parametrize(
    ("merger", "moved", "cost"),
    [(False, {"x": 2}, 13.0), (True, {"y": 2, "z": 2}, 12.5)],
    ids=["plain-moves-mx", "merger-moves-my-and-mz"],
)
def test_node_merger(merger: bool, moved: dict[str, int], cost: float) -> None:
    result = lc_split(FORK, fixed(MERGER), node_merger=merger, cost_direct_window=0)
    assert {m: c.batch for m, c in result.choices.items() if c.batch != 1} == moved
    assert result.split.total_gpus == pytest.approx(cost)


# Cost-direct (digest B.3.4): Mx then My, room for one move. Mx's uses 10 ms at LC 20/s
# (saves 0.2); My's uses 100 ms at LC 10/s (saves 1.0).
DIRECT = {"X": [(100.0, 5.0), (110.0, 4.8)], "Y": [(100.0, 5.0), (200.0, 4.0)]}
CHAIN = QuerySpec("q", 300.0, 10.0, (QueryModule("x", "X"), QueryModule("y", "Y", {"x": 1})))


@pytest.mark.parametrize(
    ("window", "moved", "cost", "undone"),
    [(0, "x", 9.8, 0), (1, "y", 9.0, 1), (3, "y", 9.0, 1)],
    ids=["lc-only-moves-mx", "cost-direct-moves-my", "wider-window-same"],
)
def test_cost_direct(window: int, moved: str, cost: float, undone: int) -> None:
    result = lc_split(CHAIN, fixed(DIRECT), cost_direct_window=window)
    assert [m for m, c in result.choices.items() if c.batch == 2] == [moved]
    assert result.split.total_gpus == pytest.approx(cost)
    assert result.cost_direct_undone == undone
    assert result.iterations == 1


def test_start_falls_back_to_the_fastest_and_impossible_slo_raises() -> None:
    # Batch 1 (the paper's start) is the slow option here; the fast one still fits.
    opts = {"X": [(30.0, 9.0), (80.0, 1.0)]}

    def opts_fn(_module: QueryModule, _rate: float) -> list[ModuleOption]:
        return [ModuleOption("gpu", 2, 30.0, 9.0), ModuleOption("gpu", 1, 80.0, 1.0)]

    two = QuerySpec("q", 60.0, 1.0, (QueryModule("a", "X"), QueryModule("b", "X", {"a": 1})))
    result = lc_split(two, opts_fn)
    assert {c.worst_case_ms for c in result.choices.values()} == {30.0}
    with pytest.raises(QueryError, match="no split meets"):
        lc_split(QuerySpec("q", 50.0, 1.0, two.modules), fixed(opts))
    with pytest.raises(QueryError, match="no configuration within SLO"):
        lc_split(QuerySpec("q", 20.0, 1.0, two.modules), fixed(opts))
    with pytest.raises(QueryError, match="cost_direct_window"):
        lc_split(two, opts_fn, cost_direct_window=-1)


LINEAR = {
    (m, "titanx"): BatchingProfile.linear(m, "titanx", a, b, memory_mib=1500)
    for m, a, b in [("det", 2.0, 12.0), ("cls", 0.6, 4.0), ("ocr", 1.5, 20.0)]
}
DIAMOND = QuerySpec(
    "traffic",
    250.0,
    80.0,
    (
        QueryModule("detect", "det"),
        QueryModule("car", "cls", {"detect": 3.0}),
        QueryModule("plate", "ocr", {"detect": 1.0}),
        QueryModule("merge", "cls", {"car": 1.0, "plate": 1.0}),
    ),
)


@pytest.mark.parametrize("batch_aware", [False, True], ids=["round-robin", "batch-aware"])
def test_profile_split_keeps_every_path_within_the_slo(batch_aware: bool) -> None:
    options = HarpagonOptions(batch_aware_dispatch=batch_aware, latency_cost_split=True)
    planner = ConfigPlanner(LINEAR, [GpuType("titanx", 12288)], options)
    result = lc_split(DIAMOND, profile_options(planner))
    budgets = result.split.budgets_ms
    paths = (["detect", "car", "merge"], ["detect", "plate", "merge"])
    for path in paths:
        assert sum(result.choices[m].worst_case_ms for m in path) <= sum(budgets[m] for m in path)
    # The slack is handed out: the longest path uses the whole SLO and none exceeds it.
    assert max(sum(budgets[m] for m in path) for path in paths) == pytest.approx(250.0)
    assert split_query(DIAMOND, planner).budgets_ms == budgets  # the switch selects Algorithm 2


def test_plan_with_the_switch_meets_every_module_slo() -> None:
    options = HarpagonOptions(latency_cost_split=True)
    result, splits = plan([], [DIAMOND], LINEAR, [GpuType("titanx", 12288)], options)
    budgets = splits["traffic"].budgets_ms
    assert not result.unplaced
    for gpu in result.gpus:
        for a in gpu.plan.allocations:
            module = a.session.name.split("/", 1)[1]
            assert a.latency_ms <= budgets[module] + 1e-6


def test_cli_switch_reaches_the_plan(tmp_path: Path) -> None:
    doc = {
        "gpu_types": {"titanx": {"memory_mib": 12288}},
        "profiles": [
            {"model": "det", "gpu_type": "titanx", "linear": {"alpha_ms": 2, "beta_ms": 12}},
            {"model": "cls", "gpu_type": "titanx", "linear": {"alpha_ms": 0.6, "beta_ms": 4}},
        ],
        "queries": [
            {
                "name": "q",
                "slo_ms": 200,
                "rate_rps": 50,
                "modules": [
                    {"name": "d", "model": "det"},
                    {"name": "c", "model": "cls", "after": {"d": 2}},
                ],
            }
        ],
    }
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", str(path), "--json", "--latency-cost-split"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["options"]["latency_cost_split"] is True
    assert sum(out["queries"]["q"]["budgets_ms"].values()) == pytest.approx(200.0)
