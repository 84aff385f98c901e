"""The agent loop end to end: sim and mocked NVML, a fake extender, the CLI's --once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pynvml
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from agent.errors import ConfigError
from agent.node.attribution import ProcAttributor
from agent.node.extender_view import PlacedJobs, StateClient, ViewHolder
from agent.node.main import build_agent
from agent.node.nvml import NvmlGpuSource
from agent.node.reporter import BackoffPolicy, Reporter, TokenSource, build_report
from agent.node.runner import Agent, AgentConfig
from agent.node.sessions import SessionSync
from agent.node.sim_gpus import SimGpuSource, load_sim_gpus, true_load_factor
from extender.state.reports import decode_report
from lab.fakes.nvml import FakeNvml

DATA = Path(__file__).parents[1] / "data" / "agent"
NODE = "gpu-node-1"
TOKEN = "tok-123"
STATE = {"nodes": {NODE: {"gpus": [
    {"index": 0, "uuid": "GPU-sim-gpu-node-1-0", "predicted_util": 50.0, "pods": [
        {"pod": "ml/train", "uid": "uid-train", "state": "placed", "workload": "training",
         "util_percent": 50.0, "mem_mib": 4096.0}]},
    {"index": 1, "uuid": "GPU-sim-gpu-node-1-1", "predicted_util": 20.0, "pods": [
        {"pod": "serving/resnet", "uid": "uid-resnet", "state": "placed",
         "workload": "inference", "util_percent": 20.0, "mem_mib": 1024.0,
         "annotations": {"tandem.io/model": "resnet50.onnx", "tandem.io/slo-ms": "50",
                         "tandem.io/rate-rps": "100"}}]},
]}}}


class FakeExtender:
    """Answers /v1/state and /v1/agents/report; records what it received."""

    def __init__(self, report_status: list[int] | None = None) -> None:
        self.reports: list[dict] = []
        self.auth: list[str | None] = []
        self.statuses = list(report_status or [])

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.auth.append(request.headers.get("Authorization"))
        if request.url.path == "/v1/state":
            return httpx.Response(200, json=STATE)
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            self.reports.append(json.loads(request.content))
        return httpx.Response(status, json={})


def sessions_server(held: set[str]) -> httpx.MockTransport:
    """GPU 1's inference server (port 8701); no other GPU runs one."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.port != 8701:
            raise httpx.ConnectError("refused", request=request)
        if request.method == "GET":
            return httpx.Response(200, json={"sessions": [{"name": n} for n in held]})
        held.add(json.loads(request.content)["name"])
        return httpx.Response(201, json={})
    return httpx.MockTransport(handler)


def sim_agent(extender: FakeExtender, held: set[str] | None = None) -> Agent:
    views = ViewHolder()
    token = TokenSource(environ={"TANDEM_AGENT_TOKEN": TOKEN})
    transport = httpx.MockTransport(extender)
    source = SimGpuSource(load_sim_gpus(DATA / "sim_cluster.yaml", NODE), PlacedJobs(views),
                          seed=3, noise_percent=0.0, wall_clock=lambda: 100.0)
    sync = SessionSync(lambda i: f"http://127.0.0.1:{8700 + i}",
                       transport=sessions_server(held if held is not None else set()))
    return Agent(AgentConfig(NODE), source, registry=CollectorRegistry(),
                 reporter=Reporter("http://ext", token, transport=transport,
                                   backoff=BackoffPolicy(initial_seconds=0.001, max_seconds=0.001),
                                   sleep=lambda s: None),
                 state=StateClient("http://ext", transport=transport), views=views,
                 sessions=sync, token=token)


def test_sim_step_reports_placed_load_and_syncs_sessions() -> None:
    extender, held = FakeExtender(), set()
    agent = sim_agent(extender, held)
    result = agent.step()
    assert result.push_attempts == 1 and result.push_error is None
    report = extender.reports[0]
    assert report["node"] == NODE and report["timestamp"] == 100.0
    g0, g1, g2 = report["gpus"]
    assert g0["utilization_percent"] == round(min(100.0, 50 * true_load_factor("uid-train")), 2)
    assert g0["memory_used_mib"] == 4096
    assert [p["pod_uid"] for p in g0["processes"]] == ["uid-train"]
    assert g1["utilization_percent"] == round(20 * true_load_factor("uid-resnet"), 2)
    assert (g2["utilization_percent"], g2["processes"]) == (0.0, [])
    assert set(extender.auth) == {f"Bearer {TOKEN}"}
    assert held == {"serving.resnet"} and result.sessions.added == ("serving.resnet",)
    ratio = agent.registry.get_sample_value(
        "tandem_gpu_observed_to_predicted_utilization_ratio",
        {"gpu": "0", "UUID": "GPU-sim-gpu-node-1-0", "Hostname": NODE})
    assert ratio == pytest.approx(true_load_factor("uid-train"), abs=1e-3)


def test_reports_are_accepted_by_the_extender_decoder() -> None:
    extender = FakeExtender()
    sim_agent(extender).step()
    decoded = decode_report(extender.reports[0])
    assert decoded.node == NODE and len(decoded.gpus) == 3


def test_extender_down_costs_only_that_report() -> None:
    extender = FakeExtender(report_status=[503] * 5)
    agent = sim_agent(extender)
    first = agent.step()
    assert first.push_error is not None and first.report is not None
    second = agent.step()
    assert second.push_error is None and len(extender.reports) == 1
    assert agent.registry.get_sample_value("tandem_agent_reports_total",
                                           {"outcome": "ExtenderUnavailable"}) == 1.0
    assert agent.registry.get_sample_value("tandem_agent_reports_total",
                                           {"outcome": "ok"}) == 1.0


def test_nvml_driver_down_keeps_the_loop_running_and_pushes_nothing() -> None:
    nvml = FakeNvml.from_json(json.loads((DATA / "nvml_two_gpus.json").read_text()))
    nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    extender = FakeExtender()
    token = TokenSource(environ={"TANDEM_AGENT_TOKEN": TOKEN})
    agent = Agent(AgentConfig(NODE), NvmlGpuSource(nvml, wall_clock=lambda: 10.0),
                  registry=CollectorRegistry(), attributor=ProcAttributor(DATA / "proc"),
                  reporter=Reporter("http://ext", token,
                                    transport=httpx.MockTransport(extender)))
    down = agent.step()
    assert down.report is None and "Driver Not Loaded" in (down.source_error or "")
    assert extender.reports == []
    assert agent.registry.get_sample_value("tandem_agent_gpu_source_up", {"Hostname": NODE}) == 0
    nvml.init_error = None
    up = agent.step()
    assert up.report is not None and len(extender.reports) == 1
    assert agent.registry.get_sample_value("tandem_agent_gpu_source_up", {"Hostname": NODE}) == 1


def test_nvml_processes_are_attributed_from_the_proc_tree() -> None:
    nvml = FakeNvml.from_json(json.loads((DATA / "nvml_two_gpus.json").read_text()))
    agent = Agent(AgentConfig(NODE), NvmlGpuSource(nvml, wall_clock=lambda: 10.0),
                  registry=CollectorRegistry(), attributor=ProcAttributor(DATA / "proc"))
    processes = agent.step().report["gpus"][0]["processes"]
    assert processes == [
        {"pid": 101, "used_memory_mib": 5120, "pod_uid": "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f",
         "container_id": "3f6a1e2b9c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f",
         "utilization_percent": None},
        {"pid": 104, "used_memory_mib": 1024, "pod_uid": None, "container_id": None,
         "utilization_percent": None}]


def test_gpu_never_identified_is_left_out_of_the_report() -> None:
    nvml = FakeNvml.from_json(json.loads((DATA / "nvml_two_gpus.json").read_text()))
    nvml.gpus[0].errors["*"] = pynvml.NVML_ERROR_GPU_IS_LOST
    sample = NvmlGpuSource(nvml, wall_clock=lambda: 10.0).sample(1.0)
    report = build_report(NODE, sample)
    assert [g["index"] for g in report["gpus"]] == [1]
    decode_report(report)


def test_run_stops_when_the_event_is_set() -> None:
    agent = sim_agent(FakeExtender())
    stop = threading.Event()
    ticks = iter(range(1000))
    assert agent.run(stop, monotonic=lambda: float(next(ticks)), max_steps=3) == 3
    stop.set()
    assert agent.run(stop) == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    pytest.param({"node": ""}, "NODE_NAME", id="no-node"),
    pytest.param({"gpus": "fake"}, "nvml", id="bad-gpus"),
    pytest.param({"interval_seconds": 0.0}, "interval", id="bad-interval"),
    pytest.param({"extender": "http://e", "token_file": Path("/nonexistent/token")},
                 "token file", id="missing-token-file"),
    pytest.param({"token_file": Path("/x")}, "without --extender", id="token-without-extender"),
])
def test_build_agent_rejects_bad_settings(kwargs: dict, message: str) -> None:
    settings = {"node": NODE, "gpus": f"sim:{DATA / 'sim_cluster.yaml'}", "extender": None,
                "interval_seconds": 1.0, "token_file": None, "proc_root": DATA / "proc",
                "session_host": "127.0.0.1", "session_base_port": 8700, "sessions": True,
                "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=message):
        build_agent(**settings)


def test_cli_once_json_prints_one_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.commands import app

    monkeypatch.setenv("NODE_NAME", NODE)
    result = CliRunner().invoke(app, ["run", "--gpus", f"sim:{DATA / 'sim_cluster.yaml'}",
                                      "--once", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["node"] == NODE
    assert [g["uuid"] for g in report["gpus"]] == [
        "GPU-sim-gpu-node-1-0", "GPU-sim-gpu-node-1-1", "GPU-fixed-a100"]


def test_cli_bad_gpus_exits_2() -> None:
    from agent.commands import app

    result = CliRunner().invoke(app, ["run", "--gpus", "bogus", "--node", NODE, "--once"])
    assert result.exit_code == 2 and "expected 'nvml' or 'sim:FILE'" in result.output
