"""Chart and kustomize values for adoption: each new value rendered, validated strictly
against the Kubernetes schemas, and checked for what it says (webhook, cert-manager, ...)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart_helpers import helm_template, render
from manifests_helpers import (
    K8S_VERSION,
    MANIFESTS,
    assert_restricted_pod_security,
    find,
    pod_specs,
    resolve,
)

from extender.webhook.mutate import parse_settings

CRD_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")


def validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if not obj["apiVersion"].startswith(CRD_GROUPS):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def webhook_checks(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The webhook's pieces agree: settings load, ports line up, restricted pods."""
    validate(objects)
    settings = yaml.safe_load(find(objects, "ConfigMap", "tandem-webhook-config")
                              ["data"]["webhook.yaml"])
    parse_settings(settings)
    deployment = find(objects, "Deployment", "tandem-webhook")
    spec = deployment["spec"]["template"]["spec"]
    assert_restricted_pod_security(spec)
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    port = container["ports"][0]["containerPort"]
    assert f"--port={port}" in container["args"]
    service = find(objects, "Service", "tandem-webhook")
    assert service["spec"]["ports"][0]["targetPort"] == "https"
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    (hook,) = find(objects, "MutatingWebhookConfiguration", "tandem-webhook")["webhooks"]
    assert hook["clientConfig"]["service"]["name"] == "tandem-webhook"
    assert hook["clientConfig"]["service"]["port"] == service["spec"]["ports"][0]["port"]
    assert hook["failurePolicy"] in ("Ignore", "Fail")
    assert hook["rules"][0]["resources"] == ["pods"] and hook["sideEffects"] == "None"
    return hook


def test_chart_webhook_off_by_default() -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render()}
    assert ("MutatingWebhookConfiguration", "tandem-webhook") not in kinds
    assert ("Deployment", "tandem-webhook") not in kinds


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_chart_webhook_trusts_the_generated_ca_and_its_name_is_in_the_certificate(
        tmp_path: Path) -> None:
    objects = render("webhook.enabled=true", "webhook.failurePolicy=Fail",
                     "webhook.settings.translate_nvidia_gpu=true",
                     "webhook.settings.default_annotations.tandem\\.io/gpu-mem-mib=8192")
    hook = webhook_checks(objects)
    assert hook["failurePolicy"] == "Fail"
    tls = find(objects, "Secret", "tandem-extender-tls")["data"]
    assert hook["clientConfig"]["caBundle"] == tls["ca.crt"]
    settings = parse_settings(yaml.safe_load(
        find(objects, "ConfigMap", "tandem-webhook-config")["data"]["webhook.yaml"]))
    assert settings.translate_nvidia_gpu
    assert settings.default_annotations == {"tandem.io/gpu-mem-mib": "8192"}
    (tmp_path / "tls.crt").write_bytes(base64.b64decode(tls["tls.crt"]))
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", tmp_path / "tls.crt"],
                          capture_output=True, text=True, check=True).stdout
    assert "DNS:tandem-webhook.tandem-system.svc" in text


def test_chart_webhook_with_an_existing_secret_takes_the_ca_from_values() -> None:
    hook = webhook_checks(render("webhook.enabled=true", "tls.generate=false",
                                 "webhook.caBundle=PEM"))
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == b"PEM"


def test_cert_manager_makes_the_certificate_and_injects_the_webhook_ca() -> None:
    objects = render("tls.generate=false", "certManager.enabled=true",
                     "certManager.issuerRef.name=tandem-ca", "webhook.enabled=true")
    cert = find(objects, "Certificate", "tandem-extender")
    assert cert["spec"]["secretName"] == "tandem-extender-tls"
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": "tandem-ca"}
    assert {"tandem-extender.tandem-system.svc", "localhost",
            "tandem-webhook.tandem-system.svc"} <= set(cert["spec"]["dnsNames"])
    assert cert["spec"]["ipAddresses"] == ["127.0.0.1"]
    config = find(objects, "MutatingWebhookConfiguration", "tandem-webhook")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        "tandem-system/tandem-extender-tls"
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    assert not any(o["kind"] == "Secret" and o["metadata"]["name"] == "tandem-extender-tls"
                   for o in objects)  # cert-manager owns it
    webhook_checks(objects)


@pytest.mark.parametrize(("sets", "message"), [
    (["certManager.enabled=true", "certManager.issuerRef.name=x"], "tls.generate=false"),
    (["certManager.enabled=true", "tls.generate=false"], "issuerRef.name"),
])
def test_cert_manager_misconfigurations_fail_with_a_message(sets: list[str],
                                                            message: str) -> None:
    result = helm_template(*sets, check=False)
    assert result.returncode != 0 and message in result.stderr


def test_kustomize_webhook_addon_matches_the_chart() -> None:
    objects = resolve(MANIFESTS / "addons/webhook")
    webhook_checks(objects)
    addon = yaml.safe_load(find(objects, "ConfigMap", "tandem-webhook-config")
                           ["data"]["webhook.yaml"])
    chart = yaml.safe_load((MANIFESTS.parent / "charts/tandem/values.yaml").read_text())
    assert addon == chart["webhook"]["settings"]
    # the generated certificate names the webhook's Service, so the API server can call it
    script = (MANIFESTS / "tls/generate-certs.sh").read_text()
    assert "DNS:${webhook}.${ns}.svc" in script
    assert json.dumps(sorted(p for p, _ in pod_specs(objects))) == \
        '["Deployment/tandem-webhook"]'


# --- where pods run, ports, resources -------------------------------------------

def pod_spec(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return dict(pod_specs(objects))[name]


def test_placement_values_reach_each_component() -> None:
    objects = render(
        "agent.nodeSelector.pool=tandem", "agent.priorityClassName=gpu-critical",
        "agent.runtimeClassName=nvidia-cdi",
        "agent.tolerations[0].key=dedicated", "agent.tolerations[0].operator=Exists",
        "devicePlugin.nodeSelector.pool=tandem", "devicePlugin.runtimeClassName=",
        "devicePlugin.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=tandem.io/gpu-node",
        "devicePlugin.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "extender.nodeSelector.role=control", "extender.priorityClassName=",
        "extender.tolerations[0].key=control", "extender.tolerations[0].operator=Exists",
        "kubeScheduler.resources.requests.cpu=300m",
        "kubeScheduler.resources.limits.memory=1Gi")
    validate(objects)
    agent = pod_spec(objects, "DaemonSet/tandem-agent")
    assert agent["nodeSelector"] == {"pool": "tandem"}
    assert (agent["priorityClassName"], agent["runtimeClassName"]) == (
        "gpu-critical", "nvidia-cdi")
    assert [t["key"] for t in agent["tolerations"]] == [
        "nvidia.com/gpu", "tandem.io/gpu", "dedicated"]  # added to the defaults
    assert "tandem.io/gpu-node" in json.dumps(agent["affinity"])  # default kept
    plugin = pod_spec(objects, "DaemonSet/tandem-device-plugin")
    assert "runtimeClassName" not in plugin  # empty: the node's default runtime
    assert json.dumps(plugin["affinity"]).count("matchExpressions") == 1  # replaced
    scheduler = pod_spec(objects, "Deployment/tandem-scheduler")
    assert scheduler["nodeSelector"] == {"role": "control"}
    assert "priorityClassName" not in scheduler
    assert scheduler["tolerations"] == [{"key": "control", "operator": "Exists"}]
    assert "podAntiAffinity" in scheduler["affinity"]
    kube_scheduler = next(c for c in scheduler["containers"] if c["name"] == "kube-scheduler")
    assert kube_scheduler["resources"] == {"requests": {"cpu": "300m", "memory": "128Mi"},
                                           "limits": {"memory": "1Gi"}}


def test_defaults_keep_the_previous_placement() -> None:
    objects = render()
    agent = pod_spec(objects, "DaemonSet/tandem-agent")
    assert (agent["priorityClassName"], agent["runtimeClassName"]) == (
        "system-node-critical", "nvidia")
    assert "nodeSelector" not in agent
    scheduler = pod_spec(objects, "Deployment/tandem-scheduler")
    assert scheduler["priorityClassName"] == "system-cluster-critical"
    assert "tolerations" not in scheduler


def test_standalone_extender_takes_the_same_placement_values() -> None:
    objects = render("topology=standalone", "extender.nodeSelector.role=control",
                     "extender.priorityClassName=high")
    extender = pod_spec(objects, "Deployment/tandem-extender")
    assert extender["nodeSelector"] == {"role": "control"}
    assert extender["priorityClassName"] == "high"


def test_serve_ports_follow_their_base_and_count() -> None:
    objects = render("agent.servePortBase=9700", "agent.maxGpusPerNode=2")
    validate(objects)
    (agent,) = pod_spec(objects, "DaemonSet/tandem-agent")["containers"]
    infer = [p for p in agent["ports"] if p["name"].endswith("-infer")]
    assert [(p["containerPort"], p["hostPort"]) for p in infer] == [(9700, 9700),
                                                                   (9701, 9701)]
    assert "--session-base-port=9700" in agent["args"]


def test_mps_value_runs_the_daemons_and_points_the_device_plugin_at_them() -> None:
    objects = render("mps.enabled=true", "mps.root=/run/x/mps", "mps.threadPercentage=true")
    validate(objects)
    agent_spec = pod_spec(objects, "DaemonSet/tandem-agent")
    (agent,) = agent_spec["containers"]
    assert {"--mps", "--mps-root=/run/x/mps"} <= set(agent["args"])
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["mps"]["mountPath"] == "/run/x/mps" and not mounts["mps"].get("readOnly")
    assert mounts["mps-shm"]["mountPath"] == "/dev/shm"
    volumes = {v["name"]: v for v in agent_spec["volumes"]}
    assert volumes["mps-shm"]["hostPath"]["path"] == "/run/x/mps/shm"
    plugin_spec = pod_spec(objects, "DaemonSet/tandem-device-plugin")
    (plugin,) = plugin_spec["containers"]
    assert {"--mps-root=/run/x/mps", "--mps-thread-percentage"} <= set(plugin["args"])
    assert {m["name"]: m for m in plugin["volumeMounts"]}["mps"]["readOnly"] is True
    off = render()
    (agent,) = pod_spec(off, "DaemonSet/tandem-agent")["containers"]
    assert not any(a.startswith("--mps") for a in agent["args"])


# --- NetworkPolicy ------------------------------------------------------------------

def policy(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((o for o in objects if o["kind"] == "NetworkPolicy"), None)


def labels(objects: list[dict[str, Any]], name: str) -> dict[str, str]:
    kind, _, obj = name.partition("/")
    return find(objects, kind, obj)["spec"]["template"]["metadata"]["labels"]


def test_network_policy_lets_only_agents_and_device_plugins_reach_the_extender() -> None:
    objects = render()
    validate(objects)
    np = policy(objects)
    assert np is not None and np["spec"]["policyTypes"] == ["Ingress"]
    selector = np["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels(objects, "Deployment/tandem-scheduler").items()
    (rule,) = np["spec"]["ingress"]
    allowed = [p["podSelector"]["matchLabels"] for p in rule["from"]]
    for name in ("DaemonSet/tandem-agent", "DaemonSet/tandem-device-plugin"):
        assert any(a.items() <= labels(objects, name).items() for a in allowed), name
    for name in ("Deployment/tandem-scheduler",):  # nobody else in the release
        assert not any(a.items() <= labels(objects, name).items() for a in allowed)
    assert rule["ports"] == [{"port": 8443, "protocol": "TCP"}]
    extender = next(c for c in pod_spec(objects, "Deployment/tandem-scheduler")["containers"]
                    if c["name"] == "extender")
    assert extender["ports"][0]["containerPort"] == 8443


def test_network_policy_values() -> None:
    assert policy(render("networkPolicy.enabled=false")) is None
    assert policy(render("topology=standalone")) is None  # its scheduler is outside
    objects = render("topology=standalone",
                     "networkPolicy.schedulerFrom[0].ipBlock.cidr=10.0.0.10/32",
                     "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=obs")
    validate(objects)
    rules = policy(objects)["spec"]["ingress"]
    assert rules[1]["from"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    assert rules[2]["ports"] == [{"port": 8443, "protocol": "TCP"},
                                 {"port": 10259, "protocol": "TCP"}]
    assert policy(objects)["spec"]["podSelector"]["matchLabels"].items() <= \
        labels(objects, "Deployment/tandem-extender").items()


def test_kustomize_sidecar_ships_the_same_policy() -> None:
    objects = resolve(MANIFESTS / "overlays/sidecar")
    assert policy(objects)["spec"] == policy(render())["spec"]
    assert policy(resolve(MANIFESTS / "overlays/standalone")) is None


def test_rendering_without_the_cluster_warns_that_generated_secrets_rotate() -> None:
    out = helm_template().stdout
    assert "`helm template` (GitOps) makes new ones each time" in out
    quiet = helm_template("tls.generate=false").stdout
    assert "makes new ones each time" not in quiet


# --- mutual TLS between kube-scheduler and the extender -----------------------------

def scheduler_tls(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config = yaml.safe_load(find(objects, "ConfigMap", "tandem-scheduler-config")
                            ["data"]["kube-scheduler-config.yaml"])
    (extender,) = config["extenders"]
    return extender["tlsConfig"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_chart_issues_the_scheduler_a_client_certificate_the_extender_checks(
        tmp_path: Path) -> None:
    objects = render()
    tls = scheduler_tls(objects)
    spec = pod_spec(objects, "Deployment/tandem-scheduler")
    kube_scheduler = next(c for c in spec["containers"] if c["name"] == "kube-scheduler")
    mounts = {m["mountPath"]: m["name"] for m in kube_scheduler["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for key in ("certFile", "keyFile"):
        directory = tls[key].rpartition("/")[0]
        assert volumes[mounts[directory]]["secret"]["secretName"] == "tandem-scheduler-client"
    config = yaml.safe_load(find(objects, "ConfigMap", "tandem-config")["data"]["tandem.yaml"])
    assert config["server"]["tls_client_ca_file"] == tls["caFile"]  # the same CA
    client = find(objects, "Secret", "tandem-scheduler-client")["data"]
    server = find(objects, "Secret", "tandem-extender-tls")["data"]
    assert client["ca.crt"] == server["ca.crt"]
    for name, value in (("client.crt", client["tls.crt"]), ("ca.crt", server["ca.crt"])):
        (tmp_path / name).write_bytes(base64.b64decode(value))
    verify = subprocess.run(["openssl", "verify", "-purpose", "sslclient", "-CAfile",
                             tmp_path / "ca.crt", tmp_path / "client.crt"],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    subject = subprocess.run(["openssl", "x509", "-noout", "-subject", "-in",
                              tmp_path / "client.crt"], capture_output=True, text=True,
                             check=True).stdout
    assert "CN = tandem-scheduler" in subject or "CN=tandem-scheduler" in subject


def test_kustomize_scheduler_presents_the_same_client_certificate() -> None:
    objects = resolve(MANIFESTS / "overlays/sidecar")
    assert scheduler_tls(objects) == scheduler_tls(render())
    text = (MANIFESTS / "overlays/standalone/kube-scheduler-extender.yaml").read_text()
    (extender,) = yaml.safe_load(text)["extenders"]
    assert {"certFile", "keyFile", "caFile"} <= set(extender["tlsConfig"])


def test_cert_manager_issues_the_scheduler_client_certificate() -> None:
    objects = render("tls.generate=false", "certManager.enabled=true",
                     "certManager.issuerRef.name=tandem-ca")
    cert = find(objects, "Certificate", "tandem-scheduler-client")
    assert cert["spec"]["commonName"] == "tandem-scheduler"
    assert cert["spec"]["secretName"] == "tandem-scheduler-client"
    assert "client auth" in cert["spec"]["usages"]


def notes(*sets: str) -> str:
    from chart_helpers import CHART, HELM, NAMESPACE

    if HELM is None:
        pytest.skip("no helm")
    cmd = [HELM, "install", "tandem", str(CHART), "--namespace", NAMESPACE,
           "--dry-run=client", "--set", "kubeScheduler.image.tag=v1.31.0"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    return out[out.index("NOTES:"):]


def test_install_notes_warn_about_rotation_and_a_missing_policy() -> None:
    default = notes()
    assert "`helm template`" in default and "makes new ones on every render" in default
    assert "NO NetworkPolicy" not in default  # the sidecar install has one
    standalone = notes("topology=standalone")
    assert "NO NetworkPolicy guards the extender" in standalone
    own = notes("tls.generate=false", "tokens.agent.existingSecret=a",
                "tokens.admin.existingSecret=b", "signingKey.existingSecret=c",
                "topology=standalone", "networkPolicy.schedulerFrom[0].ipBlock.cidr=10.0.0.1/32")
    assert "makes new ones" not in own and "NO NetworkPolicy" not in own


def test_webhook_placement_values() -> None:
    objects = render("webhook.enabled=true", "webhook.nodeSelector.role=infra",
                     "webhook.priorityClassName=high",
                     "webhook.tolerations[0].key=infra", "webhook.tolerations[0].operator=Exists")
    validate(objects)
    spec = pod_spec(objects, "Deployment/tandem-webhook")
    assert spec["nodeSelector"] == {"role": "infra"} and spec["priorityClassName"] == "high"
    assert spec["tolerations"] == [{"key": "infra", "operator": "Exists"}]
    assert "podAntiAffinity" in spec["affinity"]


def test_kustomize_mps_component_sets_what_the_chart_value_does() -> None:
    """components/mps passes the settings through the environment (the DaemonSets' args
    stay); the chart through flags. Both give the same settings, mounts and volumes."""
    objects = resolve(MANIFESTS / "overlays/sidecar-mps")
    validate(objects)
    chart = render("mps.enabled=true")
    for name, flags in (("DaemonSet/tandem-agent", {"--mps": "TANDEM_MPS",
                                                     "--mps-root": "TANDEM_MPS_ROOT"}),
                        ("DaemonSet/tandem-device-plugin", {"--mps-root": "TANDEM_MPS_ROOT"})):
        (kc,) = pod_spec(objects, name)["containers"]
        (hc,) = pod_spec(chart, name)["containers"]
        env = {e["name"]: e["value"] for e in kc["env"] if e["name"].startswith("TANDEM_MPS")}
        args = dict((a.split("=", 1) + ["true"])[:2] for a in hc["args"] if "--mps" in a)
        assert {flags[k]: v for k, v in args.items()} == env, name
        mounts = {(m["name"], m["mountPath"], bool(m.get("readOnly"))) for m in kc["volumeMounts"]
                  if m["name"].startswith("mps")}
        assert mounts == {(m["name"], m["mountPath"], bool(m.get("readOnly")))
                          for m in hc["volumeMounts"] if m["name"].startswith("mps")}
        volumes = [v for v in pod_spec(objects, name)["volumes"] if v["name"].startswith("mps")]
        assert volumes == [v for v in pod_spec(chart, name)["volumes"]
                           if v["name"].startswith("mps")]


def test_mps_environment_reaches_the_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables components/mps sets are the ones the commands read."""
    import typer

    from tandem.cli import app

    root = typer.main.get_command(app)
    agent = root.commands["agent"]
    envs = {p.name: p.envvar for cmd in ("run", "device-plugin")
            for p in agent.commands[cmd].params if p.name.startswith("mps")}
    assert envs == {"mps": "TANDEM_MPS", "mps_root": "TANDEM_MPS_ROOT",
                    "mps_thread_percentage": "TANDEM_MPS_THREAD_PERCENTAGE"}


def test_queue_gate_placement_values() -> None:
    objects = render("queueGate.enabled=true", "queueGate.nodeSelector.role=infra",
                     "queueGate.priorityClassName=high")
    validate(objects)
    spec = pod_spec(objects, "Deployment/tandem-queue-gate")
    assert spec["nodeSelector"] == {"role": "infra"} and spec["priorityClassName"] == "high"
    assert "podAntiAffinity" in spec["affinity"]
