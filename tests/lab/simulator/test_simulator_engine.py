"""Event engine conservation, each policy on tiny hand-checked traces, determinism."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from lab.simulator.cluster import RTX_2080, uniform_cluster
from lab.simulator.engine import Engine, EngineConfig
from lab.simulator.interference import InterferenceError, SlowdownModel
from lab.simulator.jobs import SimJob
from lab.simulator.metrics import summarize
from lab.simulator.policies import POLICIES, PolicyError, make_policy
from lab.simulator.runner import simulate
from lab.simulator.workloads import WorkloadError, generate

ONE_GPU = uniform_cluster(1, 1, *RTX_2080)
# RTX 2080 line below 100%: 1 + (a + b + c - 1) * x with Horus footnote 4's coefficients.
LINE_2080 = 1.16664 - 0.00302 + 0.00004 - 1.0


def job(id_: str, t: float = 0.0, d: float = 100.0, util: float = 50.0, mem: float = 1000.0,
        pred_mem: float | None = None, tasks: int = 1, gpus: int = 1) -> SimJob:
    return SimJob(id=id_, arrival_s=t, duration_s=d, util_percent=util, mem_mib=mem,
                  predicted_mem_mib=pred_mem, tasks=tasks, gpus_per_task=gpus)


def run(policy: str, jobs: list[SimJob], nodes=ONE_GPU, **cfg: object) -> Engine:
    return Engine(nodes, jobs, make_policy(policy), EngineConfig(**cfg)).run()  # type: ignore[arg-type]


def test_fifo_runs_one_job_per_gpu_in_arrival_order() -> None:
    r = summarize(run("fifo", [job("a"), job("b")]), "fifo")
    assert (r.makespan_s, r.avg_wait_s, r.avg_jct_s, r.avg_run_s) == (200.0, 50.0, 150.0, 100.0)
    assert r.avg_gpu_util == pytest.approx(50.0)


def test_obp_co_locates_and_both_slow_down_on_the_curve() -> None:
    r = summarize(run("obp", [job("a", util=40, mem=2048), job("b", util=40, mem=2048)]), "obp")
    slowdown = 1 + LINE_2080 * 0.8
    assert r.makespan_s == pytest.approx(100 * slowdown)
    assert r.avg_wait_s == 0.0
    assert r.avg_gpu_util == pytest.approx(80.0)


def test_pab_profiles_then_requeues_the_slowed_job() -> None:
    # a alone 0-60 s; b joins at 60 (GPU settled), both at 200% -> 2.4x (cap);
    # b's check at 120 s evicts it; a finishes at 60 + 60/2.4 + 15 = 135; b reruns 135-235.
    engine = run("pab", [job("a", util=100), job("b", util=100)])
    r = summarize(engine, "pab")
    assert r.evictions == 1
    assert r.makespan_s == pytest.approx(235.0)
    a, b = engine.runs
    assert a.finish_s == pytest.approx(135.0) and b.start_s == pytest.approx(135.0)


def test_oom_requeues_with_corrected_memory_and_never_overfills() -> None:
    jobs = [job("a", mem=5000, util=30), job("b", t=1, mem=4000, pred_mem=3000, util=30)]
    engine = run("obp", jobs)
    r = summarize(engine, "obp")
    assert r.oom_events == 1 and r.max_mem_excess_mib <= 0
    assert engine.runs[1].start_s == 100.0 and r.makespan_s == 200.0


def _placements_at_start(engine: Engine) -> dict[float, dict[int, float]]:
    seen: dict[float, dict[int, float]] = {}
    for t, row, util, _mem, _n in engine.gpu_timeline:
        seen.setdefault(t, {})[row] = util
    return seen


@pytest.mark.parametrize(
    ("policy", "nodes"),
    [
        pytest.param("horus", uniform_cluster(1, 2, *RTX_2080), id="horus-one-node"),
        pytest.param("horus-f", uniform_cluster(1, 2, *RTX_2080), id="horus-f-one-node"),
        pytest.param("tandem", uniform_cluster(2, 1, *RTX_2080), id="tandem-two-nodes"),
    ],
)
def test_horus_cost_keeps_heavy_jobs_apart(policy: str, nodes: list) -> None:
    # a (90%) takes row 0; b (20%) is cheaper on the empty row 1 (cost 0.22 vs 0.80);
    # c (80%) then prefers b's GPU (100% total, cost 0.74) over a's (170%, cost 1.58).
    jobs = [job("a", t=0, util=90, d=1000), job("b", t=1, util=20, d=1000),
            job("c", t=2, util=80, d=1000)]
    engine = run(policy, jobs, nodes, record_gpu_timeline=True)
    at = _placements_at_start(engine)
    assert at[0.0] == {0: 90.0}
    assert at[1.0] == {1: 20.0}
    assert at[2.0] == {1: 100.0}


def test_multi_task_job_is_placed_as_a_gang_through_the_core() -> None:
    nodes = uniform_cluster(2, 2, *RTX_2080)
    engine = run("horus", [job("wide", tasks=2, gpus=2, util=60)], nodes,
                 record_gpu_timeline=True)
    assert sorted(row for _t, row, *_ in engine.gpu_timeline if _t == 0.0) == [0, 1, 2, 3]
    assert summarize(engine, "horus").finished == 1


def _mixed_trace() -> list[SimJob]:
    jobs = generate("w-small", 3)[:40]
    wide = [job(f"wide{i}", t=100.0 * i, d=900, util=55, mem=1500, tasks=2, gpus=2)
            for i in range(4)]
    return jobs + wide


@pytest.mark.parametrize("policy", list(POLICIES))
def test_conservation_every_job_finishes_once_and_memory_never_overflows(policy: str) -> None:
    nodes = uniform_cluster(3, 4, *RTX_2080)
    jobs = _mixed_trace()
    engine = Engine(nodes, jobs, make_policy(policy), EngineConfig(record_gpu_timeline=True))
    finished: Counter[str] = Counter()
    original = engine._finish

    def counting(run_):  # type: ignore[no-untyped-def]
        finished[run_.job.id] += 1
        original(run_)

    engine._finish = counting  # type: ignore[method-assign]
    engine.run()
    assert finished == Counter({j.id: 1 for j in jobs})
    assert all(math.isfinite(r.finish_s) and r.finish_s >= r.start_s >= r.job.arrival_s
               for r in engine.runs)
    mem = np.array([m for *_, m, _n in engine.gpu_timeline])
    assert mem.max() <= 8192.0 + 1e-6 and engine.max_mem_excess_mib <= 0
    assert engine.table.pod_count.sum() == 0 and engine.mem_true.max() == 0.0


def test_same_seed_same_result_and_seeds_differ() -> None:
    nodes = uniform_cluster(3, 4, *RTX_2080)
    first = simulate(generate("w-large", 5), nodes, "tandem").summary()
    second = simulate(generate("w-large", 5), nodes, "tandem").summary()
    assert first == second
    assert generate("w-large", 5) != generate("w-large", 6)


@pytest.mark.parametrize(
    ("model", "util", "jobs", "want"),
    [
        pytest.param("curve", 150.0, 1, 1.0, id="alone-never-slows"),
        pytest.param("curve", 80.0, 2, 1 + LINE_2080 * 0.8, id="curve-linear-below-100"),
        pytest.param("curve", 110.0, 2, 1.16664 * 1.21 - 0.00302 * 1.1 + 4e-5,
                     id="curve-quadratic-above-100"),
        pytest.param("curve", 200.0, 3, 2.4, id="curve-capped-at-paper-maximum"),
        pytest.param("linear", 150.0, 2, 1 + LINE_2080 * 1.5, id="linear-keeps-the-line"),
    ],
)
def test_slowdown_models(model: str, util: float, jobs: int, want: float) -> None:
    m = SlowdownModel.for_types(model, ["NVIDIA-GeForce-RTX-2080"])
    got = m.slowdown(np.array([util]), np.array([jobs]), np.array([0]))
    assert got[0] == pytest.approx(want)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        pytest.param(lambda: make_policy("sjf"), PolicyError, id="policy"),
        pytest.param(lambda: generate("w-medium", 1), WorkloadError, id="workload"),
        pytest.param(lambda: SlowdownModel.for_types("cubic", []), InterferenceError,
                     id="interference"),
    ],
)
def test_unknown_names_list_the_valid_ones(call, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match="valid: "):
        call()


def test_a_job_too_big_for_the_cluster_is_reported_unfinished() -> None:
    r = simulate([job("ok"), job("huge", tasks=1, gpus=4)], ONE_GPU, "horus")
    assert (r.finished, r.unfinished) == (1, 1)


HEAVY_PAIR = [job("a", util=100), job("b", t=1, util=100)]
LIGHT_PAIR = [job("a", util=40), job("b", util=40)]
# Heavy pair together: a runs 1 s alone, then both at 200% (capped 2.4x): a ends at
# 1 + 99 * 2.4 = 238.6 s, b has 1 s of work left and ends at 239.6 s. In turn: 200 s.
SHARED_HEAVY_S = 1 + 99 * 2.4 + 1


@pytest.mark.parametrize(
    ("policy", "gain", "jobs", "makespan", "wait"),
    [
        pytest.param("horus", "policy", HEAVY_PAIR, SHARED_HEAVY_S, 0.0,
                     id="horus-over-commits-heavy-pair"),
        pytest.param("tandem", "policy", HEAVY_PAIR, 200.0, 99.0 / 2,
                     id="tandem-runs-heavy-pair-in-turn"),
        pytest.param("tandem", None, HEAVY_PAIR, SHARED_HEAVY_S, 0.0,
                     id="tandem-rule-off-behaves-like-horus"),
        pytest.param("tandem", "policy", LIGHT_PAIR, 100 * (1 + LINE_2080 * 0.8), 0.0,
                     id="tandem-still-shares-light-pair"),
    ],
)
def test_colocation_throughput_rule_on_tiny_traces(policy: str, gain: object, jobs: list[SimJob],
                                                   makespan: float, wait: float) -> None:
    from dataclasses import replace

    from lab.simulator.policies import PolicyOptions, tandem_cost

    options = None if gain == "policy" else PolicyOptions(
        cost=replace(tandem_cost(), min_colocation_gain_percent=gain))
    engine = Engine(ONE_GPU, jobs, make_policy(policy, options), EngineConfig()).run()
    r = summarize(engine, policy)
    assert r.makespan_s == pytest.approx(makespan)
    assert r.avg_wait_s == pytest.approx(wait)
    assert r.oom_events == 0 and r.finished == 2


def test_tandem_default_config_turns_the_rule_on_and_horus_keeps_it_off() -> None:
    from lab.simulator.policies import tandem_cost

    assert tandem_cost().min_colocation_gain_percent is not None
    horus = make_policy("horus")
    assert horus.settings.cost.min_colocation_gain_percent is None  # type: ignore[attr-defined]
