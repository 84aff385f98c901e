"""The public trace format, the inflation protocol and the baseline packers (issue #41).

Every trace here is a tiny CSV the test writes in the published format; the real
trace is never read by tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from extender.core.fragmentation import Shape, Shapes
from lab.simulator.inflation import PackState, arrival_order, run_inflation, tie_order
from lab.simulator.packing_policies import (
    BestFit,
    Fgd,
    KubeDefault,
    RandomFit,
    Split,
    fgd_scores,
    typical_shapes,
)
from lab.simulator.packing_tandem import TandemCore
from lab.simulator.policies import tandem_cost
from lab.simulator.trace_csv import TraceError, read_nodes, read_pods

NODE_HEAD = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEAD = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time\n")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def pods_csv(tmp_path: Path, rows: list[tuple[int, int, int, int]], spec: str = "") -> Path:
    body = "".join(f"p{i},{c},{m},{n},{g},{spec},LS,Running,0,1,0\n"
                   for i, (c, m, n, g) in enumerate(rows))
    return write(tmp_path, "pods.csv", POD_HEAD + body)


def nodes_csv(tmp_path: Path, rows: list[tuple[int, int, int, str]]) -> Path:
    body = "".join(f"n{i},{c},{m},{g},{model}\n" for i, (c, m, g, model) in enumerate(rows))
    return write(tmp_path, "nodes.csv", NODE_HEAD + body)


def test_reads_the_published_columns(tmp_path):
    nodes = read_nodes(nodes_csv(tmp_path, [(64000, 262144, 2, "P100"), (96000, 393216, 8, "G2")]))
    pods = read_pods(pods_csv(tmp_path, [(12000, 16384, 1, 460), (4000, 8192, 0, 0),
                                         (32000, 65536, 4, 1000)]))
    assert nodes.names == ("n0", "n1") and nodes.gpu_capacity_milli == 10_000
    assert pods.gpu_demand_milli.tolist() == [460, 0, 4000]
    assert pods.gpu_spec == (frozenset(),) * 3


@pytest.mark.parametrize(("row", "words"), [
    ("p0,12000,16384,1,1200,,LS,Running,0,1,0", "gpu_milli: 1200 is out of range"),
    ("p0,12000,16384,2,500,,LS,Running,0,1,0", "takes whole GPUs"),
    ("p0,12000,16384,0,300,,LS,Running,0,1,0", "num_gpu 0"),
    ("p0,-5,16384,1,300,,LS,Running,0,1,0", "cpu_milli: -5 is out of range"),
    ("p0,12k,16384,1,300,,LS,Running,0,1,0", "cpu_milli: '12k' is not an integer"),
])
def test_a_bad_pod_row_names_file_line_and_column(tmp_path, row, words):
    path = write(tmp_path, "pods.csv", POD_HEAD + "ok,1,1,1,100,,LS,Running,0,1,0\n" + row + "\n")
    with pytest.raises(TraceError, match=words) as caught:
        read_pods(path)
    assert f"{path}:3:" in str(caught.value)


def test_missing_columns_duplicates_and_unreadable_files_are_errors(tmp_path):
    with pytest.raises(TraceError, match="missing column"):
        read_nodes(write(tmp_path, "n.csv", "sn,cpu_milli\nx,1\n"))
    with pytest.raises(TraceError, match="appears twice"):
        read_nodes(write(tmp_path, "n2.csv", NODE_HEAD + "a,1,1,1,T4\na,1,1,1,T4\n"))
    with pytest.raises(TraceError, match="cannot read"):
        read_pods(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="no rows"):
        read_pods(write(tmp_path, "empty.csv", POD_HEAD))


def test_arrivals_reach_the_share_first_pass_without_repeats(tmp_path):
    nodes = read_nodes(nodes_csv(tmp_path, [(64000, 262144, 4, "T4")]))
    pods = read_pods(pods_csv(tmp_path, [(1000, 1000, 1, 500)] * 6))
    order = arrival_order(pods, nodes.gpu_capacity_milli, 1.3, np.random.default_rng(3))
    assert sorted(order[:6].tolist()) == list(range(6))  # a permutation first
    demand = pods.gpu_demand_milli[order]
    # as many as stay within 130%: the next draw (500) would pass it
    assert demand.sum() <= 1.3 * 4000 < demand.sum() + 500


def test_inflation_skips_failures_and_counts_them_by_gpus(tmp_path):
    # One node with 2 GPUs and 10 cores: the 8-GPU pod and the CPU-heavy pod fail.
    nodes = read_nodes(nodes_csv(tmp_path, [(10000, 100000, 2, "T4")]))
    pods = read_pods(pods_csv(tmp_path, [(1000, 1000, 1, 1000), (1000, 1000, 8, 1000),
                                         (20000, 1000, 1, 500), (1000, 1000, 1, 500)]))
    result = run_inflation(nodes, pods, np.arange(4), BestFit(), checkpoints=(50, 100, 500))
    assert result.failed_by_gpus == {"1": 1, "8": 1}
    # 100% has arrived with the 8-GPU pod (1 GPU placed); all of it by the end (1.5 GPUs)
    assert result.alloc_at == {"50": 50.0, "100": 50.0, "500": 75.0}
    assert result.free_whole_gpus == 0


def test_bestfit_shares_a_gpu_where_random_may_open_a_new_one(tmp_path):
    nodes = read_nodes(nodes_csv(tmp_path, [(64000, 262144, 2, "T4"), (64000, 262144, 2, "T4")]))
    pods = read_pods(pods_csv(tmp_path, [(1000, 1000, 1, 500), (1000, 1000, 1, 500),
                                         (1000, 1000, 2, 1000)]))
    result = run_inflation(nodes, pods, np.arange(3), BestFit())
    assert result.failed_by_gpus == {} and result.free_whole_gpus == 1  # the shares share


def test_fgd_keeps_the_whole_gpus_the_workload_needs(tmp_path):
    # Shares of 600 arrive among whole-GPU pods: best fit puts the second 600 beside the
    # first's leftover 400? It cannot; FGD must not open the 2-GPU node's whole pair.
    nodes = read_nodes(nodes_csv(tmp_path, [(64000, 262144, 1, "T4"), (64000, 262144, 2, "T4")]))
    state = PackState(nodes)
    fgd = Fgd(Shapes.of({fgd_shape(2, 1000.0): 1.0}))  # the workload: 2-GPU pods come
    from lab.simulator.inflation import TracePod
    choice = fgd.choose(state, TracePod(1, 1000.0, 1000.0, 1, 600.0, frozenset()))
    assert choice is not None and choice[0] == 0  # the 1-GPU node, keeping the pair whole


def fgd_shape(gpus: int, milli: float):
    return Shape(gpus, milli, 1000.0, 0.0)


def test_typical_pods_are_the_most_frequent_shapes_covering_95_percent(tmp_path):
    # 19 of one share, 1 whole GPU: the share alone covers 95%, memory is no part of a shape
    rows = [(1000, 100 + i, 1, 500) for i in range(19)] + [(2000, 1000, 1, 1000)]
    shapes = typical_shapes(read_pods(pods_csv(tmp_path, rows)))
    assert shapes.per_gpu.tolist() == [500.0] and shapes.weight.tolist() == [1.0]
    assert shapes.mem.tolist() == [0.0]
    rows += [(2000, 1000, 1, 1000)]  # now 19 of 21 (90%): the whole GPU joins
    both = typical_shapes(read_pods(pods_csv(tmp_path, rows)))
    assert both.per_gpu.tolist() == [500.0, 1000.0]
    assert both.weight.tolist() == pytest.approx([19 / 21, 2 / 21])


def test_fgd_scores_are_the_artifacts_integers():
    # 100 * sigmoid(-dF / 1000), truncated: no growth 50, 40 thousandths more still 49
    scores = fgd_scores(np.array([[0.0, 40.0, -1000.0, np.inf]]))
    assert scores.tolist() == [[50.0, 49.0, 73.0, -1.0]]


def test_equal_scores_go_to_the_first_node_in_tie_order(tmp_path):
    # Two empty nodes, the second first in tie order: best fit and FGD take it on a tie.
    nodes = read_nodes(nodes_csv(tmp_path, [(64000, 262144, 2, "T4")] * 2))
    from lab.simulator.inflation import TracePod
    pod = TracePod(0, 1000.0, 1000.0, 1, 500.0, frozenset())
    rank = np.array([1, 0])
    assert BestFit().choose(PackState(nodes, rank), pod) == (1, (0,))
    fgd = Fgd(Shapes.of({fgd_shape(1, 500.0): 1.0}))
    assert fgd.choose(PackState(nodes, rank), pod) == (1, (0,))
    assert fgd.choose(PackState(nodes), pod) == (0, (0,))
    # one order per seed, the same for every policy, a permutation of the nodes
    assert sorted(tie_order(50, 3).tolist()) == list(range(50))
    assert tie_order(50, 3).tolist() == tie_order(50, 3).tolist() != tie_order(50, 4).tolist()


def test_alloc_at_is_the_mean_over_the_pods_whose_arrival_rounds_to_it(tmp_path):
    # 10 GPUs; shares of 40 thousandths: arrivals 0.4%, 0.8%, 1.2% ... 2.0% round to 0, 1, 1,
    # 2, 2: the mark 1% is the mean of the allocation after the 2nd and 3rd pods
    nodes = read_nodes(nodes_csv(tmp_path, [(64000, 262144, 10, "T4")]))
    pods = read_pods(pods_csv(tmp_path, [(1000, 1000, 1, 40)] * 5))
    result = run_inflation(nodes, pods, np.arange(5), BestFit(), checkpoints=(1, 2))
    assert result.alloc_at["1"] == pytest.approx((0.8 + 1.2) / 2)
    assert result.alloc_at["2"] == pytest.approx((1.6 + 2.0) / 2)


def test_kube_default_spreads_cpu_only_pods_to_the_least_allocated_node(tmp_path):
    nodes = read_nodes(nodes_csv(tmp_path, [(10000, 100000, 1, "T4"), (10000, 100000, 1, "T4")]))
    split = Split("bf", BestFit(), KubeDefault(np.random.default_rng(0)))
    state = PackState(nodes)
    from lab.simulator.inflation import TracePod
    first = split.choose(state, TracePod(0, 4000.0, 1000.0, 0, 0.0, frozenset()))
    assert first is not None
    state.place(first[0], (), 4000.0, 1000.0, 0.0)
    second = split.choose(state, TracePod(1, 4000.0, 1000.0, 0, 0.0, frozenset()))
    assert second is not None and second[0] != first[0]


def test_gpu_spec_limits_the_models_a_pod_may_use(tmp_path):
    nodes = read_nodes(nodes_csv(tmp_path, [(64000, 262144, 1, "T4"), (64000, 262144, 1, "V100")]))
    pods = read_pods(pods_csv(tmp_path, [(1000, 1000, 1, 500)] * 3, spec="V100"))
    result = run_inflation(nodes, pods, np.arange(3), RandomFit(np.random.default_rng(0)))
    assert result.failed_by_gpus == {"1": 1}


def test_tandem_core_packs_shares_instead_of_spreading_them(tmp_path):
    # Four 500-milli shares then two whole GPUs on 4 GPUs: packed, everything fits.
    nodes = read_nodes(nodes_csv(tmp_path, [(64000, 262144, 2, "T4"), (64000, 262144, 2, "T4")]))
    pods = read_pods(pods_csv(tmp_path, [(1000, 1000, 1, 500)] * 4 + [(1000, 1000, 1, 1000)] * 2))
    packed = run_inflation(nodes, pods, np.arange(6), TandemCore("t", nodes, tandem_cost()))
    assert packed.failed_by_gpus == {}
    spread = run_inflation(nodes, pods, np.arange(6),
                           TandemCore("h", nodes, tandem_cost(), packing=False))
    assert spread.failed_by_gpus == {"1": 2}  # Horus alone opens a fresh GPU per share


def test_simulate_runs_the_protocol_on_a_trace_and_sweeps_the_packing_weights(tmp_path):
    from typer.testing import CliRunner

    from tandem.cli import app

    nodes = nodes_csv(tmp_path, [(64000, 262144, 2, "T4"), (64000, 262144, 2, "T4")])
    pods = pods_csv(tmp_path, [(1000, 1000, 1, 500)] * 4 + [(1000, 1000, 1, 1000)] * 4)
    runner = CliRunner()
    done = runner.invoke(app, ["simulate", "--pods", str(pods), "--nodes", str(nodes),
                               "--policy", "bestfit", "--policy", "tandem", "--json"])
    assert done.exit_code == 0, done.output
    import json
    doc = json.loads(done.output)
    assert doc["policies"]["tandem"]["alloc_at"]["100"] == 100.0
    swept = runner.invoke(app, ["simulate", "--pods", str(pods), "--nodes", str(nodes),
                                "--sweep", "--grid", "w_fit=0,0.1", "--json"])
    assert swept.exit_code == 0, swept.output
    assert [r["setting"]["w_fit"] for r in json.loads(swept.output)["sweep"]] in ([0, 0.1],
                                                                                  [0.1, 0])
    bad = runner.invoke(app, ["simulate", "--pods", str(pods)])
    assert bad.exit_code == 2 and "give both --pods and --nodes" in bad.output
    grid = runner.invoke(app, ["simulate", "--pods", str(pods), "--nodes", str(nodes),
                               "--sweep", "--grid", "max_pods_per_gpu=2"])
    assert grid.exit_code == 2 and "expected KEY=V1,V2" in grid.output


def test_the_benchmark_prints_the_issues_keys_and_resumes_from_kept_seeds(tmp_path):
    from bench_modules import load

    packing = load("packing")
    nodes = nodes_csv(tmp_path, [(64000, 262144, 2, "T4"), (64000, 262144, 2, "T4")])
    pods = pods_csv(tmp_path, [(1000, 1000, 1, 500)] * 4 + [(1000, 1000, 1, 1000)] * 4
                    + [(2000, 1000, 0, 0)])
    names = ("bestfit", "tandem")
    seeds = [packing.run_seed((pods, nodes, s, names, tmp_path)) for s in range(2)]
    assert (tmp_path / "seed-1.json").exists()
    assert packing.run_seed((pods, nodes, 1, names, tmp_path)) == json_of(tmp_path / "seed-1.json")
    # a policy kept for the seed is read back, a missing one runs and is added
    kept = json_of(tmp_path / "seed-1.json")
    kept["bestfit"]["arrived"] = -1
    del kept["tandem"]
    (tmp_path / "seed-1.json").write_text(json.dumps(kept))
    again = packing.run_seed((pods, nodes, 1, names, tmp_path))
    assert again["bestfit"]["arrived"] == -1
    assert again["tandem"]["alloc_at"] == seeds[1]["tandem"]["alloc_at"]
    assert set(json_of(tmp_path / "seed-1.json")) == {"bestfit", "tandem"}
    policies = packing.summarise(seeds, names)
    for name in names:
        assert set(policies[name]) >= {"alloc_at", "failed_by_gpus", "free_whole_gpus"}
        assert set(policies[name]["alloc_at"]) == {"100", "130"}
    assert 50.0 <= policies["tandem"]["alloc_at"]["130"] <= 100.0
    assert sum(policies["tandem"]["decided_by"].values()) > 0
    assert set(packing.goals(policies)["tandem_above_bestfit_every_seed"]) == {"100", "130"}
    settings = (("w_order", "0.5"), ("weighting", "volume"))
    assert packing.tuned(settings).packing.w_order == 0.5
    assert packing.tuned(settings).packing.weighting == "volume"
    with pytest.raises(ValueError, match="packing.w_fit"):
        packing.tuned((("w_fit", "-1"),))
    lead = packing.goals(policies)["tandem_minus_bestfit"]["130"]
    diffs = [t - b for t, b in zip(policies["tandem"]["alloc_at_seeds"]["130"],
                                   policies["bestfit"]["alloc_at_seeds"]["130"], strict=True)]
    assert lead["mean"] == pytest.approx(sum(diffs) / 2, abs=0.01) and lead["seeds"] == 2
    assert lead["seeds_above"] == sum(d > 0 for d in diffs)


def json_of(path: Path):
    import json
    return json.loads(path.read_text())


def test_a_policys_draws_do_not_depend_on_the_policies_beside_it(tmp_path):
    # Random tie-breaks are keyed by the policy's name: FGD on a seed packs the same whether
    # it runs alone or after others (they were keyed by its position in the list).
    from lab.simulator.packing_command import packing_policies, run_policies

    nodes = read_nodes(nodes_csv(tmp_path, [(64000, 262144, 4, "T4")] * 6))
    pods = read_pods(pods_csv(tmp_path, [(1000, 1000, 1, m) for m in (300, 500, 700)] * 12
                              + [(1000, 1000, 2, 1000)] * 3))
    build = packing_policies(tandem_cost())
    alone = run_policies(nodes, pods, [0, 1], {"random": build["random"], "fgd": build["fgd"]})
    beside = run_policies(nodes, pods, [0, 1], {"bestfit": build["bestfit"],
                                                "random": build["random"], "fgd": build["fgd"]})
    assert alone["fgd"] == beside["fgd"] and alone["random"] == beside["random"]
