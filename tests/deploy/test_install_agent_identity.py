"""Per-node agent identity in the shipped installs: the chart and every overlay run
``reports.identity: service-account`` with what it needs (the agent's projected token
for the configured audience, TokenReviews and pod reads for the extender); the shared
token is the chart's explicit choice."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from chart_helpers import helm_template, render
from manifests_helpers import MANIFESTS, find, resolve

from extender.config.schema import build_config

OVERLAYS = sorted(p.name for p in (MANIFESTS / "overlays").iterdir() if p.is_dir())


def _grants(role: dict[str, Any], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               and not r.get("resourceNames") for r in role["rules"])


def _agent(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = find(objects, "DaemonSet", "tandem-agent")["spec"]["template"]["spec"]
    (agent,) = [c for c in spec["containers"] if c["name"] == "agent"]
    return spec, agent


def _token_file(agent: dict[str, Any]) -> str:
    (arg,) = [a for a in agent["args"] if a.startswith("--token-file=")]
    return arg.removeprefix("--token-file=")


def _volume_of(spec: dict[str, Any], agent: dict[str, Any], path: str) -> dict[str, Any]:
    (mount,) = [m for m in agent["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    return next(v for v in spec["volumes"] if v["name"] == mount["name"])


@pytest.mark.parametrize("source", ["chart", *OVERLAYS])
def test_installs_run_per_node_identity_with_what_it_needs(source: str) -> None:
    objects = render() if source == "chart" else resolve(MANIFESTS / "overlays" / source)
    config = yaml.safe_load(find(objects, "ConfigMap", "tandem-config")["data"]["tandem.yaml"])
    reports = build_config(config).reports
    assert reports.identity == "service-account"
    spec, agent = _agent(objects)
    namespace = find(objects, "DaemonSet", "tandem-agent")["metadata"]["namespace"]
    assert reports.service_account == f"{namespace}/{spec['serviceAccountName']}"
    volume = _volume_of(spec, agent, _token_file(agent))
    (projected,) = volume["projected"]["sources"]
    token = projected["serviceAccountToken"]
    assert token["audience"] == reports.audience and token["expirationSeconds"] <= 3600
    assert spec["automountServiceAccountToken"] is False  # no API token, only this one
    role = find(objects, "ClusterRole", "tandem-extender")
    assert _grants(role, "authentication.k8s.io", "tokenreviews", "create")
    assert _grants(role, "", "pods", "get")  # the agent's pod, for its node
    agent_sa_roles = [b for b in objects if b["kind"].endswith("RoleBinding") and any(
        s.get("name") == "tandem-agent" for s in b.get("subjects", []))]
    assert agent_sa_roles == []  # the agent still needs no API access


def test_the_shared_token_is_an_explicit_choice() -> None:
    objects = render("config.reports.identity=shared-token")
    config = yaml.safe_load(find(objects, "ConfigMap", "tandem-config")["data"]["tandem.yaml"])
    assert build_config(config).reports.identity == "shared-token"
    spec, agent = _agent(objects)
    assert "secret" in _volume_of(spec, agent, _token_file(agent))
    role = find(objects, "ClusterRole", "tandem-extender")
    assert not _grants(role, "authentication.k8s.io", "tokenreviews", "create")


def test_a_misspelt_identity_fails_the_render() -> None:
    result = helm_template("config.reports.identity=service_account", check=False)
    assert result.returncode != 0 and "service-account or shared-token" in result.stderr
