"""Every manifest parses, validates against the Kubernetes API schemas offline, and
every kustomization resolves to a self-consistent set of objects."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from manifests_helpers import (
    ADDONS,
    BUILT_IN_ROLES,
    CREATED_AT_INSTALL,
    ENV_HANDOFF_OVERLAYS,
    K8S_VERSION,
    MANIFESTS,
    MPS_OVERLAYS,
    OVERLAYS,
    assert_pod_references_exist,
    example_objects,
    find,
    kustomize_files,
    load_docs,
    pod_specs,
    pod_templates,
    resolve,
)

from extender.config.loader import apply_env

ALL_OVERLAYS = OVERLAYS + ENV_HANDOFF_OVERLAYS + MPS_OVERLAYS
# Files under manifests/ that are not Kubernetes API objects, each with why.
NOT_API_OBJECTS = {
    "base/config/tandem.yaml": "tandem's own config, packed into a ConfigMap",
    "overlays/sidecar/kube-scheduler-config.yaml": "KubeSchedulerConfiguration, in a ConfigMap",
    "addons/webhook/webhook.yaml": "the admission webhook's settings, in a ConfigMap",
    "components/mps/agent-mps.yaml": "a kustomize patch (partial)",
    "components/mps/device-plugin-mps.yaml": "a kustomize patch (partial)",
    "overlays/standalone/kube-scheduler-extender.yaml": "snippet for an existing scheduler",
    "components/env-handoff/no-device-plugin.yaml": "a kustomize patch ($patch: delete)",
    "components/env-handoff/extender-env-mode-sidecar.yaml": "a kustomize patch (partial)",
    "components/env-handoff/extender-env-mode-standalone.yaml": "a kustomize patch (partial)",
}
# Not referenced by any kustomization, on purpose.
APPLIED_SEPARATELY = {
    "overlays/standalone/kube-scheduler-extender.yaml",
    "examples/training-pod.yaml",
    "examples/inference-deployment.yaml",
    "examples/training-pod-env.yaml",
}


def _yaml_files() -> list[Path]:
    return sorted(MANIFESTS.rglob("*.yaml"))


def _api_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in _yaml_files():
        rel = path.relative_to(MANIFESTS).as_posix()
        if rel in NOT_API_OBJECTS or path.name == "kustomization.yaml":
            continue
        for doc in load_docs(path):
            docs.append((f"{rel}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


API_DOCS = _api_documents()


def test_there_is_something_to_validate() -> None:
    kinds = {doc["kind"] for _, doc in API_DOCS}
    assert {"Deployment", "DaemonSet", "ClusterRole", "Service", "Pod"} <= kinds


@pytest.mark.parametrize(("ident", "doc"), API_DOCS, ids=[i for i, _ in API_DOCS])
def test_object_validates_strictly_against_the_api_schema(ident: str, doc: dict) -> None:
    # strict: unknown fields (typos such as `readOnlyRootFileSystem`) fail too.
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", ALL_OVERLAYS)
def test_resolved_overlay_validates_including_generated_config_maps(overlay: str) -> None:
    for obj in resolve(MANIFESTS / "overlays" / overlay):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_schema_validation_catches_a_typo() -> None:
    bad = yaml.safe_load(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"
        "spec: {containers: [{name: c, image: i, securityContext: {readOnlyRootFileSystem: true}}]}"
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_every_yaml_file_is_used_and_every_reference_exists() -> None:
    used: set[Path] = set()
    for overlay in ALL_OVERLAYS:
        files = kustomize_files(MANIFESTS / "overlays" / overlay)
        missing = sorted(str(f) for f in files if not f.is_file())
        assert not missing, f"{overlay} references missing files: {missing}"
        used |= files
    for addon in ADDONS:
        used |= kustomize_files(MANIFESTS / "addons" / addon)
    stray = [
        p.relative_to(MANIFESTS).as_posix()
        for p in _yaml_files()
        if p.resolve() not in used and p.relative_to(MANIFESTS).as_posix() not in APPLIED_SEPARATELY
    ]
    assert not stray, f"YAML files no kustomization lists: {stray}"


@pytest.mark.parametrize("overlay", ALL_OVERLAYS)
def test_overlay_is_self_consistent(overlay: str) -> None:
    objects = resolve(MANIFESTS / "overlays" / overlay)
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), "duplicate objects"
    have = {(o["kind"], o["metadata"]["name"]) for o in objects} | CREATED_AT_INSTALL
    assert_pod_references_exist(objects, have)
    for obj in objects:
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            ref = (obj["roleRef"]["kind"], obj["roleRef"]["name"])
            assert ref in have or ref in BUILT_IN_ROLES, obj["metadata"]["name"]
            for subject in obj["subjects"]:
                assert ("ServiceAccount", subject["name"]) in have


@pytest.mark.parametrize("overlay", ALL_OVERLAYS)
def test_selectors_match_their_pods(overlay: str) -> None:
    objects = resolve(MANIFESTS / "overlays" / overlay)
    templates = dict(pod_templates(objects))
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet"):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()
        if obj["kind"] == "Service":
            selector = dict(obj["spec"]["selector"])
            # The leader label is set at run time by extender/ha/leader.py (PodLabeler).
            assert selector.pop("tandem.io/leader") == "true"
            matching = [n for n, meta in templates.items()
                        if selector.items() <= meta["labels"].items()]
            assert len(matching) == 1, (obj["metadata"]["name"], matching)
            port_names = {
                p["name"] for _, spec in pod_specs(objects) for c in spec["containers"]
                for p in c.get("ports", [])
            }
            assert {p["targetPort"] for p in obj["spec"]["ports"]} <= port_names


def test_examples_validate() -> None:
    for obj in example_objects():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("overlay", ALL_OVERLAYS)
def test_resolver_agrees_with_kubectl_kustomize(overlay: str) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS / "overlays" / overlay)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    theirs = [d for d in yaml.safe_load_all(out) if d]
    ours = resolve(MANIFESTS / "overlays" / overlay)

    def key(o: dict) -> tuple:
        return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])

    assert sorted(map(key, theirs)) == sorted(map(key, ours))
    by_key = {key(o): o for o in ours}
    for obj in theirs:
        assert obj == by_key[key(obj)], key(obj)


def _effective_handoff(objects: list[dict[str, Any]]) -> str:
    """handoff.mode as the extender reads it: tandem.yaml, then its TANDEM__* variables."""
    config = yaml.safe_load(find(objects, "ConfigMap", "tandem-config")["data"]["tandem.yaml"])
    (extender,) = [c for _, spec in pod_specs(objects) for c in spec["containers"]
                   if c["name"] == "extender"]
    env = {e["name"]: e["value"] for e in extender.get("env", []) if "value" in e}
    return apply_env(config, env)["handoff"]["mode"]


@pytest.mark.parametrize(("overlay", "mode", "plugin"), [
    ("sidecar", "device-plugin", True), ("standalone", "device-plugin", True),
    ("sidecar-env-handoff", "env", False), ("standalone-env-handoff", "env", False)])
def test_handoff_mode_and_device_plugin_go_together(overlay: str, mode: str,
                                                    plugin: bool) -> None:
    objects = resolve(MANIFESTS / "overlays" / overlay)
    assert _effective_handoff(objects) == mode
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert (("DaemonSet", "tandem-device-plugin") in names) is plugin
    assert ("DaemonSet", "tandem-agent") in names


def test_generated_config_maps_hold_the_files() -> None:
    objects = resolve(MANIFESTS / "overlays" / "sidecar")
    tandem = find(objects, "ConfigMap", "tandem-config")
    assert tandem["data"]["tandem.yaml"] == (MANIFESTS / "base/config/tandem.yaml").read_text()
    scheduler = find(objects, "ConfigMap", "tandem-scheduler-config")
    assert "kube-scheduler-config.yaml" in scheduler["data"]
