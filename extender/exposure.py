"""Whether the extender may listen where other machines reach it.

Its scheduling verbs place pods and its reports feed decisions, so an address
other machines can reach needs TLS and the agents' token; without them the
extender listens on loopback only, or starts when told ``--insecure``.
"""

from __future__ import annotations

from collections.abc import Mapping

from contracts.listen import is_loopback
from contracts.tokens import token_or_none
from extender.config.sections import ExtenderConfig


def exposure_problem(cfg: ExtenderConfig, environ: Mapping[str, str]) -> str | None:
    """Why ``cfg`` must not serve on its address, or None when it may."""
    host = cfg.server.host
    if is_loopback(host):
        return None
    missing = []
    if not (cfg.server.tls_cert_file and cfg.server.tls_key_file):
        missing.append("TLS (server.tls_cert_file, server.tls_key_file)")
    if not (cfg.reports.token_file or token_or_none(None, cfg.reports.token_env, environ)):
        missing.append(f"an agent token (reports.token_file or ${cfg.reports.token_env})")
    if not missing:
        return None
    return (f"server.host {host or '(all addresses)'} is reachable from other machines, "
            f"but the configuration has no {' and no '.join(missing)}: anyone who reaches "
            "it could place pods. Listen on 127.0.0.1, configure them, or pass --insecure "
            "to serve anyway")
