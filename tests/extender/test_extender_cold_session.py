"""The shipped inference example is placed under the shipped config (session cold start)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from extender_builders import args, binding, inference, make_app, node, pod

from extender.cluster.sim import SimSource
from extender.config.loader import load_config
from extender.inference_profiles import load_profiles

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests/examples/inference-deployment.yaml"


def example_pod(name: str) -> dict[str, Any]:
    """One replica of the example Deployment, as the ReplicaSet would create it."""
    template = yaml.safe_load(EXAMPLE.read_text())["spec"]["template"]
    meta = dict(template["metadata"], name=name, namespace="default", uid=f"uid-{name}")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def shipped_app(source: SimSource):
    """The extender under the packaged default config and the profiles it lists."""
    cfg = load_config(None, environ={})
    raw = yaml.safe_load((ROOT / "extender/default_config.yaml").read_text())
    profiles = load_profiles(cfg.profile_files, cfg.nexus_profiles)
    return make_app(source=source, raw_config=raw, profiles=profiles)


def test_shipped_example_is_placed_alone_on_an_idle_gpu_under_the_default_config() -> None:
    source = SimSource.from_file(ROOT / "extender/demo_cluster.yaml")
    app, ext, _, _ = shipped_app(source)
    client = app.test_client()
    names = sorted({n.name for n in source.nodes})
    first = example_pod("example-1")
    source.create_pod(first)
    ok = client.post("/filter", json=args(first, names)).get_json()
    assert ok["NodeNames"], ok
    chosen = ok["NodeNames"][0]
    assert client.post("/bind", json=binding(first, chosen)).get_json() == {"Error": ""}
    placed = source.read_pod("default", "example-1")["metadata"]["annotations"]
    # The whole GPU, the memory the pod asked for, and no duty cycle yet: the server
    # measures the profile when the session registers.
    assert float(placed["tandem.io/predicted-gpu-util"]) == 100.0
    assert float(placed["tandem.io/predicted-gpu-mem-mib"]) == 1024.0
    assert placed["tandem.io/prediction-source"] == "cold-start+profile:server"
    assert "tandem.io/duty-cycle-ms" not in placed
    # A second replica cannot join the first one's GPU; it takes another idle one.
    second = example_pod("example-2")
    source.create_pod(second)
    ok = client.post("/filter", json=args(second, [chosen])).get_json()
    assert client.post("/bind", json=binding(second, chosen)).get_json() == {"Error": ""}
    again = source.read_pod("default", "example-2")["metadata"]["annotations"]
    assert again["tandem.io/gpu-uuid"] != placed["tandem.io/gpu-uuid"]


def test_a_session_without_a_profile_never_shares_a_gpu() -> None:
    app, _, source, _ = make_app([node("n1", count=1)])
    client = app.test_client()
    cold = inference("cold", model="unprofiled", slo=100, rate=10)
    cold["metadata"]["annotations"]["tandem.io/gpu-mem-mib"] = "1024"
    source.create_pod(cold)
    assert client.post("/filter", json=args(cold, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert client.post("/bind", json=binding(cold, "n1")).get_json() == {"Error": ""}
    for other in (inference("warm", model="resnet50", slo=100, rate=10),
                  inference("cold2", model="unprofiled", slo=100, rate=10)):
        other["metadata"]["annotations"]["tandem.io/gpu-mem-mib"] = "1024"
        answer = client.post("/filter", json=args(other, ["n1"])).get_json()
        assert answer["NodeNames"] == [], answer


def test_unknown_demand_names_the_memory_the_pod_asked_for() -> None:
    app, _, _, _ = make_app([node("n1", count=1)], profiles={}, predictor=None)
    cold = inference("cold", model="unprofiled", slo=100, rate=10)
    train = pod("t", model="m.onnx", workload="training", gpu_mem_mib="1024")
    answer = app.test_client().post("/filter", json=args(train, ["n1"])).get_json()
    message = answer["FailedAndUnresolvableNodes"]["n1"]
    assert "1024 MiB" in message and "0 MiB," not in message, message
    answer = app.test_client().post("/filter", json=args(cold, ["n1"])).get_json()
    assert "tandem.io/gpu-mem-mib" in answer["FailedAndUnresolvableNodes"]["n1"]
