"""The example pods of manifests/examples/ round-trip through the real extender in
``sim:`` mode: filter -> prioritize -> bind with the pod bodies kube-scheduler
would send, then the downward API (as the kubelet resolves it) hands each
container exactly the GPU that tandem chose."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from extender_builders import AGENT_AUTH, tiny_model
from manifests_helpers import MANIFESTS, example_objects

from extender.cluster.sim import SimSource, parse_cluster
from extender.config.loader import ConfigHolder, load_config
from extender.inference_profiles import parse_profiles
from extender.wiring import build_predictor, create_app, default_planner

CLUSTER = yaml.safe_load("""
nodes:
  - name: a100-node
    gpus: [{product: NVIDIA-A100-SXM4-40GB, memory_mib: 40960, count: 2}]
  - name: small-node
    gpus: [{product: NVIDIA-GeForce-GTX-1080, memory_mib: 4096, count: 1}]  # too small for both
  - name: cpu-node
    gpus: []
""")
# A profile for the inference example's model (tandem.io/model: models/resnet50.onnx).
PROFILES = yaml.safe_load("""
profiles:
  - model: resnet50
    gpu_type: NVIDIA-A100-SXM4-40GB
    linear: {alpha_ms: 0.6, beta_ms: 3.0}
    memory_mib: 2500
""")
NODES = ["a100-node", "small-node", "cpu-node"]
_FIELD_REF = re.compile(r"^metadata\.annotations\['([^']+)'\]$")
_POD_FIELDS = {
    "metadata.name": lambda pod: pod["metadata"]["name"],
    "metadata.namespace": lambda pod: pod["metadata"].get("namespace", ""),
    "status.hostIP": lambda pod: pod.get("status", {}).get("hostIP", ""),
}


def example_pods() -> list[tuple[str, dict[str, Any]]]:
    """Each example as the Pod the API server would hold (Deployments via their template)."""
    pods = []
    for i, obj in enumerate(example_objects()):
        if obj["kind"] == "Pod":
            pod = copy.deepcopy(obj)
        else:
            template = copy.deepcopy(obj["spec"]["template"])
            pod = {"apiVersion": "v1", "kind": "Pod", **template}
            pod["metadata"]["name"] = f"{obj['metadata']['name']}-abc12"
        pod["metadata"].update(namespace="default", uid=f"uid-example-{i}")
        pods.append((obj["metadata"]["name"], pod))
    return pods


EXAMPLES = example_pods()


def resolve_env(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet computes it (downward API included)."""
    env = {}
    annotations = pod["metadata"].get("annotations", {})
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        path = var["valueFrom"]["fieldRef"]["fieldPath"]
        if path in _POD_FIELDS:  # the session process's name and node address
            env[var["name"]] = _POD_FIELDS[path](pod)
            continue
        match = _FIELD_REF.match(path)
        assert match, var
        env[var["name"]] = annotations.get(match.group(1), "")  # missing -> ""
    return env


@pytest.fixture
def cluster() -> tuple[Any, SimSource]:
    cfg = load_config(MANIFESTS / "base/config/tandem.yaml", environ={
        "TANDEM__SERVER__TLS_CERT_FILE": "", "TANDEM__SERVER__TLS_KEY_FILE": ""})
    nodes, _ = parse_cluster(CLUSTER)
    source = SimSource(nodes)
    app = create_app(ConfigHolder(cfg), source, predictor=None,
                     profiles=parse_profiles(PROFILES, "test"), planner=default_planner(),
                     environ={})
    return app.test_client(), source


def test_examples_cover_both_workloads() -> None:
    kinds = {pod["metadata"]["annotations"]["tandem.io/workload"] for _, pod in EXAMPLES}
    assert kinds == {"training", "inference"}


@pytest.mark.parametrize(("name", "pod"), EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_example_round_trips_through_filter_prioritize_bind(
    cluster: tuple[Any, SimSource], name: str, pod: dict[str, Any]
) -> None:
    client, source = cluster
    source.create_pod(pod)
    before = [resolve_env(pod, c) for c in pod["spec"]["containers"]]
    assert all(env.get("NVIDIA_VISIBLE_DEVICES", "") == "" for env in before), \
        "before bind the container must see no GPU"

    filtered = client.post("/filter", json={"Pod": pod, "NodeNames": NODES}).get_json()
    assert filtered["Error"] == ""
    # The session has no profile on the GTX 1080 but asks only 1 GiB: it may take that
    # idle GPU alone under the session cold-start rule; the training pod is too big for it.
    inferring = pod["metadata"]["annotations"]["tandem.io/workload"] == "inference"
    assert filtered["NodeNames"] == (["a100-node", "small-node"] if inferring
                                     else ["a100-node"]), filtered
    # What cannot ever fit (no GPUs; too little memory): unresolvable.
    assert set(filtered["FailedAndUnresolvableNodes"]) == (
        {"cpu-node"} if inferring else {"cpu-node", "small-node"})
    assert all(m.startswith("tandem: ") for m in filtered["FailedAndUnresolvableNodes"].values())

    scores = client.post("/prioritize", json={"Pod": pod, "NodeNames": ["a100-node"]})
    (entry,) = scores.get_json()
    assert entry["Host"] == "a100-node"
    assert isinstance(entry["Score"], int) and 0 <= entry["Score"] <= 10
    assert re.search(rb'"Score":\s*\d+[,}]', scores.data), "Go rejects 7.0 for an int64"

    meta = pod["metadata"]
    bound = client.post("/bind", json={"PodName": meta["name"], "PodNamespace": "default",
                                       "PodUID": meta["uid"], "Node": "a100-node"}).get_json()
    assert bound == {"Error": ""}

    stored = source.read_pod("default", meta["name"])
    assert stored["spec"]["nodeName"] == "a100-node"
    annotations = stored["metadata"]["annotations"]
    for key in ("tandem.io/gpu-index", "tandem.io/gpu-uuid", "tandem.io/predicted-gpu-util",
                "tandem.io/predicted-gpu-mem-mib", "tandem.io/cost"):
        assert annotations.get(key), key
    state = client.get("/v1/state", headers=AGENT_AUTH).get_json()
    gpus = {g["uuid"]: g["index"] for g in state["nodes"]["a100-node"]["gpus"]}
    (uuid,) = annotations["tandem.io/gpu-uuid"].split(",")  # the examples ask for one GPU
    assert gpus[uuid] == int(annotations["tandem.io/gpu-index"])
    # The user's inputs survive the bind patch untouched.
    for key, value in pod["metadata"]["annotations"].items():
        assert annotations[key] == value

    (gpu_container,) = [c for c in stored["spec"]["containers"]
                        if "tandem.io/gpu" in c["resources"]["limits"]]
    env = resolve_env(stored, gpu_container)
    # The -env examples name their GPU; the others get it from the device plugin.
    assert env.get("NVIDIA_VISIBLE_DEVICES") == (uuid if name.endswith("-env") else None)
    assert env["TANDEM_GPU_INDEX"] == annotations["tandem.io/gpu-index"]


def test_training_and_inference_examples_never_share_a_gpu(
    cluster: tuple[Any, SimSource]
) -> None:
    client, source = cluster
    chosen = {}
    for name, pod in EXAMPLES:
        source.create_pod(pod)
        assert "a100-node" in client.post("/filter", json={"Pod": pod, "NodeNames": NODES}
                                          ).get_json()["NodeNames"]
        meta = pod["metadata"]
        assert client.post("/bind", json={"PodName": meta["name"], "PodNamespace": "default",
                                          "PodUID": meta["uid"], "Node": "a100-node"}
                           ).get_json() == {"Error": ""}
        stored = source.read_pod("default", meta["name"])
        chosen[name] = stored["metadata"]["annotations"]["tandem.io/gpu-uuid"]
    serving = {uuid for name, uuid in chosen.items() if "inference" in name}
    training = {uuid for name, uuid in chosen.items() if "training" in name}
    assert serving and training and not serving & training, chosen  # never shared


def test_the_shipped_config_reads_models_from_the_model_store_only(tmp_path: Path) -> None:
    """With the shipped predictor.model_store (a directory standing in for the mounted
    volume), a training pod that names only its model is placed from the store, and a
    reference to the extender host's files is refused, the same whether they exist."""
    shipped = load_config(MANIFESTS / "base/config/tandem.yaml", environ={
        "TANDEM__SERVER__TLS_CERT_FILE": "", "TANDEM__SERVER__TLS_KEY_FILE": ""})
    assert shipped.predictor.model_store == "/srv/tandem"
    (tmp_path / "models").mkdir()
    tiny_model(tmp_path / "models" / "resnet50.onnx")
    cfg = dataclasses.replace(shipped, predictor=dataclasses.replace(
        shipped.predictor, model_store=str(tmp_path)))
    nodes, _ = parse_cluster(CLUSTER)
    source = SimSource(nodes)
    client = create_app(ConfigHolder(cfg), source, predictor=build_predictor(cfg.predictor),
                        profiles=parse_profiles(PROFILES, "test"), planner=default_planner(),
                        environ={}).test_client()
    (training,) = [copy.deepcopy(p) for n, p in EXAMPLES if n == "tandem-example-training"]
    annotations = training["metadata"]["annotations"]
    del annotations["tandem.io/gpu-util"], annotations["tandem.io/gpu-mem-mib"]
    reasons = {}
    for ref in ("models/resnet50.onnx", "/etc/passwd", "../../etc/passwd", "/no/such.onnx"):
        annotations["tandem.io/model"] = ref
        training["metadata"]["uid"] = f"uid-{ref}"
        body = client.post("/filter", json={"Pod": training, "NodeNames": ["a100-node"]})
        reasons[ref] = body.get_json()
    assert reasons.pop("models/resnet50.onnx")["NodeNames"] == ["a100-node"]
    texts = {r["FailedAndUnresolvableNodes"]["a100-node"].replace(ref, "REF")
             for ref, r in reasons.items()}
    (text,) = texts
    assert "path_outside_store" in text, text
