"""``tandem status`` against the real extender on loopback over a simulated cluster."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import httpx
import pytest
import yaml
from extender_builders import PROFILES, TOKEN, args, binding, inference, node, training
from typer.testing import CliRunner

from contracts.annotations import GPU_UTIL, MODEL, PREDICTION_SOURCE
from contracts.state import StateDocument
from extender.cluster.sim import SimSource
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.ops.coexist import doubly_advertised
from extender.ops.status import pending_pods, pod_source, summarize
from extender.ops.status_render import render
from extender.transport.server import start_background
from extender.wiring import create_app, default_planner
from tandem.cli import app

runner = CliRunner()
GPU_KEYS = {"index", "uuid", "product", "role", "memory_mib", "reserved_mib", "predicted_util",
            "predicted_source", "observed_util", "observed_mib", "observed_source", "pods"}


@pytest.fixture(scope="module")
def extender_url() -> Iterator[str]:
    cfg = build_config({"server": {"host": "127.0.0.1", "threads": 2}})
    source = SimSource([node("a100-node-with-a-long-name-1", 1), node("n2", 1), node("n3", 1)])
    flask_app = create_app(ConfigHolder(cfg), source, profiles=PROFILES,
                           planner=default_planner(), environ={"TANDEM_AGENT_TOKEN": TOKEN})
    running = start_background(flask_app, cfg.server, port=0)
    try:
        _place_and_report(source, running.url)
        yield running.url
    finally:
        running.stop()  # cheroot's workers would otherwise keep the test process alive


def _place_and_report(source: SimSource, url: str) -> None:
    # Enough pods on one GPU that the pod list must fold over several lines.
    pods = [training(f"train-job-with-a-long-name-{i}", util=10, mem=2000) for i in range(5)]
    pods.append(inference("serve-resnet50"))
    for p in pods:
        source.create_pod(p)
        target = "n2" if p is pods[-1] else "a100-node-with-a-long-name-1"
        filtered = httpx.post(f"{url}/filter", json=args(p, [target])).json()
        assert filtered["NodeNames"] == [target], filtered
        assert httpx.post(f"{url}/bind", json=binding(p, target)).json() == {"Error": ""}
    report = {"node": "n2", "timestamp": 1.0, "interval_seconds": 1.0,
              "gpus": [{"index": 0, "uuid": "GPU-real-0", "product": "NVIDIA-A100-SXM4-40GB",
                        "memory_total_mib": 40960, "memory_used_mib": 3000,
                        "utilization_percent": 41.0, "processes": []}]}
    r = httpx.post(f"{url}/v1/agents/report", json=report,
                   headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text


def test_text_fits_80_columns_and_shows_roles_pods_and_sources(extender_url: str) -> None:
    result = runner.invoke(app, ["status", "--extender", extender_url],
                           env={"TANDEM_AGENT_TOKEN": TOKEN})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, [ln for ln in lines if len(ln) > 80]
    text = result.output
    assert "node a100-node-with-a-long-name-1 (1 GPU)" in text
    assert "training" in text and "serving" in text and "idle" in text
    for i in range(5):  # every pod of the folded list is shown
        assert f"default/train-job-with-a-long-name-{i} 10% 2000 MiB [asserted]" in \
            " ".join(ln.strip() for ln in lines)
    assert "41% (agent)" in text and "- (no fresh report)" in text
    assert "[profile]" in text  # the session's figures came from its batching profile
    assert "pending pods: use --cluster kube" in text


def test_json_has_the_documented_keys(extender_url: str) -> None:
    result = runner.invoke(app, ["status", "--extender", extender_url, "--json"],
                           env={"TANDEM_AGENT_TOKEN": TOKEN})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc) == {"source", "synced", "placed", "assumed", "untrusted", "nodes",
                        "pending", "redacted", "both_plugins"}
    assert doc["redacted"] is False and doc["untrusted"] == 0
    assert doc["synced"] is True and doc["placed"] == 6 and doc["pending"] is None
    assert doc["both_plugins"] is None  # needs --cluster kube
    by_node = {n["name"]: n for n in doc["nodes"]}
    (busy,) = by_node["a100-node-with-a-long-name-1"]["gpus"]
    (idle,) = by_node["n3"]["gpus"]
    assert all(set(g) == GPU_KEYS for n in doc["nodes"] for g in n["gpus"])
    assert (busy["role"], idle["role"]) == ("training", "idle")
    assert busy["reserved_mib"] == 10000 and busy["predicted_util"] == pytest.approx(50)
    assert busy["predicted_source"] == ["asserted"] and len(busy["pods"]) == 5
    serving = by_node["n2"]["gpus"][0]
    assert serving["role"] == "serving" and serving["observed_util"] == 41.0
    assert serving["observed_source"] == "agent report"
    assert serving["predicted_source"] == ["profile"]  # tandem.io/prediction-source


def test_without_the_agent_token_pod_names_are_hidden_and_figures_shown(
        extender_url: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", "--extender", extender_url, "--json"],
                           env={"TANDEM_AGENT_TOKEN": ""})
    doc = json.loads(result.output)
    pods = [p for n in doc["nodes"] for g in n["gpus"] for p in g["pods"]]
    assert doc["redacted"] is True and len(pods) == 6
    assert {p["pod"] for p in pods} == {"(hidden)"}
    assert sum(p["mem_mib"] for p in pods) > 10000  # the figures are still there
    text = runner.invoke(app, ["status", "--extender", extender_url],
                         env={"TANDEM_AGENT_TOKEN": ""}).output
    assert "train-job" not in text and "pass --token-file" in text
    wrong = tmp_path / "token"
    wrong.write_text("not-the-token\n")
    result = runner.invoke(app, ["status", "--extender", extender_url, "--json",
                                 "--token-file", str(wrong)])
    assert json.loads(result.output)["redacted"] is True
    wrong.write_text(TOKEN + "\n")  # a Secret mounted with a trailing newline still works
    result = runner.invoke(app, ["status", "--extender", extender_url, "--json",
                                 "--token-file", str(wrong)])
    assert json.loads(result.output)["redacted"] is False


def test_sim_file_rebuilds_the_state_from_its_bound_pods(tmp_path: Path) -> None:
    file = tmp_path / "cluster.yaml"
    file.write_text(yaml.safe_dump({
        "nodes": [{"name": "g1", "gpus": [{"product": "NVIDIA-H100-80GB-HBM3",
                                          "memory_mib": 81559, "count": 2}]}],
        "pods": [{"name": "p1", "namespace": "ml", "uid": "u1", "node": "g1",
                  "gpu_index": [1], "util_percent": 30, "mem_mib": 8000,
                  "workload": "training"}]}))
    result = runner.invoke(app, ["status", "--cluster", f"sim:{file}", "--json"])
    assert result.exit_code == 0, result.output
    gpus = json.loads(result.output)["nodes"][0]["gpus"]
    assert [g["role"] for g in gpus] == ["idle", "training"]
    assert gpus[1]["pods"][0]["pod"] == "ml/p1" and gpus[1]["reserved_mib"] == 8000
    assert gpus[1]["observed_source"].startswith("none: agents report to the extender")


@pytest.mark.parametrize(("argv", "needle", "code"), [
    ([], "--extender URL", 2),                       # the command line is wrong
    (["--extender", "http://127.0.0.1:9"], "port-forward", 1),  # it could not read
    (["--cluster", "sim:/nonexistent.yaml"], "/nonexistent.yaml", 2),
    (["--cluster", "nowhere"], "--cluster must be", 2),
])
def test_bad_sources_print_one_line(argv: list[str], needle: str, code: int) -> None:
    result = runner.invoke(app, ["status", *argv])
    assert result.exit_code == code
    assert len(result.output.strip().splitlines()) == 1 and needle in result.output


def _kube_pod(name: str, uid: str, gates: list[str] | None = None) -> Any:
    return NS(metadata=NS(name=name, namespace="default", uid=uid),
              spec=NS(scheduling_gates=[NS(name=g) for g in gates or []]),
              status=NS(phase="Pending"))


class FakeApi:
    """list_pod/list_event with the field selectors tandem status uses."""

    def __init__(self) -> None:
        self.selectors: list[str] = []

    def list_pod_for_all_namespaces(self, field_selector: str) -> Any:
        self.selectors.append(field_selector)
        return NS(items=[_kube_pod("big", "u1"), _kube_pod("gated", "u2", ["tandem.io/queue"]),
                         _kube_pod("new", "u3")])

    def list_event_for_all_namespaces(self, field_selector: str) -> Any:
        self.selectors.append(field_selector)
        t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

        def ev(minutes: int, message: str) -> Any:
            return NS(involved_object=NS(uid="u1"), message=message, event_time=None,
                      first_timestamp=None, last_timestamp=t0 + dt.timedelta(minutes=minutes))
        return NS(items=[ev(2, "0/3 nodes are available: 3 GpuMemoryTooSmall."), ev(1, "old")])


def test_pending_pods_carry_their_last_failed_scheduling_reason() -> None:
    api = FakeApi()
    now = dt.datetime(2026, 1, 1, 0, 5, tzinfo=dt.UTC).timestamp()
    pending = pending_pods(api, "tandem", now=lambda: now)
    assert api.selectors == ["spec.schedulerName=tandem,spec.nodeName=",
                             "reason=FailedScheduling"]
    assert pending == [
        {"pod": "default/big", "reason": "0/3 nodes are available: 3 GpuMemoryTooSmall.",
         "age_s": 180},
        {"pod": "default/gated", "reason": "held by the queue's scheduling gate "
                                           "(tandem.io/queue)", "age_s": None},
        {"pod": "default/new", "reason": "not tried yet", "age_s": None}]


def test_pod_source_is_the_recorded_prediction_source_else_derived() -> None:
    """bind's tandem.io/prediction-source wins; pods bound without it are described."""
    assert pod_source({PREDICTION_SOURCE: "observed:12+mem:fitted", MODEL: "m.onnx"}) == \
        "observed:12+mem:fitted"
    assert pod_source({PREDICTION_SOURCE: "cold-start+mem:no-overhead"}) == \
        "cold-start+mem:no-overhead"
    assert pod_source({GPU_UTIL: "30"}) == "asserted"
    assert pod_source({MODEL: "m.onnx"}) == "model m.onnx"
    assert pod_source({}) == "unknown"


def _node(name: str, allocatable: dict[str, str] | None) -> Any:
    return NS(metadata=NS(name=name), status=NS(allocatable=allocatable))


class NodesApi:
    def list_node(self) -> Any:
        return NS(items=[
            _node("mixed-2", {"cpu": "64", "nvidia.com/gpu": "8", "tandem.io/gpu": "64"}),
            _node("mixed-1", {"nvidia.com/gpu": "4", "tandem.io/gpu": "32"}),
            _node("tandem-only", {"nvidia.com/gpu": "0", "tandem.io/gpu": "64"}),
            _node("nvidia-only", {"nvidia.com/gpu": "8"}),
            _node("cpu", {"cpu": "16"}),
            _node("new", None)])


def test_nodes_where_both_device_plugins_advertise_gpus_are_named() -> None:
    both = doubly_advertised(NodesApi())
    assert both == [{"node": "mixed-1", "nvidia.com/gpu": 4, "tandem.io/gpu": 32},
                    {"node": "mixed-2", "nvidia.com/gpu": 8, "tandem.io/gpu": 64}]
    doc = summarize(StateDocument(), "kube", [], both)
    text = render(doc)
    assert "both device plugins on 2 node(s)" in text
    assert "  mixed-1: nvidia.com/gpu 4, tandem.io/gpu 32" in text.splitlines()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "both device plugins" not in render(summarize(StateDocument(), "kube", [], []))


def test_an_untrusted_certificate_says_to_pass_the_ca(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from extender.cluster.sim import parse_cluster

    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    root = Path(__file__).resolve().parents[2]
    subprocess.run(["sh", str(root / "manifests/tls/generate-certs.sh"), str(tmp_path)],
                   check=True, capture_output=True, timeout=60)
    cfg = build_config({"server": {"host": "127.0.0.1",
                                   "tls_cert_file": str(tmp_path / "tls.crt"),
                                   "tls_key_file": str(tmp_path / "tls.key")}})
    nodes, pods = parse_cluster({"nodes": [{"name": "g1", "gpus": [
        {"product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559, "count": 1}]}]})
    running = start_background(create_app(ConfigHolder(cfg), SimSource(nodes, pods),
                                          environ={}), cfg.server, port=0)
    try:
        result = runner.invoke(app, ["status", "--extender", running.url])
        assert result.exit_code == 1
        assert "--ca-cert" in result.output and "port-forward" not in result.output
        trusted = runner.invoke(app, ["status", "--extender", running.url,
                                      "--ca-cert", str(tmp_path / "ca.crt")])
        assert trusted.exit_code == 0, trusted.output
    finally:
        running.stop()


def test_a_token_file_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", "--extender", "http://127.0.0.1:9",
                                 "--token-file", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "--token-file" in result.output  # a file it names
