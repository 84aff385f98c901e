"""Security posture of the manifests and the image: non-root, read-only, no extra
privilege, least-privilege RBAC, no secrets committed."""

from __future__ import annotations

import re
from typing import Any

import pytest
from manifests_helpers import (
    MANIFESTS,
    OVERLAYS,
    assert_device_plugin_least_privilege,
    assert_one_read_only_model_store,
    assert_restricted_pod_security,
    container,
    containers_of,
    example_objects,
    find,
    pod_specs,
    resolve,
)

ALL = {o: resolve(MANIFESTS / "overlays" / o) for o in OVERLAYS}
WORKLOADS = [
    (f"{overlay}:{name}", spec)
    for overlay, objects in ALL.items()
    for name, spec in pod_specs(objects)
] + [(f"examples:{name}", spec) for name, spec in pod_specs(example_objects())]
REPO = MANIFESTS.parent


# The device plugin runs as root to create its socket in the kubelet's root-owned
# directory (the namespace's one documented exception besides the agent's hostPID);
# test_device_plugin_has_least_privilege checks what it gets instead.
RESTRICTED = [w for w in WORKLOADS if not w[0].endswith("DaemonSet/tandem-device-plugin")]


@pytest.mark.parametrize(("name", "spec"), RESTRICTED, ids=[n for n, _ in RESTRICTED])
def test_containers_meet_the_restricted_pod_security_level(name: str, spec: dict) -> None:
    assert_restricted_pod_security(spec)


def test_host_pid_only_for_the_agent() -> None:
    with_host_pid = {n for n, spec in WORKLOADS if spec.get("hostPID")}
    assert with_host_pid == {f"{o}:DaemonSet/tandem-agent" for o in OVERLAYS}


@pytest.mark.parametrize(("name", "spec"), WORKLOADS, ids=[n for n, _ in WORKLOADS])
def test_secrets_are_mounted_read_only_and_never_in_env_literals(name: str, spec: dict) -> None:
    secret_volumes = {v["name"] for v in spec.get("volumes", []) if "secret" in v}
    for c in spec["containers"]:
        for mount in c.get("volumeMounts", []):
            if mount["name"] in secret_volumes:
                assert mount.get("readOnly") is True, (c["name"], mount)
        for env in c.get("env", []):
            assert "secretKeyRef" not in env.get("valueFrom", {}), "token via file, not env"
            assert not re.search(r"token|password|key", env["name"], re.I) or "value" not in env


def test_no_secret_material_is_committed() -> None:
    for objects in ALL.values():
        assert not [o for o in objects if o["kind"] == "Secret"]
    for path in MANIFESTS.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "BEGIN PRIVATE KEY" not in text and "BEGIN CERTIFICATE" not in text, path


# The exact rules the extender needs (docs/deploy.md#rbac); anything more fails.
EXTENDER_RULES = {
    ("", "pods"): {"get", "list", "watch", "patch"},
    ("", "pods/binding"): {"create"},
    ("", "nodes"): {"get", "list", "watch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("", "pods/eviction"): {"create"},
    ("", "pods/status"): {"patch"},
    ("policy", "poddisruptionbudgets"): {"list"},
    ("authentication.k8s.io", "tokenreviews"): {"create"},  # reports.identity: service-account
}


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_extender_rbac_is_exactly_what_it_needs(overlay: str) -> None:
    objects = ALL[overlay]
    assert _rules(find(objects, "ClusterRole", "tandem-extender")) == EXTENDER_RULES
    leases = find(objects, "Role", "tandem-extender-leases")
    assert _rules(leases) == {("coordination.k8s.io", "leases"): {"create", "get", "watch",
                                                                  "update"},
                              ("", "configmaps"): {"create", "get", "list", "update"}}
    named = [r for r in leases["rules"] if set(r["verbs"]) & {"get", "update"}]
    # Leases by name; ConfigMaps (the placement records, one per node) only in the
    # extender's own namespace, which pod owners cannot write.
    assert all(r.get("resourceNames") or r["resources"] == ["configmaps"] for r in named)
    assert leases["metadata"]["namespace"] == "tandem-system"
    assert {n for r in named if r["resources"] == ["configmaps"]
            for n in r.get("resourceNames", ())} == {"tandem-learning"}
    assert not [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"]
                == "tandem-agent"], "the agent needs no API access"


def test_agent_daemonset_reads_nvml_without_privilege() -> None:
    ds = find(ALL["sidecar"], "DaemonSet", "tandem-agent")
    spec = ds["spec"]["template"]["spec"]
    agent = container(spec, "agent")
    env = {e["name"]: e for e in agent["env"]}
    assert spec["runtimeClassName"] == "nvidia"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node=$(NODE_NAME)" in agent["args"] and "--gpus=nvml" in agent["args"]
    assert spec["automountServiceAccountToken"] is False
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]}
    assert keys == {"tandem.io/gpu-node"}  # opted-in nodes only (test_install_node_opt_in)
    token_flag = next(a for a in agent["args"] if a.startswith("--token-file="))
    token_dir = token_flag.split("=", 1)[1].rsplit("/", 1)[0]
    mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == token_dir)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    # its own pod's token (test_install_agent_identity), not the shared Secret
    assert volume["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "tandem"


@pytest.mark.parametrize(("name", "spec"), [w for w in WORKLOADS if w[0].startswith("examples")],
                         ids=[n for n, _ in WORKLOADS if n.startswith("examples")])
def test_examples_get_their_gpu_by_the_documented_hand_off(name: str, spec: dict) -> None:
    """Default examples name no GPU (the device plugin hands it over); ``-env`` examples
    copy the bind annotation into NVIDIA_VISIBLE_DEVICES (components/env-handoff)."""
    (gpu_container,) = [c for c in spec["containers"]
                        if "tandem.io/gpu" in c["resources"].get("limits", {})]
    assert gpu_container["resources"]["limits"]["tandem.io/gpu"] == 1
    env = {e["name"]: e for e in gpu_container.get("env", [])}
    if name.endswith("-env"):
        ref = env["NVIDIA_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert ref == "metadata.annotations['tandem.io/gpu-uuid']"
    else:
        assert not [c for c in spec["containers"]
                    if any(e["name"] == "NVIDIA_VISIBLE_DEVICES" for e in c.get("env", []))]
    assert spec["runtimeClassName"] == "nvidia"


def test_both_hand_offs_have_an_example() -> None:
    names = [n for n, _ in WORKLOADS if n.startswith("examples:")]
    assert any(n.endswith("-env") for n in names)
    assert any(n.endswith("training") for n in names)


def test_images_are_pinned() -> None:
    for objects in [*ALL.values(), example_objects()]:
        for c in containers_of(objects):
            assert re.search(r":[\w.-]+$", c["image"]) and not c["image"].endswith(":latest")


def test_dockerfile_runs_unprivileged_without_torch() -> None:
    text = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert users[-1].split(":")[0] == "65532"  # the uid the manifests run as
    # torch only in the torch-executor variant (target gpu-torch) and its build stage.
    stages = re.split(r"^FROM ", re.sub(r"#.*", "", text), flags=re.M)[1:]
    with_torch = {s.split()[2] for s in stages if "torch" in s.partition("\n")[2]}
    assert with_torch == {"build-gpu-torch", "gpu-torch"}, with_torch
    assert re.search(r'^ENTRYPOINT \["tandem"\]', text, re.M)
    rules = [line for line in (REPO / ".dockerignore").read_text().splitlines()
             if line and not line.startswith("#")]
    assert rules[0] == "*", "deny by default, then allow what the image needs"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "LICENSE", "tandem", "extender", "agent",
                       "planner", "predictor", "contracts"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_device_plugin_has_least_privilege(overlay: str) -> None:
    ds = find(ALL[overlay], "DaemonSet", "tandem-device-plugin")
    spec = ds["spec"]["template"]["spec"]
    assert_device_plugin_least_privilege(spec)
    args = spec["containers"][0]["args"]
    assert args[:2] == ["agent", "device-plugin"] and "--shares=8" in args


def _signing_key_mounts(objects: list[dict]) -> list[tuple[str, str, dict, dict]]:
    """(workload, container, mount, volume) for every mount of the signing key's Secret."""
    found = []
    for name, spec in pod_specs(objects):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"] + spec.get("initContainers", []):
            for mount in c.get("volumeMounts", []):
                volume = volumes.get(mount["name"], {})
                secret = volume.get("secret", {}).get("secretName", "")
                if "signing-key" in secret:
                    found.append((name, c["name"], mount, volume))
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_extender_mounts_the_signing_key_read_only(overlay: str) -> None:
    """The key that signs placements (Secret tandem-signing-key) reaches the extender
    alone, read-only and owner/group-readable only, where state.signing_key_file says."""
    import yaml

    objects = ALL[overlay]
    mounts = _signing_key_mounts(objects)
    assert len(mounts) == 1, mounts
    (workload, name, mount, volume) = mounts[0]
    assert workload in ("Deployment/tandem-scheduler", "Deployment/tandem-extender")
    assert name == "extender"
    assert mount["readOnly"] is True and mount["mountPath"] == "/etc/tandem/signing-key"
    assert volume["secret"] == {"secretName": "tandem-signing-key", "defaultMode": 0o440}
    config = next(o for o in objects if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == "tandem-config")
    state = yaml.safe_load(config["data"]["tandem.yaml"])["state"]
    assert state["signing_key_file"] == "/etc/tandem/signing-key/key"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_owners_reach_only_the_model_store_through_the_extender(overlay: str) -> None:
    """A pod's tandem.io/model is read by the extender: the shipped config confines it to
    predictor.model_store (a reference outside is refused without looking), which the
    extender mounts read-only; the extender writes nowhere but /tmp."""
    import yaml

    from extender.config.schema import build_config

    objects = ALL[overlay]
    config = yaml.safe_load(find(objects, "ConfigMap", "tandem-config")["data"]["tandem.yaml"])
    root = build_config(config).predictor.model_store
    assert root == "/srv/tandem"
    assert_one_read_only_model_store(objects, config)
    for name, spec in pod_specs(objects):
        for c in spec["containers"]:
            if c["name"] == "extender":
                writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
                assert writable == {"/tmp"}, (name, writable)
