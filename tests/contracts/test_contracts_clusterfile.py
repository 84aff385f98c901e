"""The simulated cluster file: one parser, one set of rules, the same answer for every reader."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.errors import ConfigError
from agent.node.sim_gpus import load_sim_gpus
from contracts.clusterfile import (
    MAX_GPUS_PER_ENTRY,
    ClusterFile,
    ClusterFileError,
    SimGpu,
    SimNode,
    SimPod,
    load_cluster_file,
    parse_cluster_file,
    sim_gpu_uuid,
)
from extender.cluster.sim import DEFAULT_CLUSTER, SimSource
from lab.simulator.cluster import load_cluster, uniform_cluster

H100 = "{product: NVIDIA-H100-80GB-HBM3, memory_mib: 81559"
GOOD_NODE = f"{{name: n, gpus: [{H100}}}]}}"


def gpu_doc(extra: str) -> str:
    """A one-node file whose single GPU entry carries ``extra`` keys."""
    return f"nodes: [{{name: n, gpus: [{{product: P, memory_mib: 100{extra}}}]}}]"


# (file text, the path of every problem the parser must report, in order)
BAD_FILES = [
    pytest.param("[1, 2]", ["file"], id="not-a-mapping"),
    pytest.param("gpus: []", ["gpus", "nodes"], id="no-nodes-key-and-unknown-key"),
    pytest.param("nodes: x", ["nodes"], id="nodes-not-a-list"),
    pytest.param(f"nodes: [{GOOD_NODE}]\nextra: 1", ["extra"], id="unknown-top-key"),
    pytest.param("nodes: [x]", ["nodes[0]"], id="node-not-a-mapping"),
    pytest.param(f"nodes: [{{name: n, gpu: [{H100}}}]}}]", ["nodes[0].gpu"],
                 id="unknown-node-key"),
    pytest.param(f"nodes: [{{gpus: [{H100}}}]}}]", ["nodes[0].name"], id="node-without-name"),
    pytest.param(f"nodes: [{GOOD_NODE}, {GOOD_NODE}]", ["nodes[1].name"], id="node-name-repeats"),
    pytest.param("nodes: [{name: n, gpus: 4}]", ["nodes[0].gpus"], id="gpus-not-a-list"),
    pytest.param("nodes: [{name: n, gpus: [x]}]", ["nodes[0].gpus[0]"], id="gpu-not-a-mapping"),
    pytest.param(gpu_doc(", power: 3"), ["nodes[0].gpus[0].power"], id="unknown-gpu-key"),
    pytest.param("nodes: [{name: n, gpus: [{memory_mib: 1}]}]", ["nodes[0].gpus[0].product"],
                 id="no-product"),
    pytest.param("nodes: [{name: n, gpus: [{product: P, memory_mib: 8192.5}]}]",
                 ["nodes[0].gpus[0].memory_mib"], id="fractional-memory"),
    pytest.param("nodes: [{name: n, gpus: [{product: P, memory_mib: 0}]}]",
                 ["nodes[0].gpus[0].memory_mib"], id="zero-memory"),
    pytest.param("nodes: [{name: n, gpus: [{product: P, memory_mib: 8Gi}]}]",
                 ["nodes[0].gpus[0].memory_mib"], id="memory-as-a-quantity"),
    pytest.param(gpu_doc(", count: 0"), ["nodes[0].gpus[0].count"], id="count-zero"),
    pytest.param(gpu_doc(f", count: {MAX_GPUS_PER_ENTRY + 1}"), ["nodes[0].gpus[0].count"],
                 id="count-over-the-limit"),
    pytest.param(gpu_doc(", count: 2.0"), ["nodes[0].gpus[0].count"], id="count-float"),
    pytest.param(gpu_doc(", count: 2, index: 0, uuid: u"),
                 ["nodes[0].gpus[0].index", "nodes[0].gpus[0].uuid"], id="index-uuid-on-a-count"),
    pytest.param(gpu_doc(", index: -1"), ["nodes[0].gpus[0].index"], id="negative-index"),
    pytest.param(gpu_doc(", uuid: ''"), ["nodes[0].gpus[0].uuid"], id="empty-uuid"),
    pytest.param("nodes: [{name: n, gpus: [{product: P, memory_mib: 1, index: 1},"
                 " {product: P, memory_mib: 1, count: 2}]}]", ["nodes[0].gpus"],
                 id="index-repeats"),
    pytest.param("nodes: [{name: a, gpus: [{product: P, memory_mib: 1, uuid: U}]},"
                 " {name: b, gpus: [{product: P, memory_mib: 1, uuid: U}]}]", ["nodes[1].gpus"],
                 id="uuid-repeats-across-nodes"),
    pytest.param("nodes: [{name: cpu}, {name: cpu2, gpus: []}]", ["nodes"], id="no-gpus-at-all"),
    pytest.param(f"nodes: [{GOOD_NODE}]\npods: x", ["pods"], id="pods-not-a-list"),
    pytest.param(f"nodes: [{GOOD_NODE}]\npods: [{{name: p, node: m}}]", ["pods[0].node"],
                 id="pod-on-an-unknown-node"),
    pytest.param(f"nodes: [{GOOD_NODE}]\npods: [{{name: p, node: n, gpu_index: [3]}}]",
                 ["pods[0].gpu_index"], id="pod-on-a-missing-gpu"),
    pytest.param(f"nodes: [{GOOD_NODE}]\npods: [{{name: p, node: n, gpus: 1}}]",
                 ["pods[0].gpus"], id="unknown-pod-key"),
    pytest.param(f"nodes: [{GOOD_NODE}]\npods: [{{node: n, util_percent: 130, workload: x}}]",
                 ["pods[0].name", "pods[0].util_percent", "pods[0].workload"],
                 id="pod-without-name-over-100-percent-unknown-workload"),
    pytest.param("nodes: [{name: a, gpus: [{product: P, memory_mib: 1.5}]},"
                 " {name: b, gpus: [{product: '', memory_mib: 1, count: 100}]}]\n"
                 "pods: [{name: p, node: a, mem_mib: -1}]",
                 ["nodes[0].gpus[0].memory_mib", "nodes[1].gpus[0].product",
                  "nodes[1].gpus[0].count", "pods[0].mem_mib"], id="several-problems-at-once"),
]

GOOD_FILES = [
    pytest.param(DEFAULT_CLUSTER.read_text(), id="demo-cluster"),
    pytest.param("nodes:\n  - name: a\n    gpus:\n"
                 "      - {product: NVIDIA-H100-80GB-HBM3, memory_mib: 81559, count: 2}\n"
                 "      - {product: NVIDIA-A100-SXM4-40GB, memory_mib: 40960, uuid: GPU-fixed}\n"
                 "      - {product: NVIDIA GeForce RTX 2080, memory_mib: 8192, index: 7}\n"
                 "  - {name: b, gpus: [{product: P, memory_mib: 1, count: 64}]}\n"
                 "  - {name: cpu}\n"
                 "pods: [{name: p, node: a, gpu_index: [0, 7], util_percent: 30, mem_mib: 512}]\n",
                 id="mixed-entries-and-a-pod"),
]


def problem_paths(err: ClusterFileError) -> list[str]:
    return [p.split(": ", 1)[0] for p in err.problems]


@pytest.mark.parametrize(("text", "paths"), BAD_FILES)
def test_parser_reports_every_problem_with_its_path(text: str, paths: list[str]) -> None:
    with pytest.raises(ClusterFileError) as err:
        parse_cluster_file(yaml.safe_load(text))
    assert problem_paths(err.value) == paths


def test_unknown_keys_list_the_valid_ones() -> None:
    with pytest.raises(ClusterFileError) as err:
        parse_cluster_file(yaml.safe_load(gpu_doc(", power: 3")))
    assert err.value.problems == (
        "nodes[0].gpus[0].power: unknown key (valid: count, index, memory_mib, product, uuid)",)


def test_error_names_the_file_and_each_problem(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("nodes: [{name: a, gpus: [{product: P, memory_mib: 1.5, count: 0}]}]")
    with pytest.raises(ClusterFileError) as err:
        load_cluster_file(file)
    assert err.value.source == str(file) and len(err.value.problems) == 2
    assert all(p in str(err.value) for p in (str(file), *err.value.problems))


@pytest.mark.parametrize(("text", "problem"), [
    pytest.param("nodes: [unclosed", "not valid YAML", id="bad-yaml"),
    pytest.param(None, "cannot read", id="missing-file"),
])
def test_unreadable_files_raise_the_same_error(tmp_path: Path, text: str | None,
                                               problem: str) -> None:
    file = tmp_path / "c.yaml"
    if text is not None:
        file.write_text(text)
    with pytest.raises(ClusterFileError) as err:
        load_cluster_file(file)
    assert err.value.problems[0].startswith(problem) and err.value.source == str(file)


def test_accepted_file_expands_counts_and_names_gpus_by_one_scheme() -> None:
    cluster = parse_cluster_file(yaml.safe_load(GOOD_FILES[1].values[0]))
    assert cluster == ClusterFile(
        nodes=(
            SimNode("a", (
                SimGpu(0, "GPU-sim-a-0", "NVIDIA-H100-80GB-HBM3", 81559),
                SimGpu(1, "GPU-sim-a-1", "NVIDIA-H100-80GB-HBM3", 81559),
                SimGpu(2, "GPU-fixed", "NVIDIA-A100-SXM4-40GB", 40960),
                SimGpu(7, "GPU-sim-a-7", "NVIDIA GeForce RTX 2080", 8192),
            )),
            SimNode("b", tuple(SimGpu(i, sim_gpu_uuid("b", i), "P", 1) for i in range(64))),
            SimNode("cpu", ()),
        ),
        pods=(SimPod("p", "default", "uid-p", "a", (0, 7), 30.0, 512.0, "training", ()),),
    )


def test_node_lookup_lists_the_nodes() -> None:
    cluster = parse_cluster_file(yaml.safe_load(f"nodes: [{GOOD_NODE}]"), "c.yaml")
    with pytest.raises(ClusterFileError) as err:
        cluster.node("m")
    assert err.value.problems == ("nodes: no node 'm' (nodes: n)",)
    assert err.value.source == "c.yaml"


def test_builtin_clusters_obey_the_file_rules() -> None:
    with pytest.raises(ClusterFileError):
        uniform_cluster(1, MAX_GPUS_PER_ENTRY + 1, "P", 8192)
    node = uniform_cluster(1, 2, "P", 8192)[0]
    assert [g.uuid for g in node.gpus] == [sim_gpu_uuid("gpu-node-1", i) for i in (0, 1)]


def _read_by_every_reader(file: Path) -> dict[str, object]:
    """What the extender, the simulator and the agent (per node) make of one file."""
    out: dict[str, object] = {}
    readers = {
        "extender": lambda: SimSource.from_file(file).nodes,
        "simulator": lambda: load_cluster(f"sim:{file}"),
    }
    for name, read in readers.items():
        try:
            out[name] = [(n.name, [(g.index, g.uuid, g.product, g.memory_mib) for g in n.gpus])
                         for n in read()]
        except ClusterFileError:
            out[name] = "rejected"
    raw = yaml.safe_load(file.read_text())
    nodes = raw.get("nodes") if isinstance(raw, dict) else None
    # Each node of the file in turn; a file with no readable node name asks for "n".
    names = [n.get("name") for n in nodes if isinstance(n, dict)] \
        if isinstance(nodes, list) else []
    names = names or ["n"]
    try:
        out["agent"] = [(n, [(g.index, g.uuid, g.product, g.memory_mib)
                             for g in load_sim_gpus(file, str(n))]) for n in names]
    except ConfigError:
        out["agent"] = "rejected"
    return out


@pytest.mark.parametrize(("text", "accepted"), [
    *[pytest.param(p.values[0], True, id=p.id) for p in GOOD_FILES],
    *[pytest.param(p.values[0], False, id=p.id) for p in BAD_FILES],
])
def test_extender_agent_and_simulator_accept_the_same_files_and_gpus(
        tmp_path: Path, text: str, accepted: bool) -> None:
    file = tmp_path / "cluster.yaml"
    file.write_text(text)
    seen = _read_by_every_reader(file)
    expected = seen["extender"] if accepted else "rejected"
    assert (expected != "rejected") == accepted
    assert seen == {"extender": expected, "simulator": expected, "agent": expected}
