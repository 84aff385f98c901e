"""The per-GPU server supervisor: start, restart with backoff, stop with SIGTERM then SIGKILL.

A fake launcher and a fake clock drive the state machine; one short smoke test
starts a real child process.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from agent.errors import ConfigError
from agent.node.attribution import ProcAttributor
from agent.node.extender_view import PlacedJobs, ViewHolder
from agent.node.main import build_agent, run_forever
from agent.node.runner import Agent, AgentConfig
from agent.node.sim_gpus import SimGpuSource, load_sim_gpus
from agent.node.supervisor import ServerSupervisor, SupervisorConfig, popen_launcher

PREFIX = ("tandem",)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeProcess:
    pid: int
    argv: tuple[str, ...]
    env: dict[str, str]
    code: int | None = None
    signals: list[int] = field(default_factory=list)
    exits_on_term: bool = True

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGTERM and self.exits_on_term:
            self.code = 0

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.code = -9


class Launcher:
    def __init__(self, exits_on_term: bool = True, fail: bool = False) -> None:
        self.started: list[FakeProcess] = []
        self.exits_on_term = exits_on_term
        self.fail = fail

    def __call__(self, argv: Sequence[str], env: Mapping[str, str]) -> FakeProcess:
        if self.fail:
            raise FileNotFoundError("tandem")
        proc = FakeProcess(1000 + len(self.started), tuple(argv), dict(env),
                           exits_on_term=self.exits_on_term)
        self.started.append(proc)
        return proc

    def of(self, gpu: int) -> list[FakeProcess]:
        return [p for p in self.started if f"--gpu={gpu}" in p.argv]


def make(launcher: Launcher, clock: Clock, **config: object) -> ServerSupervisor:
    cfg = SupervisorConfig(command_prefix=PREFIX, **config)  # type: ignore[arg-type]
    return ServerSupervisor(cfg, launcher=launcher, monotonic=clock, sleep=clock.sleep,
                            environ={"PATH": "/bin"})


def test_one_server_per_gpu_on_its_port() -> None:
    launcher, clock = Launcher(), Clock()
    sup = make(launcher, clock, host="0.0.0.0", serve_args=("--executor=onnxruntime",))
    sup.ensure([0, 1, 2])
    sup.poll()
    argvs = sorted(p.argv for p in launcher.started)
    assert argvs == [
        ("tandem", "agent", "serve", f"--gpu={i}", f"--port={8700 + i}", "--host=0.0.0.0",
         "--executor=onnxruntime") for i in range(3)]
    assert all(p.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for p in launcher.started)
    assert [s.state for s in sup.status()] == ["running"] * 3
    sup.ensure([0, 1, 2])  # idempotent: the agent calls it every interval
    sup.poll()
    assert len(launcher.started) == 3


# Each row: how long the child ran before each crash -> restart delays expected.
@pytest.mark.parametrize(("runs", "delays"), [
    pytest.param([0.1, 0.1, 0.1, 0.1], [1.0, 2.0, 4.0, 8.0], id="crash-loop-doubles"),
    pytest.param([0.1] * 9, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0],
                 id="capped-at-max"),
    pytest.param([0.1, 0.1, 45.0, 0.1], [1.0, 2.0, 1.0, 2.0], id="stable-run-resets"),
])
def test_restart_backoff(runs: list[float], delays: list[float]) -> None:
    launcher, clock = Launcher(), Clock()
    sup = make(launcher, clock)
    sup.ensure([0])
    sup.poll()
    for ran, delay in zip(runs, delays, strict=True):
        clock.now += ran
        launcher.started[-1].code = 1
        sup.poll()
        (status,) = sup.status()
        assert status.state == "backoff" and status.last_exit_code == 1
        assert status.next_start_in_seconds == pytest.approx(delay)
        clock.now += delay - 0.01
        sup.poll()
        assert sup.status()[0].state == "backoff", "restarted too early"
        clock.now += 0.01
        sup.poll()
        assert sup.status()[0].state == "running"
    assert len(launcher.started) == len(runs) + 1


def test_a_crash_on_one_gpu_leaves_the_others_alone() -> None:
    launcher, clock = Launcher(), Clock()
    sup = make(launcher, clock)
    sup.ensure([0, 1])
    sup.poll()
    launcher.of(1)[0].code = 3
    sup.poll()  # reaped; restart due after the initial delay
    clock.now += 1.0
    sup.poll()
    assert len(launcher.of(0)) == 1 and len(launcher.of(1)) == 2


def test_launch_failure_is_retried_with_backoff() -> None:
    launcher, clock = Launcher(fail=True), Clock()
    sup = make(launcher, clock)
    sup.ensure([0])
    sup.poll()
    (status,) = sup.status()
    assert status.state == "backoff" and status.last_exit_code == -1 and status.starts == 0
    launcher.fail = False
    clock.now += 1.0
    sup.poll()
    assert sup.status()[0].state == "running"


@pytest.mark.parametrize(("exits_on_term", "signals", "code"), [
    pytest.param(True, [signal.SIGTERM], 0, id="graceful"),
    pytest.param(False, [signal.SIGTERM, signal.SIGKILL], -9, id="killed-after-grace"),
])
def test_stop_propagates_sigterm_then_kills(exits_on_term: bool, signals: list[int],
                                            code: int) -> None:
    launcher, clock = Launcher(exits_on_term=exits_on_term), Clock()
    sup = make(launcher, clock, stop_grace_seconds=5.0)
    sup.ensure([0, 1])
    sup.poll()
    start = clock.now
    assert sup.stop_children() == {0: code, 1: code}
    assert all(p.signals == signals for p in launcher.started)
    waited = clock.now - start
    assert (waited >= 5.0) is (not exits_on_term)  # one shared grace period, not one per GPU
    assert waited < 8.0
    sup.ensure([2])
    sup.poll()
    assert len(launcher.started) == 2, "nothing starts or restarts after stop"
    assert {s.state for s in sup.status()} == {"stopped"}


def test_already_exited_children_are_not_signalled() -> None:
    launcher, clock = Launcher(), Clock()
    sup = make(launcher, clock)
    sup.ensure([0])
    sup.poll()
    launcher.started[0].code = 2
    assert sup.stop_children() == {}
    assert launcher.started[0].signals == []


@pytest.mark.parametrize("kwargs", [
    pytest.param({"base_port": 0}, id="port"),
    pytest.param({"initial_backoff_seconds": 0.0}, id="backoff"),
    pytest.param({"initial_backoff_seconds": 5.0, "max_backoff_seconds": 1.0}, id="max-below"),
    pytest.param({"serve_args": ("--port=9000",)}, id="serve-arg-sets-port"),
    pytest.param({"serve_args": ("--gpu", "3")}, id="serve-arg-sets-gpu"),
    pytest.param({"command_prefix": ()}, id="empty-command"),
])
def test_invalid_config(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        SupervisorConfig(**{"command_prefix": PREFIX, **kwargs})


def test_run_loop_polls_until_stopped() -> None:
    launcher, clock = Launcher(), Clock()
    sup = make(launcher, clock)
    sup.ensure([0])
    stop = threading.Event()
    thread = threading.Thread(target=sup.run, args=(stop, 0.01))
    thread.start()
    for _ in range(500):
        if launcher.started:
            break
        threading.Event().wait(0.01)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive() and len(launcher.started) == 1


def test_smoke_real_child_gets_sigterm() -> None:
    """A real process that exits 0 on SIGTERM, as ``tandem agent serve`` does."""
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
             "time.sleep(30)\n")
    cfg = SupervisorConfig(command_prefix=(sys.executable, "-c", child), stop_grace_seconds=10.0)
    sup = ServerSupervisor(cfg, launcher=popen_launcher)
    sup.ensure([0])
    sup.poll()
    (status,) = sup.status()
    assert status.state == "running" and status.pid
    # 0 once its handler is installed; -SIGTERM if the signal came before that.
    assert sup.stop_children()[0] in (0, -signal.SIGTERM)


# ---- wiring into the agent (``tandem agent run --serve-gpus``) ----------------------------

DATA = Path(__file__).parents[1] / "data" / "agent"
NODE = "gpu-node-1"


def sim_agent(servers: ServerSupervisor | None) -> Agent:
    source = SimGpuSource(load_sim_gpus(DATA / "sim_cluster.yaml", NODE),
                          PlacedJobs(ViewHolder()), seed=1, wall_clock=lambda: 100.0)
    return Agent(AgentConfig(NODE), source, registry=CollectorRegistry(),
                 attributor=ProcAttributor(DATA / "proc"), servers=servers)


def test_each_agent_step_supervises_the_sampled_gpus() -> None:
    launcher, clock = Launcher(), Clock()
    sup = make(launcher, clock)
    agent = sim_agent(sup)
    agent.step()
    gpus = len(load_sim_gpus(DATA / "sim_cluster.yaml", NODE))
    assert [s.gpu_index for s in sup.status()] == list(range(gpus))
    assert {s.state for s in sup.status()} == {"pending"}


def test_build_agent_supervises_only_when_asked() -> None:
    settings = {"node": NODE, "gpus": f"sim:{DATA / 'sim_cluster.yaml'}", "extender": None,
                "interval_seconds": 1.0, "token_file": None, "proc_root": DATA / "proc",
                "session_host": "127.0.0.1", "session_base_port": 8700, "sessions": True,
                "seed": 0}
    plain, _ = build_agent(**settings)
    assert plain.servers is None
    served, _ = build_agent(**settings, serve=SupervisorConfig(command_prefix=PREFIX))
    assert served.servers is not None and served.servers.config.base_port == 8700


def test_run_forever_starts_servers_and_passes_sigterm_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("agent.node.main.setup_logging", lambda **_: None)
    launcher = Launcher()
    sup = ServerSupervisor(SupervisorConfig(command_prefix=PREFIX), launcher=launcher,
                           environ={})
    agent = sim_agent(sup)
    gpus = len(load_sim_gpus(DATA / "sim_cluster.yaml", NODE))
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(agent, "127.0.0.1", 0, stop))
    thread.start()
    try:
        for _ in range(500):
            if len(launcher.started) == gpus:
                break
            threading.Event().wait(0.01)
        assert len(launcher.started) == gpus
    finally:
        stop.set()  # what the SIGTERM handler does
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert all(p.signals == [signal.SIGTERM] and p.code == 0 for p in launcher.started)


def test_cli_run_rejects_serve_args_that_the_supervisor_owns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent.commands import app

    monkeypatch.setenv("NODE_NAME", NODE)
    result = CliRunner().invoke(app, ["run", "--gpus", f"sim:{DATA / 'sim_cluster.yaml'}",
                                      "--serve-gpus", "--serve-arg=--port=1"])
    assert result.exit_code == 2 and "--port" in result.output


def test_daemonset_supervises_servers_on_the_ports_sessions_use() -> None:
    import yaml

    path = Path(__file__).resolve().parents[2] / "manifests/base/agent-daemonset.yaml"
    (ds,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    args = agent["args"]
    assert "--serve-gpus" in args and "--serve-host=0.0.0.0" in args
    serve_args = tuple(a.split("=", 1)[1] for a in args if a.startswith("--serve-arg="))
    config = SupervisorConfig(host="0.0.0.0", serve_args=serve_args, command_prefix=PREFIX)
    published = {p["containerPort"]: p.get("hostPort") for p in agent["ports"]}
    for gpu in range(8):
        port = int(config.argv(gpu)[4].removeprefix("--port="))
        assert published[port] == port == 8700 + gpu
    assert "--executor=onnxruntime" in serve_args
    store = next(a for a in serve_args if a.startswith("--model-store="))
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert store.split("=", 1)[1] in mounts
