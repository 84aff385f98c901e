"""``manifests/addons/queue-gate``: validates strictly, is consistent with each overlay
it is applied after, meets the restricted security level, asks only for the RBAC the
controller uses, and runs a command line the CLI accepts."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from manifests_helpers import (
    ADDONS,
    CREATED_AT_INSTALL,
    K8S_VERSION,
    MANIFESTS,
    OVERLAYS,
    assert_restricted_pod_security,
    container,
    find,
    pod_specs,
    resolve,
)

ADDON = {name: resolve(MANIFESTS / "addons" / name) for name in ADDONS}
GATE = ADDON["queue-gate"]


@pytest.mark.parametrize("addon", ADDONS)
def test_addon_objects_validate_strictly(addon: str) -> None:
    for obj in ADDON[addon]:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_addon_on_top_of_each_overlay_is_self_consistent(overlay: str) -> None:
    objects = resolve(MANIFESTS / "overlays" / overlay) + GATE
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), "the add-on redefines an overlay object"
    have = {(o["kind"], o["metadata"]["name"]) for o in objects} | CREATED_AT_INSTALL
    for name, spec in pod_specs(GATE):
        assert ("ServiceAccount", spec["serviceAccountName"]) in have, name
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in have, volume
    for obj in GATE:
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert (obj["roleRef"]["kind"], obj["roleRef"]["name"]) in have


@pytest.mark.parametrize(("name", "spec"), list(pod_specs(GATE)),
                         ids=[n for n, _ in pod_specs(GATE)])
def test_gate_pods_meet_the_restricted_level(name: str, spec: dict[str, Any]) -> None:
    assert_restricted_pod_security(spec)


def _rules(kind: str, name: str) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {(group, resource, verb, tuple(rule.get("resourceNames", ())))
            for rule in find(GATE, kind, name)["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"]
            for verb in rule["verbs"]}


def test_rbac_is_exactly_what_the_controller_calls() -> None:
    # list_pod_for_all_namespaces + patch_namespaced_pod (the release, and the leader label).
    assert _rules("ClusterRole", "tandem-queue-gate") == {
        ("", "pods", "list", ()), ("", "pods", "patch", ())}
    assert _rules("Role", "tandem-queue-gate-leases") == {
        ("coordination.k8s.io", "leases", "create", ()),
        *{("coordination.k8s.io", "leases", verb, ("tandem-queue-gate",))
          for verb in ("get", "watch", "update")}}


def test_gate_command_line_matches_the_cli_and_its_lease() -> None:
    from typer.main import get_command

    from extender import commands

    spec = find(GATE, "Deployment", "tandem-queue-gate")["spec"]["template"]["spec"]
    args = container(spec, "queue-gate")["args"]
    assert args[:2] == ["extender", "queue-gate"]
    options = {p.opts[0] for p in get_command(commands.app).commands["queue-gate"].params}
    for arg in args[2:]:
        assert arg.split("=", 1)[0] in options, arg
    assert "--lease-name=tandem-queue-gate" in args and "--leadership=elect" in args
    env = {e["name"] for e in container(spec, "queue-gate")["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env  # required by --leadership=elect


@pytest.mark.parametrize("example", ["training-pod.yaml", "inference-deployment.yaml"])
def test_commented_gate_in_examples_validates_and_is_found_by_the_controller(
        example: str) -> None:
    import yaml

    from extender.queue.gate import gate_index

    lines = (MANIFESTS / "examples" / example).read_text().splitlines()
    wanted = ("# schedulingGates:", "#   - name: tandem.io/queue")
    hits = [i for i, line in enumerate(lines) if line.strip() in wanted]
    assert len(hits) == 2 and hits[1] == hits[0] + 1, "the optional gate lines moved"
    for i in hits:
        lines[i] = lines[i].replace("# ", "", 1)
    enabled = "\n".join(lines)
    for doc in (d for d in yaml.safe_load_all(enabled) if d):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        pod = doc if doc["kind"] == "Pod" else doc["spec"]["template"]
        assert gate_index(pod) == 0
