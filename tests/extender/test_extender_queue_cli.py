"""``tandem extender queue-gate`` and the gate inside ``serve``, through the commands'
own wiring, against a fake CoreV1Api that applies the release patches (no cluster)."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from queue_gate_fakes import NOW, FakeCoreV1, pod
from typer.testing import CliRunner

from extender import commands
from extender.queue import gate as gate_module
from extender.queue.gate import GATE_NAME, RELEASED_ANNOTATION, GateController

REPO = Path(__file__).resolve().parents[2]


class ApplyingCoreV1(FakeCoreV1):
    """Applies each release patch to its pod, so later rounds see the pods in flight."""

    on_list: Callable[[int], None] | None = None

    def _list(self, namespace: str | None, kwargs: Any) -> Any:
        if self.on_list is not None:
            self.on_list(len(self.lists))
        return super()._list(namespace, kwargs)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> None:
        super().patch_namespaced_pod(name, namespace, body, **kwargs)
        target = next(p for p in self.pods if p["metadata"]["name"] == name)
        target["spec"]["schedulingGates"] = [
            g for g in target["spec"]["schedulingGates"] if g["name"] != GATE_NAME]
        target["metadata"].setdefault("annotations", {})[RELEASED_ANNOTATION] = "now"


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[ApplyingCoreV1]:
    """The command's ``controller_from_kube`` builds its controller on this fake."""
    api = ApplyingCoreV1([])

    def from_kube(config: Any = None, demand_fn: Any = None) -> GateController:
        return GateController(api, config, clock=lambda: NOW, demand_fn=demand_fn)

    monkeypatch.setattr(gate_module, "controller_from_kube", from_kube)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield api
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture
def config_file(tmp_path: Path) -> Callable[[str], Path]:
    def write(text: str) -> Path:
        path = tmp_path / "tandem.yaml"
        path.write_text(text)
        return path

    return write


def heavy(name: str, age_s: float) -> dict[str, Any]:
    return pod(name, age_s=age_s, util=95, mem=7000)


def light(name: str, age_s: float) -> dict[str, Any]:
    return pod(name, age_s=age_s, util=5, mem=100)


def run_gate(*args: str) -> Any:
    """The command, with /metrics off unless a test asks for it (tests run in parallel)."""
    port = [] if "--metrics-port" in args else ["--metrics-port", "0"]
    return CliRunner().invoke(commands.app, ["queue-gate", *port, *args])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_once_releases_in_weighted_fair_order_not_fifo(fake_api: ApplyingCoreV1,
                                                        config_file: Callable[[str], Path]) -> None:
    # Heavy class: 6 pods, median wait 102.5 s -> w = 615; light class: 2 pods,
    # median wait 300.5 s -> w = 601. Three slots: 3*615/1216 = 1.52 and 1.48, so
    # the larger remainder gives heavy 2 and light 1. FIFO would take both light
    # pods and one heavy pod.
    fake_api.pods = [heavy(f"h{i}", 100 + i) for i in range(6)] + [light("l0", 300),
                                                                    light("l1", 301)]
    cfg = config_file("queue: {k: 2, beta: 3}\npredictor: {enabled: false}\n")
    result = run_gate("--config", str(cfg), "--once")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["released"] == ["ml/l1", "ml/h5", "ml/h4"]
    assert [c[1] for c in report["classes"]] == [2, 6]  # light class first (smaller centroid)
    assert [c[3] for c in report["classes"]] == [601.0, 615.0]
    assert [p[0] for p in fake_api.patches] == ["l1", "h5", "h4"]


def test_starving_pod_is_released_first_through_the_command(
        fake_api: ApplyingCoreV1, config_file: Callable[[str], Path]) -> None:
    fake_api.pods = [heavy(f"h{i}", 10 + i) for i in range(8)] + [light("old", 700)]
    cfg = config_file("queue: {k: 2, beta: 1, starvation_seconds: 600}\n"
                      "predictor: {enabled: false}\n")
    result = run_gate("--config", str(cfg), "--once")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["released"] == ["ml/old"]


def test_flags_override_the_config_file(fake_api: ApplyingCoreV1,
                                        config_file: Callable[[str], Path]) -> None:
    fake_api.pods = [heavy(f"h{i}", 10 + i) for i in range(5)]
    cfg = config_file("queue: {k: 3, beta: 15}\npredictor: {enabled: false}\n")
    result = run_gate("--config", str(cfg), "--once", "--beta", "2", "--k", "1")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["released"] == ["ml/h4", "ml/h3"]
    assert len(report["classes"]) == 1


def test_run_loop_respects_in_flight_pods_and_stops_on_sigterm(
        fake_api: ApplyingCoreV1, config_file: Callable[[str], Path]) -> None:
    fake_api.pods = [heavy(f"h{i}", 10 + i) for i in range(5)]

    def on_list(calls_before: int) -> None:
        if calls_before == 2:  # third round: ask to stop, like the kubelet would
            signal.raise_signal(signal.SIGTERM)
        assert calls_before <= 2, "the loop kept running after SIGTERM"

    fake_api.on_list = on_list
    cfg = config_file("queue: {k: 1, beta: 2}\npredictor: {enabled: false}\n")
    result = run_gate("--config", str(cfg), "--interval-seconds", "0.01")
    assert result.exit_code == 0, result.output
    # Round 1 releases two; rounds 2 and 3 see them unbound (in flight) and wait.
    assert [p[0] for p in fake_api.patches] == ["h4", "h3"]
    assert len(fake_api.lists) == 3


def test_run_loop_serves_queue_metrics(fake_api: ApplyingCoreV1,
                                       config_file: Callable[[str], Path]) -> None:
    import urllib.request

    fake_api.pods = [heavy(f"h{i}", 10 + i) for i in range(3)]
    port = free_port()
    scraped: list[str] = []

    def on_list(calls_before: int) -> None:
        if calls_before == 1:  # round 2 begins: round 1 has been observed
            url = f"http://127.0.0.1:{port}/metrics"
            scraped.append(urllib.request.urlopen(url, timeout=5).read().decode())
            signal.raise_signal(signal.SIGTERM)

    fake_api.on_list = on_list
    cfg = config_file("queue: {k: 1, beta: 2}\npredictor: {enabled: false}\n")
    result = run_gate("--config", str(cfg), "--interval-seconds", "0.01",
                      "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
    assert result.exit_code == 0, result.output
    (text,) = scraped
    assert "tandem_queue_released_pods_total 2.0" in text
    assert "tandem_queue_gated_pods 3.0" in text
    assert 'tandem_queue_rounds_total{outcome="ok"} 1.0' in text
    # The server is gone with the command.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_metrics_port_in_use_exits_2(fake_api: ApplyingCoreV1,
                                     config_file: Callable[[str], Path]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_gate("--config", str(config_file("predictor: {enabled: false}\n")),
                          "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
    assert result.exit_code == 2
    assert f"cannot serve /metrics on 127.0.0.1:{port}" in result.output
    assert fake_api.lists == []


@pytest.mark.parametrize(("args", "message"), [
    (["--beta", "0"], "beta"),
    (["--interval-seconds", "0"], "interval_seconds"),
    (["--leadership", "elect"], "needs POD_NAME"),
    (["--leadership", "nobody"], "--leadership must be one of"),
], ids=["beta-zero", "interval-zero", "elect-without-pod-identity", "unknown-mode"])
def test_bad_flags_exit_2_with_a_clear_error(fake_api: ApplyingCoreV1, args: list[str],
                                             message: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.delenv("POD_NAME", raising=False)
    result = run_gate(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert fake_api.lists == []


def test_invalid_queue_section_exits_2(fake_api: ApplyingCoreV1,
                                       config_file: Callable[[str], Path]) -> None:
    result = run_gate("--config", str(config_file("queue: {k: 0}\n")), "--once")
    assert result.exit_code == 2
    assert "queue.k: must be in 1..64" in result.output


def test_standby_never_releases(fake_api: ApplyingCoreV1, config_file: Callable[[str], Path],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake_api.pods = [heavy("h0", 10)]
    checks: list[int] = []

    class Standby:
        def is_leader(self) -> bool:
            checks.append(1)
            if len(checks) == 3:
                signal.raise_signal(signal.SIGTERM)
            return False

    import extender.ha.lifecycle

    monkeypatch.setattr(extender.ha.lifecycle, "setup_leadership", lambda *_: (Standby(), None))
    cfg = config_file("queue: {k: 1, beta: 2}\npredictor: {enabled: false}\n")
    result = run_gate("--config", str(cfg), "--interval-seconds", "0.01")
    assert result.exit_code == 0, result.output
    assert len(checks) == 3
    assert fake_api.lists == [] and fake_api.patches == []


def test_serve_runs_the_gate_in_process_and_stops_it(
        fake_api: ApplyingCoreV1, config_file: Callable[[str], Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import extender.transport.server
    import extender.wiring
    from extender.cluster.sim import SimSource

    fake_api.pods = [heavy("h0", 10), heavy("h1", 20)]
    released = threading.Event()
    fake_api.on_list = lambda calls: released.set() if fake_api.patches else None

    class Server:
        shutdown_timeout = 0.0

        def prepare(self) -> None:
            pass  # binds nothing

        def serve(self) -> None:
            released.wait(10)  # "serve" until the gate thread released and listed again

        def stop(self) -> None:
            pass

    apps: list[Any] = []
    monkeypatch.setattr(extender.transport.server, "make_server",
                        lambda app, *_: apps.append(app) or Server())
    monkeypatch.setattr(extender.wiring, "build_source",
                        lambda _spec: SimSource.from_file(REPO / "extender/demo_cluster.yaml"))
    cfg = config_file("queue: {enabled: true, k: 1, beta: 1, interval_seconds: 0.1}\n"
                      "predictor: {enabled: false}\n")
    result = CliRunner().invoke(commands.app, ["serve", "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    assert released.is_set()
    assert [p[0] for p in fake_api.patches] == ["h1"]  # beta 1: the older pod, once
    # The gate's metrics are on the extender's own /metrics.
    text = apps[0].test_client().get("/metrics").get_data(as_text=True)
    assert "tandem_queue_released_pods_total 1.0" in text
    assert "tandem_extender_state_synced" in text


def test_serve_refuses_the_gate_on_a_simulated_cluster(
        fake_api: ApplyingCoreV1, config_file: Callable[[str], Path]) -> None:
    cfg = config_file("queue: {enabled: true}\npredictor: {enabled: false}\n")
    result = CliRunner().invoke(commands.app, [
        "serve", "--config", str(cfg), "--cluster", f"sim:{REPO / 'extender/demo_cluster.yaml'}"])
    assert result.exit_code == 2
    assert "queue.enabled needs --cluster kube" in result.output
