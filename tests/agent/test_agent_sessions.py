"""Session sync to per-GPU inference servers: desired sessions and idempotent rounds."""

from __future__ import annotations

import json

import httpx
import pytest

from agent.node.extender_view import NodeView, PodPlacement, parse_node_view
from agent.node.sessions import SessionSync, desired_sessions, session_spec

NODE = "gpu-node-1"


def pod(name: str, gpu: int = 0, **notes: str) -> dict:
    """A ``/v1/state`` pod entry of an inference pod with its tandem.io annotations."""
    annotations = {"tandem.io/workload": "inference", "tandem.io/model": f"models/{name}.onnx"}
    annotations.update({f"tandem.io/{k.replace('_', '-')}": v for k, v in notes.items()})
    return {"pod": f"ns/{name}", "uid": f"uid-{name}", "state": "placed",
            "workload": "inference", "util_percent": 20.0, "mem_mib": 512.0,
            "annotations": annotations}


def view(*gpus: list[dict]) -> NodeView:
    return parse_node_view({"nodes": {NODE: {"gpus": [
        {"index": i, "pods": pods} for i, pods in enumerate(gpus)]}}}, NODE)


@pytest.mark.parametrize(("notes", "body"), [
    pytest.param({"slo_ms": "50", "rate_rps": "200"},
                 {"name": "ns.a", "model": "models/a.onnx", "slo_ms": 50.0, "rate_rps": 200.0},
                 id="slo-session"),
    pytest.param({"slo_ms": "50", "rate_rps": "200", "priority": "-2"},
                 {"name": "ns.a", "model": "models/a.onnx", "slo_ms": 50.0, "rate_rps": 200.0,
                  "priority": -2}, id="slo-session-priority"),
    pytest.param({"weight": "3"}, {"name": "ns.a", "model": "models/a.onnx", "weight": 3},
                 id="weighted"),
    pytest.param({"priority": "2"}, {"name": "ns.a", "model": "models/a.onnx", "priority": 2},
                 id="priority"),
    pytest.param({}, {"name": "ns.a", "model": "models/a.onnx", "weight": 1},
                 id="best-effort-default-weight"),
    pytest.param({"priority": "+5"}, {"name": "ns.a", "model": "models/a.onnx", "priority": 5},
                 id="signed-priority"),
])
def test_session_spec_bodies(notes: dict[str, str], body: dict) -> None:
    spec = session_spec(view([pod("a", **notes)]).pods()[0])
    assert spec.json() == body


@pytest.mark.parametrize(("notes", "field"), [
    pytest.param({"slo_ms": "fast", "rate_rps": "1"}, "tandem.io/slo-ms", id="bad-number"),
    pytest.param({"weight": "heavy"}, "tandem.io/weight", id="bad-weight"),
    pytest.param({"model": ""}, "tandem.io/model", id="no-model"),
    # The extender rejects an SLO without a rate; the agent skips it (never best effort).
    pytest.param({"slo_ms": "50"}, "tandem.io/rate-rps", id="slo-without-rate"),
    pytest.param({"weight": "5000"}, "tandem.io/weight", id="weight-over-quanta-limit"),
])
def test_unusable_pods_are_skipped_with_the_field_named(notes: dict[str, str], field: str) -> None:
    wanted, skipped = desired_sessions(view([pod("a", **notes)]))
    assert wanted == {0: {}}
    ((name, reason),) = skipped
    # "field=value: problem", or "field: problem" where the field is missing
    assert name == "ns.a" and reason.startswith((field + "=", field + ":"))


def test_a_skipped_pod_is_logged_once_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    sync = SessionSync(lambda i: f"http://127.0.0.1:{8700 + i}",
                       transport=httpx.MockTransport(FakeServers({0: set()})))
    bad = view([pod("a", slo_ms="50")])
    with caplog.at_level("WARNING", logger="agent.node.sessions"):
        results = [sync.sync(bad), sync.sync(bad)]
    assert [r.skipped for r in results] == [("ns.a",), ("ns.a",)]
    skips = [r for r in caplog.records if r.getMessage().startswith("session skipped")]
    assert [(r.session, r.reason.split(":")[0].split("=")[0]) for r in skips] == [
        ("ns.a", "tandem.io/rate-rps")]


def test_training_pods_are_not_sessions() -> None:
    training = {"pod": "ns/t", "uid": "t", "workload": "training",
                "annotations": {"tandem.io/model": "m"}}
    wanted, _ = desired_sessions(view([training, pod("a")]))
    assert list(wanted[0]) == ["ns.a"]


def test_untrusted_pods_get_no_session() -> None:
    """#25: a pod bound without the extender's decision holds every GPU of its node; its
    annotations must not register a session on them."""
    bypass = {**pod("b"), "state": "untrusted"}
    wanted, skipped = desired_sessions(view([bypass, pod("a")], [bypass]))
    assert (list(wanted[0]), wanted[1], skipped) == (["ns.a"], {}, ())


class FakeServers:
    """Per-GPU inference servers (port 8700 + i) answering the DESIGN session API."""

    def __init__(self, sessions: dict[int, set[str]], refuse: set[str] = frozenset()) -> None:
        self.sessions = sessions
        self.refuse = refuse
        self.log: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        index = request.url.port - 8700
        if index not in self.sessions:
            raise httpx.ConnectError("refused", request=request)
        held = self.sessions[index]
        self.log.append(f"{request.method} {index} {request.url.path}")
        if request.method == "GET":
            return httpx.Response(200, json={"sessions": [{"name": n, "served": 0}
                                                          for n in sorted(held)]})
        if request.method == "POST":
            body = json.loads(request.content)
            if body["name"] in self.refuse:
                return httpx.Response(409, json={"error": "would break SLO of ns.x"})
            held.add(body["name"])
            return httpx.Response(201, json={"batch": 4, "duty_cycle_ms": 20})
        name = request.url.path.rsplit("/", 1)[1]
        held.discard(name)
        return httpx.Response(204)


def syncer(servers: FakeServers) -> SessionSync:
    return SessionSync(lambda i: f"http://127.0.0.1:{8700 + i}",
                       transport=httpx.MockTransport(servers))


def test_sync_adds_missing_removes_gone_keeps_the_rest() -> None:
    servers = FakeServers({0: {"ns.keep", "ns.gone"}, 1: set()})
    result = syncer(servers).sync(view([pod("keep"), pod("new")], [pod("other")]))
    assert (result.added, result.removed, result.kept, result.failed) == (
        ("ns.new", "ns.other"), ("ns.gone",), ("ns.keep",), ())
    assert servers.sessions == {0: {"ns.keep", "ns.new"}, 1: {"ns.other"}}


def test_sync_is_idempotent() -> None:
    servers = FakeServers({0: set()})
    sync = syncer(servers)
    desired = view([pod("a"), pod("b")])
    sync.sync(desired)
    servers.log.clear()
    second = sync.sync(desired)
    assert (second.added, second.removed, second.kept) == ((), (), ("ns.a", "ns.b"))
    assert servers.log == ["GET 0 /v1/sessions"]


def test_refusal_and_unreachable_server_are_failures_not_crashes() -> None:
    servers = FakeServers({0: set()}, refuse={"ns.heavy"})
    result = syncer(servers).sync(view([pod("heavy"), pod("ok")], [pod("orphan")]))
    assert result.added == ("ns.ok",)
    assert result.failed == ("ns.heavy", "ns.orphan")


def test_gpu_without_server_and_without_sessions_is_silent() -> None:
    result = syncer(FakeServers({0: set()})).sync(view([pod("a")], []))
    assert result.failed == () and result.added == ("ns.a",)


def test_placement_annotation_lookup() -> None:
    placement = PodPlacement("u", "n", "ns", 0, None, None, (("a", "1"),))
    assert (placement.annotation("a"), placement.annotation("b")) == ("1", None)


def test_best_effort_gpu_time_is_carried_in_the_report_by_pod() -> None:
    from agent.node.reporter import session_entries
    from contracts.agentreport import ReportedSession

    def listing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"sessions": [
            {"name": "ns.batch", "kind": "best_effort", "gpu_time_ms": 1234.5},
            {"name": "ns.slo", "kind": "slo", "gpu_time_ms": 99.0},
            {"name": "ns.stranger", "kind": "best_effort", "gpu_time_ms": 7.0}]})
    sync = SessionSync(lambda i: f"http://127.0.0.1:{8700 + i}",
                       transport=httpx.MockTransport(listing))
    current = view([pod("batch"), pod("slo", slo_ms="50", rate_rps="10")])
    sync.sync(current)
    assert sync.gpu_time_ms == {0: {"ns.batch": 1234.5, "ns.stranger": 7.0}}
    # only sessions of pods the extender placed on that GPU, named by pod UID
    assert session_entries(sync.gpu_time_ms, current.pods()) == {
        0: (ReportedSession("uid-batch", 1234.5),)}
