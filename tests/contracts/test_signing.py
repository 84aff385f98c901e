"""Placement signatures: what verifies, and where the key comes from."""

from __future__ import annotations

import logging

import pytest

from contracts.logs import LOGGER_NAME
from extender.config.schema import ConfigError
from extender.config.sections import StateConfig
from extender.state.signing import PlacementSigner, load_signer

OUT = {"tandem.io/gpu-index": "1", "tandem.io/predicted-gpu-mem-mib": "30000"}


def test_signature_covers_uid_node_and_every_output():
    signer = PlacementSigner(b"k" * 32)
    ann = signer.sign("uid-a", "gpu-1", OUT)
    assert signer.verify("uid-a", "gpu-1", ann)
    assert not signer.verify("uid-b", "gpu-1", ann)
    assert not signer.verify("uid-a", "gpu-2", ann)
    for key, value in [("tandem.io/gpu-index", "0"), ("tandem.io/gpu-uuid", "GPU-x"),
                       ("tandem.io/predicted-gpu-mem-mib", "1")]:
        assert not signer.verify("uid-a", "gpu-1", {**ann, key: value})
    assert signer.verify("uid-a", "gpu-1", {**ann, "tandem.io/gpu-util": "3"})  # an input
    assert not PlacementSigner(b"j" * 32).verify("uid-a", "gpu-1", ann)
    assert not signer.verify("uid-a", "gpu-1", OUT)


def test_key_from_file_then_environment(tmp_path):
    key = tmp_path / "key"
    key.write_text("0123456789abcdef0123\n")
    from_file = load_signer(StateConfig(signing_key_file=str(key)), {})
    from_env = load_signer(StateConfig(), {"TANDEM_SIGNING_KEY": "0123456789abcdef0123"})
    assert not from_file.ephemeral
    assert from_env.verify("u", "n", from_file.sign("u", "n", OUT))


def test_bad_or_missing_key(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_signer(StateConfig(signing_key_file=str(tmp_path / "absent")), {})
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        load_signer(StateConfig(), {"TANDEM_SIGNING_KEY": "short"})
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger(LOGGER_NAME).addHandler(handler)
    try:
        signer = load_signer(StateConfig(), {})
    finally:
        logging.getLogger(LOGGER_NAME).removeHandler(handler)
    assert signer.ephemeral and "random" in records[0].getMessage()


def test_key_derived_from_the_agent_token_when_none_is_configured():
    from extender.config.sections import ReportsConfig

    env = {"TANDEM_AGENT_TOKEN": "agent-token"}
    one = load_signer(StateConfig(), env, ReportsConfig())
    other_replica = load_signer(StateConfig(), dict(env), ReportsConfig())
    assert not one.ephemeral
    assert other_replica.verify("u", "n", one.sign("u", "n", OUT))
    forged = PlacementSigner(b"agent-token".ljust(16, b"\0"))  # the token itself is not the key
    assert not one.verify("u", "n", forged.sign("u", "n", OUT))
