"""Node opt-in: with default values the chart and every kustomize overlay put their
node-level pods (agent, device plugin) only on nodes the admin labelled, never on a GPU
Operator node just because it has GPUs (NVIDIA's device plugin runs there)."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import render
from manifests_helpers import MANIFESTS, resolve
from test_chart_adoption import notes

OPTED_IN = {"tandem.io/gpu-node": "true"}
GPU_OPERATOR_NODE = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
                     "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
OVERLAYS = sorted(p.name for p in (MANIFESTS / "overlays").iterdir() if p.is_dir())


def _matches(requirement: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = requirement["key"], requirement["operator"], requirement.get("values", [])
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not modelled")


def schedulable_on(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a pod spec's nodeSelector and required node affinity admit a node."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True
    return any(all(_matches(r, labels) for r in term.get("matchExpressions", []))
               for term in required["nodeSelectorTerms"])


def daemonsets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {o["metadata"]["name"]: o["spec"]["template"]["spec"]
             for o in objects if o["kind"] == "DaemonSet"}
    assert "tandem-agent" in found, found.keys()
    return found


@pytest.mark.parametrize("source", ["chart", *OVERLAYS])
def test_node_level_pods_run_only_on_opted_in_nodes(source: str) -> None:
    objects = render() if source == "chart" else resolve(MANIFESTS / "overlays" / source)
    for name, spec in daemonsets(objects).items():
        assert not schedulable_on(spec, {}), name
        assert not schedulable_on(spec, GPU_OPERATOR_NODE), name
        assert schedulable_on(spec, {**GPU_OPERATOR_NODE, **OPTED_IN}), name
        assert schedulable_on(spec, OPTED_IN), name


def test_the_opt_in_label_is_a_value() -> None:
    for spec in daemonsets(render("nodeOptIn.label=pool", "nodeOptIn.value=gpu-a")).values():
        assert schedulable_on(spec, {"pool": "gpu-a"})
        assert not schedulable_on(spec, OPTED_IN)


def test_install_notes_name_the_label_and_warn_about_unset_images() -> None:
    default = notes()
    assert "kubectl label node NODE tandem.io/gpu-node=true" in default
    assert "nvidia.com/gpu.deploy.device-plugin=false" in default
    assert "image.registry is unset" in default and "ImagePullBackOff" in default
    assert "image.registry is unset" not in notes("image.registry=ghcr.io/example")
