"""Shared by the manifest tests (no tests here): load YAML, resolve kustomizations, walk pods.

The resolver understands exactly what tandem's kustomizations use (``resources``,
``configMapGenerator`` with ``files`` and ``disableNameSuffixHash``, ``images``,
``components`` whose ``patches`` are strategic-merge files: ``$patch: delete`` of
one object, or a merge into the objects a ``target`` names, lists of named items
merged by name) and fails loudly on anything else, so a new kustomize feature
cannot slip in untested; tests/deploy/test_manifests_validate.py compares it with
``kubectl kustomize`` where kubectl is installed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "manifests"
OVERLAYS = ("sidecar", "standalone")
# The same two with the environment-variable GPU hand-off (components/env-handoff).
ENV_HANDOFF_OVERLAYS = ("sidecar-env-handoff", "standalone-env-handoff")
# Optional kustomizations applied after an overlay (they use its namespace and config).
ADDONS = ("queue-gate", "webhook")
MPS_OVERLAYS = ("sidecar-mps",)
"""overlays/sidecar with components/mps (the agent's MPS daemons, the plugin's limits)."""
K8S_VERSION = "1.30.0"  # oldest minor we document support for; see docs/deploy.md

# Objects the operator creates at install time (docs/deploy.md), never committed.
CREATED_AT_INSTALL = {
    ("Secret", "tandem-agent-token"),
    ("Secret", "tandem-admin-token"),
    ("Secret", "tandem-extender-tls"),
    ("Secret", "tandem-signing-key"),
    ("Secret", "tandem-scheduler-client"),
    ("ConfigMap", "tandem-extender-ca"),
}
# Cluster roles every Kubernetes cluster ships.
BUILT_IN_ROLES = {
    ("ClusterRole", "system:kube-scheduler"),
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}
_KNOWN_KUSTOMIZE_KEYS = {"apiVersion", "kind", "resources", "configMapGenerator", "images",
                         "components", "patches"}


def load_docs(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document in a file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def resolve(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` would emit (for our feature subset)."""
    kustomization = load_docs(directory / "kustomization.yaml")[0]
    unknown = set(kustomization) - _KNOWN_KUSTOMIZE_KEYS
    if unknown:
        raise AssertionError(f"{directory}: resolver does not support {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            objects.extend(resolve(target))
        else:
            objects.extend(load_docs(target))
    for generator in kustomization.get("configMapGenerator", []):
        options = generator.get("options", {})
        if not options.get("disableNameSuffixHash"):
            raise AssertionError(f"{directory}: hashed generator names are not resolved here")
        data = {}
        for spec in generator["files"]:
            key, _, rel = spec.partition("=") if "=" in spec else (Path(spec).name, "", spec)
            data[key] = (directory / rel).read_text()
        metadata = {"name": generator["name"], "namespace": generator["namespace"]}
        if options.get("labels"):
            metadata["labels"] = dict(options["labels"])
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                        "data": data})
    for component in kustomization.get("components", []):
        objects = _apply_component(objects, (directory / component).resolve())
    if kustomization.get("patches") and kustomization.get("kind") != "Component":
        raise AssertionError(f"{directory}: patches are resolved in components only")
    for image in kustomization.get("images", []):
        for container in containers_of(objects):
            repo, _, _tag = container["image"].rpartition(":")
            if repo == image["name"]:
                container["image"] = f"{image.get('newName', repo)}:{image['newTag']}"
    return objects


def _apply_component(objects: list[dict[str, Any]], directory: Path) -> list[dict[str, Any]]:
    component = load_docs(directory / "kustomization.yaml")[0]
    unknown = set(component) - {"apiVersion", "kind", "patches"}
    if component.get("kind") != "Component" or unknown:
        raise AssertionError(f"{directory}: not a patches-only Component ({sorted(unknown)})")
    for entry in component["patches"]:
        if set(entry) - {"path", "target"}:
            raise AssertionError(f"{directory}: patch entries take path and target only")
        (patch,) = load_docs(directory / entry["path"])
        target = entry.get("target")
        if patch.get("$patch") == "delete":
            meta = patch["metadata"]
            left = [o for o in objects if not (o["kind"] == patch["kind"] and
                                               o["metadata"]["name"] == meta["name"])]
            assert len(left) == len(objects) - 1, f"{directory}: nothing to delete"
            objects = left
            continue
        if target is None or set(target) - {"kind", "name"}:
            raise AssertionError(f"{directory}: merge patches need a kind/name target")
        for obj in objects:
            # kustomize matches a target name as an anchored regular expression.
            if obj["kind"] == target["kind"] and \
                    re.fullmatch(target["name"], obj["metadata"]["name"]):
                _merge(obj, {k: v for k, v in patch.items()
                             if k not in ("apiVersion", "kind", "metadata")})
    return objects


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    """Strategic merge as tandem's patches use it: maps merge, named lists merge by name
    (patch items first, as kustomize emits them), other values are replaced."""
    for key, value in patch.items():
        old = into.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            _merge(old, value)
        elif isinstance(value, list) and isinstance(old, list) and \
                all(isinstance(i, dict) and "name" in i for i in value + old):
            by_name = {i["name"]: i for i in old}
            merged = []
            for item in value:
                if item["name"] in by_name:
                    _merge(by_name.pop(item["name"]), item)
                    merged.append(next(i for i in old if i["name"] == item["name"]))
                else:
                    merged.append(item)
            into[key] = merged + [i for i in old if i["name"] in by_name]
        else:
            into[key] = value


def kustomize_files(directory: Path) -> set[Path]:
    """Every file a kustomization (and its bases) reads."""
    kustomization = load_docs(directory / "kustomization.yaml")[0]
    files = {directory / "kustomization.yaml"}
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        files |= kustomize_files(target) if target.is_dir() else {target}
    for generator in kustomization.get("configMapGenerator", []):
        for spec in generator["files"]:
            files.add((directory / spec.partition("=")[2] if "=" in spec else directory / spec)
                      .resolve())
    for component in kustomization.get("components", []):
        files |= kustomize_files((directory / component).resolve())
    for entry in kustomization.get("patches", []):
        files.add((directory / entry["path"]).resolve())
    return files


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(``Kind/name``, pod spec) for every object that runs pods."""
    for obj in objects:
        kind = obj["kind"]
        name = f"{kind}/{obj['metadata']['name']}"
        if kind == "Pod":
            yield name, obj["spec"]
        elif kind in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield name, obj["spec"]["template"]["spec"]


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(``Kind/name``, pod metadata) of every pod template or pod."""
    for obj in objects:
        if obj["kind"] == "Pod":
            yield f"Pod/{obj['metadata']['name']}", obj["metadata"]
        elif obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["metadata"]


def containers_of(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every container and init container of every pod-running object."""
    for _, spec in pod_specs(objects):
        yield from spec.get("initContainers", [])
        yield from spec["containers"]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of that kind and name."""
    hits = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} objects"
    return hits[0]


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    """The container called ``name``."""
    hits = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(hits) == 1, name
    return hits[0]


def example_objects() -> list[dict[str, Any]]:
    """The example workloads under manifests/examples/."""
    return [d for p in sorted((MANIFESTS / "examples").glob("*.yaml")) for d in load_docs(p)]


def _effective(spec: dict[str, Any], c: dict[str, Any], key: str) -> Any:
    return c.get("securityContext", {}).get(key, spec.get("securityContext", {}).get(key))


def assert_restricted_pod_security(spec: dict[str, Any]) -> None:
    """Fail unless every container of the pod spec meets the restricted Pod Security level."""
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        sc = c.get("securityContext", {})
        assert _effective(spec, c, "runAsNonRoot") is True, c["name"]
        assert _effective(spec, c, "runAsUser") not in (None, 0), c["name"]
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("privileged", False) is False, c["name"]
        assert sc.get("readOnlyRootFilesystem") is True, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        assert not sc.get("capabilities", {}).get("add"), c["name"]
        seccomp = sc.get("seccompProfile") or spec.get("securityContext", {}).get("seccompProfile")
        assert seccomp == {"type": "RuntimeDefault"}, c["name"]
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert all("hostPath" not in v for v in spec.get("volumes", []))


def assert_pod_references_exist(objects: list[dict[str, Any]], have: set[tuple[str, str]],
                                ) -> None:
    """Every pod's service account, ConfigMap and Secret volumes name an object in ``have``."""
    for name, spec in pod_specs(objects):
        assert ("ServiceAccount", spec["serviceAccountName"]) in have, name
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in have, (name, volume)
            if "secret" in volume:
                assert ("Secret", volume["secret"]["secretName"]) in have, (name, volume)


DEVICE_PLUGIN_HOST_PATHS = {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources",
                            "/etc/cdi", "/var/run/cdi"}


def assert_device_plugin_least_privilege(spec: dict[str, Any]) -> None:
    """The device plugin's exception to "restricted": root for the kubelet's socket
    directory and those host paths only; nothing else is granted."""
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc.get("privileged", False) is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork") and not spec.get("hostIPC") and not spec.get("hostPID")
    host = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host == DEVICE_PLUGIN_HOST_PATHS
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/kubelet/device-plugins", "/tmp"}


# Containers that read tandem.io/model files: the extender and the queue gate through
# predictor.model_store, the agent's inference servers through --model-store.
MODEL_READERS = ("extender", "queue-gate", "agent")


def model_store_mounts(objects: list[dict[str, Any]], root: str,
                       ) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """``Kind/name:container`` -> (its mount at ``root``, the volume mounted) for every
    container that reads models; fails if one of them lacks the mount."""
    found = {}
    for name, spec in pod_specs(objects):
        for c in spec["containers"]:
            if c["name"] not in MODEL_READERS:
                continue
            if c["name"] == "agent":
                if "--serve-gpus" not in c["args"]:
                    continue  # no inference servers, nothing to read
                assert f"--serve-arg=--model-store={root}" in c["args"], name
            mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == root]
            assert len(mounts) == 1, f"{name}:{c['name']} does not mount {root}"
            (volume,) = [v for v in spec["volumes"] if v["name"] == mounts[0]["name"]]
            found[f"{name}:{c['name']}"] = (mounts[0], volume)
    return found


def assert_one_read_only_model_store(objects: list[dict[str, Any]], config: dict[str, Any],
                                     ) -> dict[str, Any]:
    """The extender (and the agent's servers and the queue gate, where installed) mount one
    volume source, model-store, read-only at the config's predictor.model_store; returns it."""
    root = config["predictor"]["model_store"]
    assert isinstance(root, str) and root.startswith("/"), root
    mounts = model_store_mounts(objects, root)
    assert any(k.endswith(":extender") for k in mounts), sorted(mounts)
    sources = []
    for where, (mount, volume) in mounts.items():
        assert mount == {"name": "model-store", "mountPath": root, "readOnly": True}, where
        sources.append({k: v for k, v in volume.items() if k != "name"})
    assert all(s == sources[0] for s in sources), sources
    return sources[0]
