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
