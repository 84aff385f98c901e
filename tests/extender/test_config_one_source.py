"""Every configuration default is written once, in extender/config/ (the sections' field
defaults read through ``build_config``): each YAML file that repeats the extender's
configuration for readers or an install (the packaged ``default_config.yaml``, the
Kustomize base's ``tandem.yaml``, the chart's ``values.yaml`` ``config:``) writes either
that default or one of the install's named choices below, the same in every file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.config.loader import DEFAULT_CONFIG
from extender.config.schema import build_config

ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "extender/default_config.yaml": lambda: yaml.safe_load(DEFAULT_CONFIG.read_text()),
    "manifests/base/config/tandem.yaml": lambda: yaml.safe_load(
        (ROOT / "manifests/base/config/tandem.yaml").read_text()),
    "charts/tandem/values.yaml config:": lambda: yaml.safe_load(
        (ROOT / "charts/tandem/values.yaml").read_text())["config"],
}
CLUSTER_FILES = [name for name in FILES if name != "extender/default_config.yaml"]
# What a cluster install sets on purpose, and why; nothing else may differ from the code.
INSTALL_CHOICES = {
    "server.host": "listens on the pod network, behind TLS and tokens",
    "server.port": "the port the Services and kube-scheduler's urlPrefix use",
    "server.tls_cert_file": "where the pods mount the TLS Secret",
    "server.tls_key_file": "where the pods mount the TLS Secret",
    "server.tls_client_ca_file": "only kube-scheduler's certificate may call the verbs",
    "state.signing_key_file": "where the pods mount the signing-key Secret",
    "reports.identity": "each agent reports with its own projected token",
    "reports.token_file": "where the pods mount the agent-token Secret",
    "predictor.model_store": "where the pods mount the model store",
    "cost.curves": "the datacenter GPUs' packaged curves (default_config.yaml's)",
}
BARE = build_config({})


def written(name: str) -> list[tuple[str, Any]]:
    """(``section.key``, value) of every key ``name`` writes."""
    return [(f"{section}.{key}", value) for section, body in FILES[name]().items()
            for key, value in body.items()]


@pytest.mark.parametrize(("name", "key", "value"), [
    pytest.param(name, key, value, id=f"{name}:{key}")
    for name in FILES for key, value in written(name) if key not in INSTALL_CHOICES
])
def test_a_repeated_value_is_the_codes_default(name: str, key: str, value: Any) -> None:
    section, field = key.split(".")
    assert build_config({section: {field: value}}) == BARE, (
        f"{name} writes {key}: {value!r}, not the default in extender/config/; change the "
        "default there (and every file), or name the key in INSTALL_CHOICES with its reason")


@pytest.mark.parametrize("key", sorted(INSTALL_CHOICES))
def test_an_install_choice_is_written_alike_in_every_cluster_file(key: str) -> None:
    values = {name: dict(written(name)).get(key, "<missing>") for name in CLUSTER_FILES}
    assert len({yaml.safe_dump(v) for v in values.values()}) == 1, values
    assert "<missing>" not in values.values(), f"{key} is no longer an install choice"


def test_an_installed_curve_is_the_packaged_one() -> None:
    """The installs carry the datacenter GPUs' curves (not every packaged one), each as
    default_config.yaml writes it."""
    packaged = dict(written("extender/default_config.yaml"))["cost.curves"]
    for name in CLUSTER_FILES:
        for gpu, curve in dict(written(name))["cost.curves"].items():
            assert packaged.get(gpu) == curve, f"{name}: cost.curves.{gpu}"


def test_a_changed_default_is_caught() -> None:
    """The check above can fail: a value other than the default builds another config."""
    assert build_config({"reports": {"staleness_seconds": 11}}) != BARE
    assert build_config({"state": {"assume_ttl_seconds": 31}}) != BARE
