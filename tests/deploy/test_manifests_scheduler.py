"""The KubeSchedulerConfiguration files carry what the extender protocol requires,
and agree with the Deployment, tandem's config and the example pods."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from manifests_helpers import (
    MANIFESTS,
    container,
    example_objects,
    find,
    load_docs,
    pod_specs,
    resolve,
)

SIDECAR = "overlays/sidecar/kube-scheduler-config.yaml"
STANDALONE = "overlays/standalone/kube-scheduler-extender.yaml"
CONFIGS = (SIDECAR, STANDALONE)

# kubescheduler.config.k8s.io/v1 Extender and ExtenderTLSConfig fields (research 1.3).
EXTENDER_KEYS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
    "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
    "ignorable",
}
TLS_KEYS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData",
            "keyData", "caData"}
TOP_KEYS = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
            "healthzBindAddress", "metricsBindAddress", "enableProfiling",
            "enableContentionProfiling", "percentageOfNodesToScore", "podInitialBackoffSeconds",
            "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive"}
# IsExtendedResourceName: a qualified name with a domain prefix outside kubernetes.io.
_QUALIFIED = re.compile(
    r"^(?P<prefix>[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/"
    r"(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$"
)
_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$")
VERBS = {"filterVerb": "filter", "prioritizeVerb": "prioritize", "bindVerb": "bind"}


def _config(rel: str) -> dict[str, Any]:
    (doc,) = load_docs(MANIFESTS / rel)
    return doc


def is_extended_resource_name(name: str) -> bool:
    """Mirror of kube's v1helper.IsExtendedResourceName for the names we use."""
    match = _QUALIFIED.match(name)
    if not match or len(match["name"]) > 63:
        return False
    prefix = match["prefix"]
    return not (prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")
                or name.startswith("requests."))


@pytest.mark.parametrize(
    ("name", "valid"),
    [("tandem.io/gpu", True), ("kubernetes.io/gpu", False), ("gpu", False),
     ("Tandem.io/gpu", False), ("tandem.io/", False)],
    ids=["ours", "kubernetes-domain", "no-prefix", "uppercase-domain", "empty-name"],
)
def test_extended_resource_name_check(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid


@pytest.mark.parametrize("rel", CONFIGS)
def test_configuration_uses_only_known_v1_fields(rel: str) -> None:
    cfg = _config(rel)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert set(cfg) <= TOP_KEYS
    for ext in cfg["extenders"]:
        assert set(ext) <= EXTENDER_KEYS, set(ext) - EXTENDER_KEYS
        assert set(ext.get("tlsConfig", {})) <= TLS_KEYS
        for res in ext.get("managedResources", []):
            assert set(res) <= {"name", "ignoredByScheduler"}


@pytest.mark.parametrize("rel", CONFIGS)
def test_extender_entry_satisfies_the_protocol(rel: str) -> None:
    (ext,) = _config(rel)["extenders"]
    for key, verb in VERBS.items():
        assert ext[key] == verb, key  # the paths extender's server routes
    # kube-scheduler's preemption never reaches an extender for tandem.io/gpu (its dry run
    # ignores the resource): tandem preempts itself, and the verb stays off.
    assert "preemptVerb" not in ext
    # validateExtenders: a prioritizer needs a positive integer weight.
    assert isinstance(ext["weight"], int) and not isinstance(ext["weight"], bool)
    assert ext["weight"] > 0
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert _DURATION.match(ext["httpTimeout"]), ext["httpTimeout"]
    (managed,) = ext["managedResources"]
    assert managed == {"name": "tandem.io/gpu", "ignoredByScheduler": True}
    assert is_extended_resource_name(managed["name"])
    assert ext["urlPrefix"].startswith("https://") and ext["enableHTTPS"] is True
    tls = ext["tlsConfig"]
    assert tls.get("insecure", False) is False and tls["caFile"].endswith("ca.crt")


@pytest.mark.parametrize("rel", CONFIGS)
def test_exactly_one_binder_and_unique_managed_resources(rel: str) -> None:
    extenders = _config(rel)["extenders"]
    assert sum(1 for e in extenders if e.get("bindVerb")) == 1
    names = [r["name"] for e in extenders for r in e.get("managedResources", [])]
    assert len(names) == len(set(names))


def test_weight_and_timeout_are_the_documented_ones() -> None:
    (ext,) = _config(SIDECAR)["extenders"]
    docs = (MANIFESTS.parent / "docs/deploy.md").read_text()
    assert f"weight: {ext['weight']}" in docs
    assert f"httpTimeout: {ext['httpTimeout']}" in docs
    (other,) = _config(STANDALONE)["extenders"]
    assert (other["weight"], other["httpTimeout"]) == (ext["weight"], ext["httpTimeout"])


def test_sidecar_deployment_wires_the_configuration() -> None:
    objects = resolve(MANIFESTS / "overlays" / "sidecar")
    cfg = _config(SIDECAR)
    deploy = find(objects, "Deployment", "tandem-scheduler")
    spec = deploy["spec"]["template"]["spec"]
    scheduler = container(spec, "kube-scheduler")
    extender = container(spec, "extender")
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in scheduler["volumeMounts"]}

    config_flag = next(a for a in scheduler["command"] if a.startswith("--config="))
    config_path = config_flag.split("=", 1)[1]
    directory, _, key = config_path.rpartition("/")
    config_map = find(objects, "ConfigMap", volumes[mounts[directory]]["configMap"]["name"])
    assert yaml.safe_load(config_map["data"][key]) == cfg

    ca_dir, _, ca_key = cfg["extenders"][0]["tlsConfig"]["caFile"].rpartition("/")
    assert volumes[mounts[ca_dir]]["secret"]["secretName"] == "tandem-extender-tls"
    assert ca_key == "ca.crt"

    url_port = int(cfg["extenders"][0]["urlPrefix"].rsplit(":", 1)[1])
    assert url_port in {p["containerPort"] for p in extender["ports"]}
    tandem_cfg = yaml.safe_load(find(objects, "ConfigMap", "tandem-config")["data"]["tandem.yaml"])
    assert tandem_cfg["server"]["port"] == url_port
    assert f"--port={url_port}" in extender["args"]

    election = cfg["leaderElection"]
    assert election["leaderElect"] is True and election["resourceLock"] == "leases"
    assert election["resourceNamespace"] == deploy["metadata"]["namespace"]
    role = find(objects, "Role", "tandem-extender-leases")
    named = {n for rule in role["rules"] for n in rule.get("resourceNames", [])}
    assert election["resourceName"] in named
    assert deploy["spec"]["replicas"] >= 2  # the election has someone to fail over to


def test_example_pods_use_the_tandem_profile_and_resource() -> None:
    (profile,) = _config(SIDECAR)["profiles"]
    resource = _config(SIDECAR)["extenders"][0]["managedResources"][0]["name"]
    specs = list(pod_specs(example_objects()))
    assert {n.split("/")[0] for n, _ in specs} == {"Pod", "Deployment"}
    for name, spec in specs:
        assert spec["schedulerName"] == profile["schedulerName"], name
        limits = [c["resources"]["limits"].get(resource) for c in spec["containers"]]
        assert limits.count(1) == 1, name  # exactly one container asks for one GPU
