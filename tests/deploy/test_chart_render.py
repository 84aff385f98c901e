"""charts/tandem renders with its defaults and with every option toggled; each object
validates strictly against the Kubernetes schemas; bad values fail with a message;
kube-scheduler follows the cluster version; one version everywhere."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from chart_helpers import CHART, NAMESPACE, REPO, helm_template, render
from manifests_helpers import (
    BUILT_IN_ROLES,
    K8S_VERSION,
    MANIFESTS,
    assert_device_plugin_least_privilege,
    assert_one_read_only_model_store,
    assert_pod_references_exist,
    assert_restricted_pod_security,
    containers_of,
    model_store_mounts,
    pod_specs,
)
from typer.testing import CliRunner

from extender.config.loader import load_config

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
CRD_GROUPS = ("monitoring.coreos.com/",)  # Prometheus Operator kinds: not in the core schemas

# Every value a user is expected to change, each toggled away from its default in
# one of three renders (few renders: one with generated certificates takes ~1 s).
OPTIONS = {
    "defaults": [],
    "standalone": [
        "topology=standalone", "tls.generate=false", "tls.secretName=my-tls",
        "tls.caConfigMapName=my-ca", "tokens.agent.existingSecret=my-agent",
        "tokens.admin.existingSecret=my-admin", "signingKey.existingSecret=my-signing-key",
        "agent.serveGpus=false",
        "config.limits.max_pods_per_gpu=4", "config.limits.min_colocation_gain_percent=5",
        "devicePlugin.enabled=false", "config.handoff.mode=env",
    ],
    "queue-gate": [
        "queueGate.enabled=true", "metrics.podMonitors.enabled=true",
        "tokens.admin.copyToNamespaces={team-a,team-b}", "namespace.create=true",
        "image.registry=registry.example.com/ml", "image.tag=9.9.9",
        "imagePullSecrets[0].name=pull",
    ],
    "queue-in-extender": [
        "config.queue.enabled=true", "kubeScheduler.image.tag=v1.31.2",
        "kubeScheduler.extenderWeight=3", "modelStore.emptyDir=null",
        "modelStore.persistentVolumeClaim.claimName=models",
        "modelStore.persistentVolumeClaim.readOnly=true",
        "devicePlugin.shares=4",
    ],
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(*sets) for name, sets in OPTIONS.items()}


def test_every_object_validates_strictly(rendered: dict) -> None:
    seen: set[str] = set()
    for objects in rendered.values():
        assert objects
        for obj in objects:
            if obj["apiVersion"].startswith(CRD_GROUPS):
                continue
            # Validate each distinct object once (renders share most of them).
            key = json.dumps(obj, sort_keys=True)
            if key not in seen:
                seen.add(key)
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_reference_resolves(rendered: dict, option: str) -> None:
    objects = rendered[option]
    values = dict(s.split("=", 1) for s in OPTIONS[option])
    have = {(o["kind"], o["metadata"]["name"]) for o in objects} | BUILT_IN_ROLES
    # Objects the user names in values instead of letting the chart make them.
    have |= {("Secret", values.get("tls.secretName")),
             ("ConfigMap", values.get("tls.caConfigMapName")),
             ("Secret", values.get("tokens.agent.existingSecret")),
             ("Secret", values.get("tokens.admin.existingSecret")),
             ("Secret", values.get("signingKey.existingSecret"))}
    assert_pod_references_exist(objects, have)
    for name, spec in pod_specs(objects):
        restricted_or_agent(name, spec)
    for obj in objects:
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert (obj["roleRef"]["kind"], obj["roleRef"]["name"]) in have, obj["metadata"]
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), "duplicate objects"


def restricted_or_agent(name: str, spec: dict) -> None:
    """Every pod meets the restricted level but the device plugin (least privilege, checked
    on its own); only the agent uses hostPID."""
    if name == "DaemonSet/tandem-device-plugin":
        assert_device_plugin_least_privilege(spec)
        return
    assert_restricted_pod_security(spec)
    assert bool(spec.get("hostPID")) == (name == "DaemonSet/tandem-agent"), name


def test_options_change_what_they_say(rendered: dict) -> None:
    kinds = {n: {(o["kind"], o["metadata"]["name"]) for o in objs} for n, objs in rendered.items()}
    assert ("Deployment", "tandem-extender") in kinds["standalone"]
    assert ("Deployment", "tandem-scheduler") not in kinds["standalone"]
    assert ("Deployment", "tandem-queue-gate") in kinds["queue-gate"]
    assert ("Deployment", "tandem-queue-gate") not in kinds["defaults"]
    assert ("DaemonSet", "tandem-device-plugin") in kinds["defaults"]
    assert ("DaemonSet", "tandem-device-plugin") not in kinds["standalone"]
    assert _config(rendered["defaults"], "tandem-config", "tandem.yaml")["handoff"]["mode"] == \
        "device-plugin"
    assert _config(rendered["standalone"], "tandem-config", "tandem.yaml")["handoff"]["mode"] == \
        "env"
    assert {"tandem-extender-tls", "tandem-agent-token", "tandem-admin-token",
            "tandem-signing-key"} <= {
        n for k, n in kinds["defaults"] if k == "Secret"}
    assert not any(k == "Secret" for k, _ in kinds["standalone"]), "the user's Secrets are used"
    assert ("Namespace", NAMESPACE) in kinds["queue-gate"]
    assert ("Namespace", NAMESPACE) not in kinds["defaults"]
    assert {k for k in kinds["queue-gate"] if k[0] == "PodMonitor"} == {
        ("PodMonitor", "tandem-extender"), ("PodMonitor", "tandem-agent"),
        ("PodMonitor", "tandem-queue-gate")}
    assert not any(k[0] == "PodMonitor" for k in kinds["defaults"])
    copies = [o for o in rendered["queue-gate"] if o["metadata"]["name"] == "tandem-admin-token"]
    assert sorted(o["metadata"]["namespace"] for o in copies) == [NAMESPACE, "team-a", "team-b"]
    assert len({o["data"]["token"] for o in copies}) == 1, "every copy holds the same token"
    images = {c["image"] for c in containers_of(rendered["queue-gate"])}
    assert images == {"registry.example.com/ml/tandem:9.9.9",
                      "registry.example.com/ml/tandem-gpu:9.9.9",
                      "registry.k8s.io/kube-scheduler:v1.30.14"}
    for _, spec in pod_specs(rendered["queue-gate"]):
        assert spec["imagePullSecrets"] == [{"name": "pull"}]


def _config(objects: list[dict], cm: str, key: str) -> dict:
    obj = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == cm)
    return yaml.safe_load(obj["data"][key])


def test_values_reach_the_configuration(rendered: dict) -> None:
    assert _config(rendered["standalone"], "tandem-config", "tandem.yaml")["limits"] == {
        "max_pods_per_gpu": 4, "min_colocation_gain_percent": 5}
    assert _config(rendered["queue-in-extender"], "tandem-config", "tandem.yaml")["queue"] == {
        "enabled": True}
    scheduler = _config(rendered["queue-in-extender"], "tandem-scheduler-config",
                        "kube-scheduler-config.yaml")
    assert scheduler["extenders"][0]["weight"] == 3
    images = {c["image"] for c in containers_of(rendered["queue-in-extender"])}
    assert "registry.k8s.io/kube-scheduler:v1.31.2" in images
    config = _config(rendered["queue-in-extender"], "tandem-config", "tandem.yaml")
    assert assert_one_read_only_model_store(rendered["queue-in-extender"], config) == {
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    no_serving = dict(pod_specs(rendered["standalone"]))["DaemonSet/tandem-agent"]
    assert "--serve-gpus" not in no_serving["containers"][0]["args"]
    assert len(no_serving["containers"][0]["ports"]) == 1


@pytest.mark.parametrize(("cluster", "expected"), [
    ("1.30.14", "v1.30.14"), ("1.31.4", "v1.31.4"), ("v1.32.2-eks-7f8e9a1", "v1.32.2")])
def test_kube_scheduler_follows_the_cluster_version(cluster: str, expected: str) -> None:
    images = {c["image"] for c in containers_of(render(kube_version=cluster))}
    assert f"registry.k8s.io/kube-scheduler:{expected}" in images


@pytest.mark.parametrize(("sets", "message"), [
    (["topology=sidecars"], 'topology must be "sidecar" or "standalone"'),
    (["queueGate.enabled=true", "config.queue.enabled=true"], "run the weighted-fair queue in one"),
    (["replicas=0"], "replicas must be at least 1"),
    (["devicePlugin.enabled=false"], "devicePlugin.enabled and config.handoff.mode"),
    (["config.handoff.mode=env"], "devicePlugin.enabled and config.handoff.mode"),
    (["agent.executor=sim"], "agent.executor must be onnxruntime (image tandem-gpu) or torch"),
    (["config.predictor.model_store=/models"], "config.predictor.model_store must be /srv/tandem"),
    (["config.predictor.model_store=null"], "config.predictor.model_store must be /srv/tandem"),
])
def test_bad_values_fail_with_a_message(sets: list[str], message: str) -> None:
    result = helm_template(*sets, check=False)
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize("option", OPTIONS)
def test_the_extender_reads_models_from_the_agents_model_store(rendered: dict,
                                                                option: str) -> None:
    """In either topology the extender (and the queue gate) mounts modelStore read-only
    where its config's predictor.model_store points, as the agents' servers do."""
    objects = rendered[option]
    config = _config(objects, "tandem-config", "tandem.yaml")
    assert config["predictor"]["model_store"] == "/srv/tandem"
    source = assert_one_read_only_model_store(objects, config)
    workloads = {n for n, s in pod_specs(objects)
                 if any(c["name"] == "extender" for c in s["containers"])}
    topology = "standalone" if "topology=standalone" in OPTIONS[option] else "sidecar"
    assert workloads == {"Deployment/tandem-" + ("extender" if topology == "standalone"
                                                  else "scheduler")}
    if option != "queue-in-extender":
        assert source == {"emptyDir": {"sizeLimit": "1Mi"}}


@pytest.mark.parametrize("sets", [
    ["agent.modelStore.persistentVolumeClaim.claimName=old"],
    ["agent.modelStore.emptyDir=null", "agent.modelStore.persistentVolumeClaim.claimName=old"],
], ids=["set", "with-null"])
def test_agent_model_store_still_names_the_store(sets: list[str]) -> None:
    """agent.modelStore, the value's former name, still works and now reaches the
    extender too."""
    objects = render(*sets, "queueGate.enabled=true")
    config = _config(objects, "tandem-config", "tandem.yaml")
    mounted = model_store_mounts(objects, "/srv/tandem")
    assert {k.rpartition(":")[2] for k in mounted} == {"agent", "extender", "queue-gate"}
    assert assert_one_read_only_model_store(objects, config) == {
        "persistentVolumeClaim": {"claimName": "old"}}


def test_the_inference_servers_run_the_executor_their_image_has() -> None:
    def agent(*sets: str) -> dict:
        return dict(pod_specs(render(*sets)))["DaemonSet/tandem-agent"]["containers"][0]

    default = agent()
    assert "--serve-arg=--executor=onnxruntime" in default["args"]
    assert default["image"].split("/")[-1].startswith("tandem-gpu:")
    on_torch = agent("agent.executor=torch", "image.gpuRepository=tandem-gpu-torch")
    assert {"--serve-arg=--executor=torch", "--serve-arg=--device=cuda"} <= set(on_torch["args"])
    assert on_torch["image"].split("/")[-1].startswith("tandem-gpu-torch:")


def test_clusters_older_than_supported_are_refused() -> None:
    result = helm_template(kube_version="1.29.9", check=False)
    assert result.returncode != 0 and "kubeVersion" in result.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_generated_certificate_names_every_address_and_chains_to_the_ca(tmp_path: Path) -> None:
    import base64

    tls = next(o for o in render() if o["kind"] == "Secret"
               and o["metadata"]["name"] == "tandem-extender-tls")
    for key in ("tls.crt", "ca.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(tls["data"][key]))
    verify = subprocess.run(["openssl", "verify", "-CAfile", tmp_path / "ca.crt",
                             tmp_path / "tls.crt"], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", tmp_path / "tls.crt"],
                          capture_output=True, text=True, check=True).stdout
    for name in ("DNS:tandem-extender.tandem-system.svc", "DNS:localhost", "IP Address:127.0.0.1"):
        assert name in text


def test_one_version_everywhere() -> None:
    from tandem.cli import app

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == VERSION
    tags = {i["newTag"] for k in MANIFESTS.rglob("kustomization.yaml")
            for i in yaml.safe_load(k.read_text()).get("images", [])
            if i["name"] in ("tandem", "tandem-gpu")}
    assert tags == {VERSION}
    dockerfile = (REPO / "Dockerfile").read_text()
    assert set(re.findall(r"-t (?:tandem|tandem-gpu):(\S+)", dockerfile)) == {VERSION}
    assert f"## {VERSION} - " in (REPO / "CHANGELOG.md").read_text()
    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output.split()[1].startswith(VERSION)


def test_chart_lints_strictly() -> None:
    from chart_helpers import HELM

    if HELM is None:
        pytest.skip("no helm")
    result = subprocess.run([HELM, "lint", "--strict", str(CHART), "--kube-version", "1.30.14"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_signing_key_secret_is_generated_and_mounted_read_only(rendered: dict) -> None:
    """Default: the chart makes Secret tandem-signing-key (random, kept on upgrade through
    lookup) and only the extender mounts it, read-only; existingSecret swaps the name."""
    import base64

    secret = next(o for o in rendered["defaults"]
                  if o["kind"] == "Secret" and o["metadata"]["name"] == "tandem-signing-key")
    key = base64.b64decode(secret["data"]["key"])
    assert len(key) == 64 and key.isalnum()
    for option, name in (("defaults", "tandem-signing-key"), ("standalone", "my-signing-key")):
        mounts = []
        for workload, spec in pod_specs(rendered[option]):
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            for c in spec["containers"]:
                for mount in c.get("volumeMounts", []):
                    secret_name = volumes[mount["name"]].get("secret", {}).get("secretName")
                    if secret_name == name:
                        mounts.append((workload, c["name"], mount, volumes[mount["name"]]))
        assert [(c, m["mountPath"], m["readOnly"], v["secret"]["defaultMode"])
                for _, c, m, v in mounts] == [("extender", "/etc/tandem/signing-key", True,
                                               0o440)], (option, mounts)
        state = _config(rendered[option], "tandem-config", "tandem.yaml")["state"]
        assert state["signing_key_file"] == "/etc/tandem/signing-key/key"


def test_a_measured_matrix_reaches_the_extender_beside_its_config(tmp_path: Path) -> None:
    matrix = tmp_path / "k80.yaml"
    matrix.write_text("interference:\n  NVIDIA-Tesla-K80:\n    slowdown:\n"
                      "      LM-bs5: {ResNet-50-bs64: 3.56}\n")
    objects = render(f"file:pairPrior={matrix}", "config.learning.pairs=true",
                     "config.learning.pair_prior=pair-prior.yaml")
    cm = next(o for o in objects
              if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "tandem-config")
    config = yaml.safe_load(cm["data"]["tandem.yaml"])
    assert config["learning"] == {"pairs": True, "pair_prior": "pair-prior.yaml"}
    # the extender reads the pair as the file says, relative to the mounted tandem.yaml
    (tmp_path / "tandem.yaml").write_text(cm["data"]["tandem.yaml"])
    (tmp_path / "pair-prior.yaml").write_text(cm["data"]["pair-prior.yaml"])
    learning = load_config(str(tmp_path / "tandem.yaml"), environ={}).learning
    assert learning.pair_prior_tables["NVIDIA-Tesla-K80"].listed("LM-bs5",
                                                                 "ResNet-50-bs64") == 3.56
    assert "pair-prior.yaml" not in _config(render(), "tandem-config", "tandem.yaml").get(
        "learning", {}).values()
    for sets in ([f"file:pairPrior={matrix}"], ["config.learning.pair_prior=pair-prior.yaml"]):
        result = helm_template(*sets, check=False)
        assert result.returncode != 0 and "pairPrior and config.learning.pair_prior" in \
            result.stderr


def test_scoring_pods_without_gpu_drops_the_managed_resource() -> None:
    """scorePodsWithoutGpu: the extender is called for every pod of the profile, and
    NodeResourcesFit ignores tandem.io/gpu instead of the extender entry."""
    objects = render("kubeScheduler.scorePodsWithoutGpu=true", "webhook.enabled=true",
                     "webhook.settings.route_namespaces={web}")
    scheduler = _config(objects, "tandem-scheduler-config", "kube-scheduler-config.yaml")
    assert "managedResources" not in scheduler["extenders"][0]
    assert scheduler["profiles"][0]["pluginConfig"] == [
        {"name": "NodeResourcesFit", "args": {"ignoredResources": ["tandem.io/gpu"]}}]
    default = _config(render(), "tandem-scheduler-config", "kube-scheduler-config.yaml")
    assert default["extenders"][0]["managedResources"] == [
        {"name": "tandem.io/gpu", "ignoredByScheduler": True}]
    assert "pluginConfig" not in default["profiles"][0]
    webhook = next(o for o in objects if o["kind"] == "ConfigMap" and "webhook" in
                   o["metadata"]["name"])
    from extender.webhook.mutate import parse_settings
    settings = parse_settings(yaml.safe_load(next(iter(webhook["data"].values()))))
    assert settings.route_namespaces == ("web",) and not settings.shares.any
