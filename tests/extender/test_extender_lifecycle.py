"""``tandem extender serve`` wiring: leadership, ``may_bind``, graceful shutdown (with fakes)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml
from extender_builders import binding, make_app, node, training
from manifests_helpers import MANIFESTS, container, pod_specs, resolve
from typer.testing import CliRunner

from extender import commands
from extender.cluster.sim import SimSource
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.ha.election import LeaseElector, LeaseFollower
from extender.ha.leader import AlwaysLeader
from extender.ha.lifecycle import Draining, GracefulShutdown, LeadershipSetupError, setup_leadership
from extender.transport.server import start_background
from extender.wiring import create_app

ENV = {"POD_NAMESPACE": "tandem-system", "POD_NAME": "tandem-scheduler-abc"}


class FakeCoordinationApi:
    """CoordinationV1Api holding one Lease (``holder`` None = no Lease)."""

    def __init__(self, holder: str | None = None) -> None:
        self.holder = holder
        self.writes: list[dict[str, Any]] = []

    def _lease(self) -> SimpleNamespace:
        return SimpleNamespace(
            metadata=SimpleNamespace(resource_version=str(len(self.writes))),
            spec=SimpleNamespace(holder_identity=self.holder, lease_duration_seconds=15,
                                 acquire_time=None, renew_time=None,
                                 lease_transitions=len(self.writes)))

    def read_namespaced_lease(self, name: str, namespace: str, **_: object) -> SimpleNamespace:
        if self.holder is None:
            raise NotFound()
        return self._lease()

    def create_namespaced_lease(self, namespace: str, body: dict, **_: object) -> SimpleNamespace:
        self.writes.append(body)
        self.holder = body["spec"]["holderIdentity"]
        return self._lease()

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict,
                                 **_: object) -> SimpleNamespace:
        return self.create_namespaced_lease(namespace, body)


class NotFound(Exception):
    """Mirrors ApiException(status=404)."""

    status = 404


class FakeCoreApi:
    """CoreV1Api.patch_namespaced_pod recorder."""

    def __init__(self) -> None:
        self.labels: list[str | None] = []

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict) -> None:
        self.labels.append(body["metadata"]["labels"]["tandem.io/leader"])


def clients_for(coordination: FakeCoordinationApi, core: FakeCoreApi):
    calls: list[int] = []

    def clients() -> tuple[Any, Any]:
        calls.append(1)
        return coordination, core
    return clients, calls


@pytest.mark.parametrize(("mode", "kind", "has_loop"), [
    ("single", AlwaysLeader, False),
    ("follow-scheduler", LeaseFollower, True),
    ("elect", LeaseElector, True),
], ids=["single", "follow-scheduler", "elect"])
def test_setup_leadership_builds_each_mode(mode: str, kind: type, has_loop: bool) -> None:
    clients, calls = clients_for(FakeCoordinationApi(), FakeCoreApi())
    leadership, loop = setup_leadership(mode, "tandem-scheduler", environ=ENV,
                                        hostname=lambda: "host-a", clients=clients)
    assert isinstance(leadership, kind)
    assert (loop is not None) is has_loop
    assert len(calls) == (1 if has_loop else 0)  # single never touches a kubeconfig


@pytest.mark.parametrize(("mode", "lease", "environ", "problem"), [
    ("raft", "l", ENV, "must be one of"),
    ("follow-scheduler", "l", {"POD_NAMESPACE": "ns"}, "POD_NAME"),
    ("elect", None, ENV, "--lease-name"),
], ids=["unknown-mode", "no-pod-name", "no-lease-name"])
def test_setup_leadership_rejects_bad_flags(mode: str, lease: str | None,
                                            environ: dict[str, str], problem: str) -> None:
    clients, calls = clients_for(FakeCoordinationApi(), FakeCoreApi())
    with pytest.raises(LeadershipSetupError, match=problem):
        setup_leadership(mode, lease, environ=environ, hostname=lambda: "h", clients=clients)
    assert calls == []


def test_follower_gates_binds_until_our_scheduler_holds_the_lease() -> None:
    coordination, core = FakeCoordinationApi("other-host_1234"), FakeCoreApi()
    clients, _ = clients_for(coordination, core)
    leadership, loop = setup_leadership("follow-scheduler", "tandem-scheduler", environ=ENV,
                                        hostname=lambda: "host-a", clients=clients)
    app, _, source, _ = make_app([node("n1")], may_bind=leadership.is_leader)
    client = app.test_client()
    first, second = training("a"), training("b")
    for p in (first, second):
        source.create_pod(p)
    leadership.step()  # type: ignore[attr-defined]
    refused = client.post("/bind", json=binding(first, "n1")).get_json()
    assert "not the leader" in refused["Error"]
    assert client.get("/v1/state").get_json()["placed"] == 0  # a refused bind changes nothing
    coordination.holder = "host-a_5678"
    leadership.step()  # type: ignore[attr-defined]
    assert client.post("/bind", json=binding(second, "n1")).get_json() == {"Error": ""}
    assert loop is not None


class FakeServer:
    """Records the shutdown order and what /readyz said when stop() began."""

    def __init__(self, events: list[str], client: Any) -> None:
        self.events = events
        self.client = client
        self.shutdown_timeout = 5.0

    def stop(self) -> None:
        self.events.append(f"server.stop(timeout={self.shutdown_timeout:g}, "
                           f"readyz={self.client.get('/readyz').status_code})")


class FakeLoop:
    def __init__(self, events: list[str], client: Any) -> None:
        self.events, self.client = events, client

    def stop(self) -> None:
        self.events.append(f"loop.stop(readyz={self.client.get('/readyz').status_code})")


def test_shutdown_fails_readiness_then_releases_leadership_then_drains() -> None:
    draining = Draining()
    app, *_ = make_app(readiness=[draining])
    client = app.test_client()
    assert client.get("/readyz").status_code == 200
    events: list[str] = []
    stop = threading.Event()
    shutdown = GracefulShutdown(draining, FakeServer(events, client),
                                FakeLoop(events, client), stop)  # type: ignore[arg-type]
    shutdown.run()
    shutdown.run()  # a second SIGTERM does nothing more
    assert events == ["loop.stop(readyz=503)", "server.stop(timeout=20, readyz=503)"]
    assert stop.is_set() and shutdown.wait(0)
    assert client.get("/readyz").get_json()["failing"] == ["not-draining"]


class SlowBindSource(SimSource):
    """A sim source whose bind waits until released (an API call in flight)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entered = threading.Event()
        self.release = threading.Event()

    def bind(self, pod: Any, node_name: str, annotations: Any, placement: Any = None) -> bool:
        self.entered.set()
        assert self.release.wait(10)
        return super().bind(pod, node_name, annotations)


def test_in_flight_bind_finishes_during_shutdown_on_the_real_server() -> None:
    cfg = build_config({"server": {"host": "127.0.0.1", "threads": 2}})
    source = SlowBindSource([node("n1")])
    draining = Draining()
    app = create_app(ConfigHolder(cfg), source, readiness=[draining])
    running = start_background(app, cfg.server, port=0)
    pod = training("slow")
    source.create_pod(pod)
    answers: list[httpx.Response] = []
    binder = threading.Thread(target=lambda: answers.append(
        httpx.post(f"{running.url}/bind", json=binding(pod, "n1"), timeout=10)))
    binder.start()
    assert source.entered.wait(10)
    shutdown = GracefulShutdown(draining, running.server, None, threading.Event())
    stopper = threading.Thread(target=shutdown.run)
    stopper.start()
    source.release.set()
    binder.join(10)
    stopper.join(25)
    running.thread.join(10)
    assert answers and answers[0].json() == {"Error": ""}
    assert source.read_pod("default", "slow")["spec"]["nodeName"] == "n1"
    assert shutdown.wait(0) and not running.thread.is_alive()


class CliFakeServer:
    """Stands in for cheroot in ``serve``: delivers SIGTERM from inside serve."""

    instances: list[CliFakeServer] = []

    def __init__(self, app: Any, *_: Any) -> None:
        self.app = app
        self.shutdown_timeout = 5.0
        self.stopped = threading.Event()
        self.seen: dict[str, Any] = {}
        CliFakeServer.instances.append(self)

    def prepare(self) -> None:
        pass  # binds nothing

    def serve(self) -> None:
        client = self.app.test_client()
        self.seen["ready_before"] = client.get("/readyz").status_code
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # type: ignore[operator,misc]
        assert self.stopped.wait(10)
        self.seen["ready_after"] = client.get("/readyz").status_code

    def stop(self) -> None:
        self.seen["timeout"] = self.shutdown_timeout
        self.stopped.set()


def test_serve_command_wires_leadership_readiness_and_sigterm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "gpus": [
        {"product": "NVIDIA-A100-SXM4-40GB", "memory_mib": 40960, "count": 1}]}]}))
    coordination, core = FakeCoordinationApi(), FakeCoreApi()
    monkeypatch.setattr("extender.ha.lifecycle.kube_clients", lambda: (coordination, core))
    monkeypatch.setattr("extender.transport.server.make_server", CliFakeServer)
    monkeypatch.setenv("POD_NAMESPACE", ENV["POD_NAMESPACE"])
    monkeypatch.setenv("POD_NAME", ENV["POD_NAME"])
    previous = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(commands.app, [
            "serve", f"--cluster=sim:{cluster}", "--leadership=elect",
            "--lease-name=tandem-extender"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 0, result.output
    seen = CliFakeServer.instances[-1].seen
    assert seen == {"ready_before": 200, "timeout": 20.0, "ready_after": 503}
    assert coordination.writes  # the election loop ran against the Lease API ...
    assert coordination.holder == ""  # ... and released the Lease on shutdown
    assert core.labels[-1] is None  # and removed the leader label


def test_serve_command_reports_leadership_errors_as_usage_errors(tmp_path: Path) -> None:
    result = CliRunner().invoke(commands.app, [
        "serve", "--cluster=sim:/nonexistent", "--leadership=elect"],
        env={"POD_NAMESPACE": "", "POD_NAME": ""})
    assert result.exit_code == 2
    assert "needs POD_NAME" in result.output


@pytest.mark.parametrize(("overlay", "mode", "lease"), [
    ("sidecar", "follow-scheduler", "tandem-scheduler"),
    ("standalone", "elect", "tandem-extender"),
], ids=["sidecar", "standalone"])
def test_manifests_pass_leadership_flags_and_pod_identity(overlay: str, mode: str,
                                                          lease: str) -> None:
    objects = resolve(MANIFESTS / "overlays" / overlay)
    (spec,) = [s for _, s in pod_specs(objects)
               if any(c["name"] == "extender" for c in s["containers"])]
    extender = container(spec, "extender")
    assert f"--leadership={mode}" in extender["args"]
    assert f"--lease-name={lease}" in extender["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in extender["env"]
           if "valueFrom" in e}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    assert spec["terminationGracePeriodSeconds"] > 20  # the drain timeout fits in the grace
