"""The newest pod of a GPU shared by a pair measured to lose, within its first minutes."""

from __future__ import annotations

from extender_builders import A100

from extender.core.snapshot import GpuSpec
from extender.learning.revert import newest_of_losing
from extender.state.reports import DecodedReport, ReportedProcess

REPORT = DecodedReport(
    node="n1", gpus=(GpuSpec(0, "GPU-0", A100, 40960), GpuSpec(1, "GPU-1", A100, 40960)),
    util_percent=(90.0, 90.0), memory_used_mib=(1.0, 1.0),
    processes=((ReportedProcess("old", 1.0, None), ReportedProcess("new", 1.0, None)),
               (ReportedProcess("x", 1.0, None), ReportedProcess("y", 1.0, None))))
MODELS = {"old": "bert", "new": "gpt", "x": "lm", "y": "resnet"}
FIRST = {"old": 0.0, "new": 500.0, "x": 0.0, "y": 550.0}


def _moves(losing: set, now: float, window_s: float = 300.0) -> list[str]:
    return newest_of_losing(REPORT, lambda u, i: MODELS.get(u), losing,
                            lambda u, i: FIRST[u], now, window_s)


def test_the_newest_pod_of_a_losing_pair_is_moved_within_its_window() -> None:
    losing = {(A100, frozenset(("bert", "gpt")))}
    assert _moves(losing, 600.0) == ["new"]  # gpt arrived last, 100 s ago
    assert _moves(losing, 900.0) == []  # past its first five minutes: it stays
    assert _moves(set(), 600.0) == []  # a pair not refused is never moved


# ---- through the service: the agents' reports, the learner, the Eviction API -----------------

KEY = "test-signing-key-0123456789"
TOKEN = "agent-token-for-revert"
GFD = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
       "nvidia.com/gpu.memory": "40960"}


def _pod(name: str, model: str) -> dict:
    from extender.state.signing import PlacementSigner

    ann = PlacementSigner(KEY.encode()).sign(f"uid-{name}", "gpu-a", {
        "tandem.io/gpu-index": "0", "tandem.io/predicted-gpu-util": "40.00",
        "tandem.io/predicted-gpu-mem-mib": "8000"})
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "annotations": {**ann, "tandem.io/model": model}},
            "spec": {"nodeName": "gpu-a", "priority": 0, "containers": [
                {"name": "c", "resources": {"limits": {"tandem.io/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


def _serve(revert_s: float, fault: int | None = None):
    from kubernetes import client

    from extender.cluster.kube import KubeSource, PlainWatch
    from extender.config.loader import ConfigHolder
    from extender.config.schema import build_config
    from extender.wiring import create_app
    from lab.fakes import kube_api as fake_kube_api

    fake = fake_kube_api.FakeKubeApi(
        nodes=[{"metadata": {"name": "gpu-a", "labels": GFD}}],
        pods=[_pod("old", "bert"), _pod("new", "gpt")])
    if fault:
        fake.inject("POST", "/eviction", fault)
    fake.start()
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=fake.url)))
    source = KubeSource(api, watch_factory=PlainWatch, background_events=False)
    config = build_config({"learning": {"pairs": True, "revert_losing_seconds": revert_s}})
    app = create_app(ConfigHolder(config), source,
                     environ={"TANDEM_SIGNING_KEY": KEY, "TANDEM_AGENT_TOKEN": TOKEN})
    return fake, app, source


def _report(app, rates: dict[str, float]) -> None:
    import time

    gpu = {"index": 0, "uuid": "GPU-a", "product": "NVIDIA A100-SXM4-40GB",
           "memory_total_mib": 40960, "memory_used_mib": 8000.0 * len(rates),
           "utilization_percent": 90.0,
           "processes": [{"pod_uid": f"uid-{n}", "used_memory_mib": 8000.0} for n in rates],
           "progress": [{"pod_uid": f"uid-{n}", "steps_per_s": r, "window_s": 10.0}
                        for n, r in rates.items()]}
    answer = app.test_client().post(
        "/v1/agents/report", headers={"Authorization": f"Bearer {TOKEN}"},
        json={"node": "gpu-a", "timestamp": time.time(), "interval_seconds": 10.0,
              "gpus": [gpu]})
    assert answer.status_code == 200, answer.get_data(as_text=True)


def _evictions(fake) -> list[str]:
    return [r.path.split("/")[-2] for r in fake.requests
            if r.method == "POST" and r.path.endswith("/eviction")]


def _losing_run(revert_s: float, fault: int | None = None):
    fake, app, source = _serve(revert_s, fault)
    try:
        _report(app, {"old": 10.0})  # each alone first: its own step time
        _report(app, {"new": 10.0})
        _report(app, {"old": 4.0, "new": 4.0})  # 2.5x slower each: combined 0.8
        _report(app, {"old": 4.0, "new": 4.0})
        source.drain_events()
        return _evictions(fake), {(e["involvedObject"]["name"], e["reason"])
                                  for e in fake.events}, fake
    finally:
        source.stop()
        fake.stop()


def test_the_service_evicts_the_newest_pod_of_a_pair_measured_to_lose_once() -> None:
    evicted, events, _ = _losing_run(300.0)
    assert evicted == ["new"]  # the newer pod, once, through the Eviction API
    assert ("new", "TandemReverted") in events


def test_revert_is_off_by_default_and_a_refused_eviction_leaves_the_pod() -> None:
    assert _losing_run(0.0)[0] == []  # learning.revert_losing_seconds: 0 (the default)
    evicted, events, fake = _losing_run(300.0, fault=429)  # its budget allows no disruption
    assert fake.faults_injected["429"] == 1 and ("new", "TandemRevertBlocked") in events
    assert "uid-new" in {p["metadata"]["uid"] for p in fake.pods.values()}
