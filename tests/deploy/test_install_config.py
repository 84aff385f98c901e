"""tandem's cluster config is valid for extender/config/, every key the code knows is
documented, and every file the config names is mounted from the right Secret."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml
from manifests_helpers import (
    ADDONS,
    ENV_HANDOFF_OVERLAYS,
    MANIFESTS,
    OVERLAYS,
    assert_one_read_only_model_store,
    container,
    find,
    pod_specs,
    resolve,
)

from extender.config.loader import load_config
from extender.config.schema import COST_KEYS, SCHEMA
from predictor.curves import CURVE_KEYS

CLUSTER_CONFIG = MANIFESTS / "base/config/tandem.yaml"
DOC = (MANIFESTS.parent / "docs/configuration.md").read_text()


def code_keys() -> list[str]:
    """Every dotted key extender/config/ accepts."""
    keys = [f"{section}.{key}" for section, fields in SCHEMA.items()
            for key in fields]
    keys += [f"cost.{k}" for k in COST_KEYS]
    return keys


def test_cluster_config_loads_and_validates() -> None:
    cfg = load_config(CLUSTER_CONFIG, environ={})
    assert cfg.server.tls_cert_file and cfg.server.tls_key_file
    assert cfg.reports.token_file
    assert cfg.server.port == 8443


def test_cluster_config_uses_only_known_keys_and_keeps_default_policy() -> None:
    raw = yaml.safe_load(CLUSTER_CONFIG.read_text())
    known = set(code_keys())
    for section, values in raw.items():
        for key in values:
            assert f"{section}.{key}" in known, f"{section}.{key}"
    default = load_config(None, environ={})
    cluster = load_config(CLUSTER_CONFIG, environ={})
    # The cluster file changes transport and secrets, not decisions (tuning is deliberate).
    assert (cluster.policy.w_mem, cluster.policy.w_util) == (
        default.policy.w_mem, default.policy.w_util)
    # ... and the signing key's path, where the extender mounts Secret tandem-signing-key.
    assert cluster.state == dataclasses.replace(
        default.state, signing_key_file="/etc/tandem/signing-key/key")


@pytest.mark.parametrize("key", code_keys())
def test_every_config_key_is_documented(key: str) -> None:
    assert f"`{key}`" in DOC, f"docs/configuration.md does not document {key}"


@pytest.mark.parametrize("curve_key", CURVE_KEYS)
def test_every_curve_key_is_documented(curve_key: str) -> None:
    assert re.search(rf"^\| `{curve_key}` \|", DOC, re.M)


def test_documented_keys_exist_in_code() -> None:
    documented = set(re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \|", DOC, re.M))
    assert documented and documented <= set(code_keys()), documented - set(code_keys())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_files_named_in_the_config_are_mounted_from_the_right_secret(overlay: str) -> None:
    objects = resolve(MANIFESTS / "overlays" / overlay)
    raw = yaml.safe_load(CLUSTER_CONFIG.read_text())
    wanted = {
        raw["server"]["tls_cert_file"]: ("tandem-extender-tls", "tls.crt"),
        raw["server"]["tls_key_file"]: ("tandem-extender-tls", "tls.key"),
        raw["reports"]["token_file"]: ("tandem-agent-token", "token"),
    }
    (spec,) = [s for name, s in pod_specs(objects)
               if any(c["name"] == "extender" for c in s["containers"])]
    extender = container(spec, "extender")
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in extender["volumeMounts"]}
    for path, (secret, key) in wanted.items():
        directory, _, filename = path.rpartition("/")
        assert filename == key
        assert volumes[mounts[directory]]["secret"]["secretName"] == secret
    config_dir, _, config_key = next(
        a for a in extender["args"] if a.startswith("--config=")
    ).split("=", 1)[1].rpartition("/")
    config_map = find(objects, "ConfigMap", volumes[mounts[config_dir]]["configMap"]["name"])
    assert config_map["data"][config_key] == CLUSTER_CONFIG.read_text()
    # No subPath: a subPath mount never sees ConfigMap updates, defeating hot reload.
    assert all("subPath" not in m for m in extender["volumeMounts"])


@pytest.mark.parametrize("overlay", OVERLAYS + ENV_HANDOFF_OVERLAYS)
def test_the_extender_reads_models_from_the_agents_model_store(overlay: str) -> None:
    """tandem.io/model resolves in the one store the agents' servers read, never on the
    extender's own filesystem: predictor.model_store is set and mounted read-only."""
    objects = resolve(MANIFESTS / "overlays" / overlay)
    for addon in ADDONS:
        objects += resolve(MANIFESTS / "addons" / addon)
    raw = yaml.safe_load(CLUSTER_CONFIG.read_text())
    assert load_config(CLUSTER_CONFIG, environ={}).predictor.model_store == \
        raw["predictor"]["model_store"] == "/srv/tandem"
    # The placeholder a user patches (a ReadOnlyMany claim or NFS), the same for all.
    assert assert_one_read_only_model_store(objects, raw) == {"emptyDir": {"sizeLimit": "1Mi"}}
