"""Placement signatures: a check for people and for pods bound before placement records.

A pod owner can edit any annotation of their pod, including the outputs bind
wrote (``tandem.io/gpu-index``, ``tandem.io/predicted-gpu-mem-mib`` ...). What
the ledger trusts after a restart or relist is the placement record bind wrote in
the extender's namespace (``extender.cluster.records``). Bind also writes
``tandem.io/placement-signature``: an HMAC-SHA256 over the pod UID, the node and
every output annotation, keyed by a secret only the extender holds, so an edit
can be told from bind's own words. The UID ties a signature to one pod: copying
it onto another pod does not verify.

A bound pod with no record whose signature verifies (bound by a version that
kept no records) is taken as its annotations say; one with neither holds every
GPU of its node in full (``extender.cluster.source.untrusted_placement``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from contracts.annotations import PLACEMENT_SIGNATURE, SIGNED_OUTPUTS
from contracts.logs import get_logger
from extender.config.schema import ConfigError
from extender.config.sections import ReportsConfig, StateConfig
from extender.state.reports import expected_token

MIN_KEY_BYTES = 16
DERIVATION_LABEL = b"tandem placement signing key v1"
_VERSION = "v1"


class PlacementSigner:
    """Signs and verifies placement annotations with one HMAC-SHA256 key."""

    def __init__(self, key: bytes, ephemeral: bool = False):
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError([f"the placement signing key must be at least {MIN_KEY_BYTES} "
                               f"bytes, got {len(key)}"])
        self._key = key
        self.ephemeral = ephemeral
        """True when the key was made at start: signatures do not survive a restart."""

    @classmethod
    def random(cls) -> PlacementSigner:
        """A signer with a fresh random key (no key configured)."""
        return cls(secrets.token_bytes(32), ephemeral=True)

    def _mac(self, uid: str, node: str, ann: Mapping[str, object]) -> str:
        outputs = [[k, ann[k]] for k in SIGNED_OUTPUTS if isinstance(ann.get(k), str)]
        payload = json.dumps([_VERSION, uid, node, outputs], separators=(",", ":"))
        digest = hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()
        return f"{_VERSION}:{digest}"

    def sign(self, uid: str, node: str, ann: Mapping[str, str]) -> dict[str, str]:
        """``ann`` plus its signature annotation."""
        if not uid:
            raise ValueError("a placement signature needs the pod UID")
        return {**ann, PLACEMENT_SIGNATURE: self._mac(uid, node, ann)}

    def verify(self, uid: str, node: str, ann: Mapping[str, object]) -> bool:
        """True when ``ann`` carries a valid signature for this pod UID and node."""
        given = ann.get(PLACEMENT_SIGNATURE)
        if not uid or not isinstance(given, str):
            return False
        return hmac.compare_digest(given.encode(), self._mac(uid, node, ann).encode())


def load_signer(cfg: StateConfig, environ: Mapping[str, str] | None = None,
                reports: ReportsConfig | None = None) -> PlacementSigner:
    """The configured key (file first, then environment); else one derived from the agent
    token, which every replica already shares; else a random one, with a warning."""
    key: bytes | None = None
    if cfg.signing_key_file:
        try:
            key = Path(cfg.signing_key_file).read_bytes().strip()
        except OSError as exc:
            raise ConfigError([f"state.signing_key_file {cfg.signing_key_file}: "
                               f"cannot read: {exc.strerror}"]) from None
    else:
        text = (environ if environ is not None else os.environ).get(cfg.signing_key_env)
        key = text.strip().encode() if text else None
    if key:
        return PlacementSigner(key)
    token = expected_token(reports, environ) if reports is not None else None
    if token:  # pod owners never see the agent token; a derived key keeps it out of the MAC
        return PlacementSigner(hmac.new(token.encode(), DERIVATION_LABEL,
                                        hashlib.sha256).digest())
    get_logger().warning(
        "no placement signing key (state.signing_key_file, "
        f"${cfg.signing_key_env}) and no agent token configured; using a random one: after "
        "a restart, pods bound before it do not verify and each holds its whole GPU")
    return PlacementSigner.random()
