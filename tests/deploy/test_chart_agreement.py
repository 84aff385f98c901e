"""With default values the chart installs what the Kustomize overlays install: the same
kinds and names, containers, images, args, ports, env, mounts, volumes, RBAC rules and
bindings, Services, and the same tandem.yaml and scheduler configuration. The deploy
docs put Helm first and need nothing beyond kubectl for the Kustomize path."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import NAMESPACE, REPO, render
from manifests_helpers import (
    MANIFESTS,
    assert_one_read_only_model_store,
    containers_of,
    model_store_mounts,
    pod_specs,
    resolve,
)

# Made by the operator by hand with Kustomize (docs/deploy.md, step 3); the chart makes them.
CHART_ONLY = {("Secret", "tandem-extender-tls"), ("Secret", "tandem-agent-token"),
              ("Secret", "tandem-admin-token"), ("Secret", "tandem-signing-key"),
              ("ConfigMap", "tandem-extender-ca"), ("Secret", "tandem-scheduler-client")}
# Kustomize applies the Namespace; with Helm it exists first (namespace.create renders it).
KUSTOMIZE_ONLY = {("Namespace", NAMESPACE)}
CASES = {
    "sidecar": ([], lambda: resolve(MANIFESTS / "overlays/sidecar")),
    "standalone": (["topology=standalone"], lambda: resolve(MANIFESTS / "overlays/standalone")),
    "sidecar+queue-gate": (["queueGate.enabled=true"],
                           lambda: resolve(MANIFESTS / "overlays/sidecar")
                           + resolve(MANIFESTS / "addons/queue-gate")),
    "sidecar+env-handoff": (["devicePlugin.enabled=false", "config.handoff.mode=env"],
                            lambda: _env_folded(
                                resolve(MANIFESTS / "overlays/sidecar-env-handoff"))),
    "standalone+env-handoff": (["topology=standalone", "devicePlugin.enabled=false",
                                "config.handoff.mode=env"],
                               lambda: _env_folded(
                                   resolve(MANIFESTS / "overlays/standalone-env-handoff"))),
}


def _env_folded(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """components/env-handoff sets handoff.mode through the extender's TANDEM__HANDOFF__MODE;
    the chart writes it into tandem.yaml. Fold the variable into the file to compare."""
    mode = None
    for _, spec in pod_specs(objects):
        for c in spec["containers"]:
            if c["name"] == "extender":
                mode = next(e["value"] for e in c["env"] if e["name"] == "TANDEM__HANDOFF__MODE")
                c["env"] = [e for e in c["env"] if e["name"] != "TANDEM__HANDOFF__MODE"]
    assert mode == "env"
    for obj in objects:
        if obj["kind"] == "ConfigMap" and "tandem.yaml" in obj.get("data", {}):
            config = yaml.safe_load(obj["data"]["tandem.yaml"])
            config["handoff"]["mode"] = mode
            obj["data"]["tandem.yaml"] = yaml.safe_dump(config)
    return objects
POD_FIELDS = ("serviceAccountName", "automountServiceAccountToken", "priorityClassName",
              "runtimeClassName", "hostPID", "securityContext", "affinity", "tolerations",
              "terminationGracePeriodSeconds")
CONTAINER_FIELDS = ("image", "command", "args", "env", "ports", "volumeMounts", "resources",
                    "securityContext", "livenessProbe", "readinessProbe")


def _by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def _workload(obj: dict[str, Any]) -> dict[str, Any]:
    spec = next(s for _, s in pod_specs([obj]))
    return {
        "replicas": obj["spec"].get("replicas"),
        "selector": obj["spec"]["selector"],
        "strategy": obj["spec"].get("strategy") or obj["spec"].get("updateStrategy"),
        "pod_labels": obj["spec"]["template"]["metadata"]["labels"],
        "pod": {f: spec.get(f) for f in POD_FIELDS},
        "containers": [{"name": c["name"], **{f: c.get(f) for f in CONTAINER_FIELDS}}
                       for c in spec["containers"]],
        "volumes": spec.get("volumes"),
    }


def _comparable(obj: dict[str, Any]) -> Any:
    kind = obj["kind"]
    if kind in ("Deployment", "DaemonSet"):
        return _workload(obj)
    if kind in ("ClusterRole", "Role"):
        return obj["rules"]
    if kind in ("ClusterRoleBinding", "RoleBinding"):
        return obj["roleRef"], obj["subjects"], obj["metadata"].get("namespace")
    if kind in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
        return obj["spec"]
    if kind == "ServiceAccount":
        return obj.get("automountServiceAccountToken"), obj["metadata"]["namespace"]
    if kind == "ConfigMap":  # YAML documents: compare what they say, not their comments
        return {k: yaml.safe_load(v) for k, v in obj["data"].items()}
    raise AssertionError(f"no comparison for {kind}")


@pytest.mark.parametrize("case", CASES)
def test_chart_and_kustomize_install_the_same_objects(case: str) -> None:
    sets, kustomize = CASES[case]
    chart = _by_key(render(*sets))
    ours = _by_key(kustomize())
    assert set(chart) - set(ours) == CHART_ONLY
    assert set(ours) - set(chart) == KUSTOMIZE_ONLY
    for key in sorted(set(chart) & set(ours)):
        assert _comparable(chart[key]) == _comparable(ours[key]), key


def _model_store(objects: list[dict[str, Any]]) -> tuple[str, dict[str, Any], list[str]]:
    config = next(yaml.safe_load(o["data"]["tandem.yaml"]) for o in objects
                  if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "tandem-config")
    root = config["predictor"]["model_store"]
    source = assert_one_read_only_model_store(objects, config)
    return root, source, sorted(model_store_mounts(objects, root))


@pytest.mark.parametrize("case", ["sidecar", "standalone", "sidecar+queue-gate"])
def test_chart_and_kustomize_share_one_model_store_the_same_way(case: str) -> None:
    """The same containers mount the same store at the path predictor.model_store names."""
    sets, kustomize = CASES[case]
    root, source, readers = _model_store(render(*sets))
    assert (root, source, readers) == _model_store(kustomize())
    assert any(r.endswith(":extender") for r in readers) and any(
        r.endswith(":agent") for r in readers)


def test_the_comparison_sees_a_difference() -> None:
    chart = _by_key(render("agent.metricsPort=9999"))
    ours = _by_key(resolve(MANIFESTS / "overlays/sidecar"))
    key = ("DaemonSet", "tandem-agent")
    assert _comparable(chart[key]) != _comparable(ours[key])


DEPLOY_DOCS = [REPO / "README.md", REPO / "docs" / "deploy.md"]


@pytest.mark.parametrize("doc", DEPLOY_DOCS, ids=lambda p: p.name)
def test_deploy_docs_need_kubectl_alone_or_helm(doc: Path) -> None:
    text = doc.read_text()
    assert "kustomize edit" not in text, "the kustomize binary is not part of kubectl"
    helm = text.find("helm install tandem charts/tandem")
    kubectl = text.find("kubectl apply -k my-tandem")
    assert 0 <= helm < kubectl, "Helm is the first deploy path"
    assert re.search(r"kube-scheduler must match your cluster's minor version", text, re.I)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("doc", DEPLOY_DOCS, ids=lambda p: p.name)
def test_documented_kustomization_builds_with_kubectl(doc: Path, tmp_path: Path) -> None:
    block = re.search(r"cat > my-tandem/kustomization.yaml <<'YAML'\n(.*?)\nYAML", doc.read_text(),
                      re.S)
    assert block, "no kustomization of your own in the deploy steps"
    (tmp_path / "manifests").symlink_to(MANIFESTS)
    (tmp_path / "my-tandem").mkdir()
    (tmp_path / "my-tandem" / "kustomization.yaml").write_text(
        block.group(1).replace("REGISTRY", "registry.example.com"))
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path / "my-tandem")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    images = {c["image"] for c in containers_of([d for d in yaml.safe_load_all(out) if d])}
    version = yaml.safe_load((REPO / "charts/tandem/Chart.yaml").read_text())["appVersion"]
    assert {f"registry.example.com/tandem:{version}",
            f"registry.example.com/tandem-gpu:{version}"} <= images


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("overlay", ["sidecar", "standalone"])
def test_documented_model_store_patch_reaches_every_reader(overlay: str, tmp_path: Path) -> None:
    """The patch in docs/deploy.md puts one claim, and no placeholder, under the agents
    and the extender."""
    doc = (REPO / "docs" / "deploy.md").read_text()
    block = re.search(r"### The model store.*?```yaml\n(.*?)```", doc, re.S)
    assert block, "no model store patch in docs/deploy.md"
    (tmp_path / "manifests").symlink_to(MANIFESTS)
    (tmp_path / "my-tandem").mkdir()
    (tmp_path / "my-tandem" / "kustomization.yaml").write_text(
        f"resources: [../manifests/overlays/{overlay}]\n" + block.group(1))
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path / "my-tandem")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    objects = [d for d in yaml.safe_load_all(out) if d]
    config = yaml.safe_load(next(o for o in objects if o["metadata"]["name"] == "tandem-config")
                            ["data"]["tandem.yaml"])
    assert assert_one_read_only_model_store(objects, config) == {
        "persistentVolumeClaim": {"claimName": "tandem-models", "readOnly": True}}
    assert {k.rpartition(":")[2] for k in model_store_mounts(objects, "/srv/tandem")} == {
        "agent", "extender"}
