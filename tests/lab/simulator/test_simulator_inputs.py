"""Trace files, cluster files and workload generators."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from contracts.clusterfile import ClusterFileError
from lab.simulator.cluster import builtin_cluster, load_cluster
from lab.simulator.jobs import TraceError, dump_trace, job_from_mapping, load_trace
from lab.simulator.workloads import (
    LIGHT_HEAVY_SPLIT_PERCENT,
    SHORT_LONG_SPLIT_S,
    generate,
    production,
)


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        pytest.param({"arrival_s": 0, "duration_s": 1}, "jobs[0].id", id="missing-id"),
        pytest.param({"id": "a", "arrival_s": 0, "duration_s": 0}, "jobs[0].duration_s",
                     id="zero-duration"),
        pytest.param({"id": "a", "arrival_s": -1, "duration_s": 5}, "jobs[0].arrival_s",
                     id="negative-arrival"),
        pytest.param({"id": "a", "arrival_s": 0, "duration_s": 5, "gpu": 2}, "jobs[0].gpu",
                     id="unknown-field"),
        pytest.param({"id": "a", "arrival_s": 0, "duration_s": 5, "tasks": 1.5},
                     "jobs[0].tasks", id="fractional-tasks"),
        pytest.param({"id": "a", "arrival_s": 0, "duration_s": 5, "util_percent": 120},
                     "jobs[0].util_percent", id="util-over-100"),
        pytest.param({"id": "a", "arrival_s": "soon", "duration_s": 5}, "jobs[0].arrival_s",
                     id="not-a-number"),
    ],
)
def test_bad_job_records_name_the_field(raw: dict, path: str) -> None:
    with pytest.raises(TraceError) as err:
        job_from_mapping(raw)
    assert err.value.path == path


def test_json_round_trip_and_sorting(tmp_path: Path) -> None:
    jobs = generate("w-small", 1)[:5][::-1]
    file = tmp_path / "t.json"
    file.write_text(dump_trace(jobs))
    assert load_trace(file) == sorted(jobs, key=lambda j: (j.arrival_s, j.id))


def test_csv_trace_with_optional_columns_blank(tmp_path: Path) -> None:
    file = tmp_path / "t.csv"
    file.write_text("id,arrival_s,duration_s,tasks,gpus_per_task,predicted_mem_mib\n"
                    "b,5,60,2,4,\na,0,30,1,1,1000\n")
    jobs = load_trace(file)
    assert [j.id for j in jobs] == ["a", "b"]
    assert jobs[1].gpus == 8 and jobs[1].predicted_mem_mib is None
    assert jobs[0].pred_mem == 1000.0


@pytest.mark.parametrize(
    ("text", "suffix"),
    [
        pytest.param("{not json", ".json", id="bad-json"),
        pytest.param("jobs: 3", ".yaml", id="jobs-not-a-list"),
        pytest.param(json.dumps({"jobs": []}), ".json", id="empty"),
        pytest.param(json.dumps([{"id": "a", "arrival_s": 0, "duration_s": 1},
                                 {"id": "a", "arrival_s": 1, "duration_s": 1}]), ".json",
                     id="duplicate-id"),
    ],
)
def test_bad_trace_files(tmp_path: Path, text: str, suffix: str) -> None:
    file = tmp_path / f"t{suffix}"
    file.write_text(text)
    with pytest.raises(TraceError):
        load_trace(file)


def test_cluster_file_format_of_design(tmp_path: Path) -> None:
    file = tmp_path / "cluster.yaml"
    file.write_text("""
nodes:
  - {name: n1, gpus: [{product: NVIDIA-H100-80GB-HBM3, memory_mib: 81559, count: 8}]}
  - {name: n2, gpus: [{product: NVIDIA-A100-SXM4-40GB, memory_mib: 40960}]}
""")
    for spec in (str(file), f"sim:{file}"):
        nodes = load_cluster(spec)
        assert [len(n.gpus) for n in nodes] == [8, 1]
        assert (nodes[0].gpus[7].index, nodes[0].gpus[7].uuid) == (7, "GPU-sim-n1-7")


def test_bad_cluster_file_names_the_file_and_every_problem(tmp_path: Path) -> None:
    file = tmp_path / "cluster.yaml"
    file.write_text("nodes: [{name: a, gpus: [{product: p, memory_mib: -1, count: 100}]}]")
    with pytest.raises(ClusterFileError) as err:
        load_cluster(str(file))
    assert err.value.source == str(file)
    assert err.value.problems == (
        "nodes[0].gpus[0].memory_mib: must be a positive integer (MiB), got -1",
        "nodes[0].gpus[0].count: must be an integer in 1..64, got 100")


def test_builtin_large_cluster_is_the_papers_size_with_two_types() -> None:
    nodes = builtin_cluster("large")
    assert len(nodes) == 128 and sum(len(n.gpus) for n in nodes) == 1024
    assert len({g.product for n in nodes for g in n.gpus}) == 2


@pytest.mark.parametrize(("name", "short_more"), [("w-small", True), ("w-large", False)])
def test_testbed_mixes_follow_their_class_shares(name: str, short_more: bool) -> None:
    jobs = generate(name, 11)
    assert len(jobs) == 100 and all(j.gpus == 1 for j in jobs)
    assert all(180 <= j.duration_s <= 7200 for j in jobs)
    short = sum(j.duration_s <= SHORT_LONG_SPLIT_S for j in jobs)
    light = sum(j.util_percent < LIGHT_HEAVY_SPLIT_PERCENT for j in jobs)
    assert (short > 50) == short_more and (light > 50) == short_more
    assert all(j.pred_mem <= j.mem_mib for j in jobs)  # Eq. 2 is a minimum estimate


def test_production_matches_the_published_shape() -> None:
    jobs = production(4, jobs=3000)
    durations = [j.duration_s for j in jobs]
    utils = [j.util_percent for j in jobs]
    assert statistics.median(durations) == pytest.approx(300 * 60, rel=0.1)
    assert statistics.mean(utils) == pytest.approx(51, abs=2.5)
    assert sum(j.gpus == 1 for j in jobs) / len(jobs) > 0.5
    assert all(j.gpus_per_task <= 8 for j in jobs)
