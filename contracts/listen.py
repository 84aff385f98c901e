"""Whether a listen address is reachable only from this machine (one rule for every server)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether a server bound to ``host`` accepts connections from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name or a wildcard-like value: assume it is reachable
        return False
