"""The packaged configuration is complete and safe: every documented key present with its
default (docs, YAML and code agree), loopback unless TLS and a token are configured."""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from extender.cluster.sim import DEFAULT_CLUSTER
from extender.config.loader import DEFAULT_CONFIG, load_config
from extender.config.schema import COST_KEYS, SCHEMA, build_config
from extender.config.sections import ExtenderConfig
from extender.exposure import exposure_problem
from tandem.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/configuration.md").read_text()
PACKAGED = yaml.safe_load(DEFAULT_CONFIG.read_text())
# `| `section.key` | `default` ... |`: the first backticked value of the default column
DOC_DEFAULTS = dict(re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \| `([^`]*)`", DOC, re.M))


def code_keys() -> list[str]:
    keys = [f"{section}.{key}" for section, fields in SCHEMA.items()
            for key in fields]
    return keys + [f"cost.{k}" for k in COST_KEYS]


@pytest.mark.parametrize("key", code_keys())
def test_every_key_is_in_the_packaged_config(key: str) -> None:
    section, name = key.split(".")
    assert name in (PACKAGED.get(section) or {}), f"{key} missing from default_config.yaml"


@pytest.mark.parametrize("key", sorted(DOC_DEFAULTS))
def test_documented_default_is_the_packaged_value(key: str) -> None:
    section, name = key.split(".")
    assert yaml.safe_load(DOC_DEFAULTS[key]) == PACKAGED[section][name], key


def test_every_documented_key_has_a_default_the_test_reads() -> None:
    documented = set(re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \|", DOC, re.M))
    assert documented - set(DOC_DEFAULTS) == {"cost.curves"}  # a map, described in words


def test_packaged_values_are_the_codes_defaults() -> None:
    """Loading nothing and loading the packaged file give the same configuration, except
    the packaged per-GPU-type curves (the code's default has none)."""
    packaged = load_config(None, environ={})
    bare = build_config({})
    assert packaged.policy.curves and not bare.policy.curves
    assert dataclasses.replace(packaged.policy, curves={}) == bare.policy
    for part in ("server", "state", "reports", "handoff", "predictor", "learning", "queue",
                 "log_level", "reload_interval_seconds", "profile_files", "nexus_profiles"):
        assert getattr(packaged, part) == getattr(bare, part), part


def test_packaged_config_listens_on_loopback() -> None:
    cfg = load_config(None, environ={})
    assert cfg.server.host == "127.0.0.1"
    assert exposure_problem(cfg, {}) is None


def config(host: str, tls: bool, token_file: bool) -> ExtenderConfig:
    raw: dict = {"server": {"host": host}}
    if tls:
        raw["server"] |= {"tls_cert_file": "/c.crt", "tls_key_file": "/c.key"}
    if token_file:
        raw["reports"] = {"token_file": "/t"}
    return build_config(raw)


@pytest.mark.parametrize(("host", "tls", "token", "environ", "missing"), [
    pytest.param("127.0.0.1", False, False, {}, None, id="loopback"),
    pytest.param("::1", False, False, {}, None, id="loopback-v6"),
    pytest.param("0.0.0.0", True, True, {}, None, id="tls-and-token-file"),
    pytest.param("0.0.0.0", True, False, {"TANDEM_AGENT_TOKEN": "x" * 32}, None,
                 id="tls-and-token-env"),
    pytest.param("0.0.0.0", False, True, {}, "TLS", id="no-tls"),
    pytest.param("10.0.0.5", True, False, {}, "agent token", id="no-token"),
    pytest.param("::", False, False, {}, "TLS", id="nothing"),
])
def test_non_loopback_needs_tls_and_a_token(host: str, tls: bool, token: bool,
                                            environ: dict[str, str], missing: str | None) -> None:
    problem = exposure_problem(config(host, tls, token), environ)
    if missing is None:
        assert problem is None
    else:
        assert problem is not None and missing in problem and "--insecure" in problem


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


# cheroot drops the socket of a failed bind without closing it; the process exits right after.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_serve_refuses_an_open_address_unless_insecure(tmp_path: Path, busy_port: int) -> None:
    file = tmp_path / "open.yaml"
    file.write_text(yaml.safe_dump({"server": {"host": "0.0.0.0"},
                                    "predictor": {"enabled": False}}))
    argv = ["extender", "serve", "--config", str(file), "--cluster", f"sim:{DEFAULT_CLUSTER}",
            "--port", str(busy_port)]
    refused = CliRunner().invoke(app, argv, env={"TANDEM_AGENT_TOKEN": ""})
    assert refused.exit_code == 2
    assert "reachable from other machines" in refused.output and "--insecure" in refused.output
    # With --insecure it gets past the check and on to binding (the port is taken, so it
    # stops there instead of serving).
    allowed = CliRunner().invoke(app, [*argv, "--insecure"], env={"TANDEM_AGENT_TOKEN": ""})
    assert "reachable from other machines" not in allowed.output
    assert f"0.0.0.0:{busy_port}" in allowed.output
