"""Only the scheduler calls the scheduling verbs: mutual TLS on ``/filter``,
``/prioritize``, ``/bind`` and ``/preempt``.

With ``server.tls_client_ca_file`` set, the extender asks every TLS client for a
certificate and verifies any it is given against that CA (a bad one fails the
handshake). The scheduling verbs then answer only a client whose verified
certificate names one of ``server.scheduler_client_names`` (kube-scheduler's
extender ``tlsConfig.certFile``); everyone else gets 403. The agents' routes keep
their bearer token and need no certificate.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterable
from typing import Any

from contracts.httpserve import CLIENT_CN, CLIENT_VERIFY
from extender.config.schema import ConfigError

SCHEDULING_PATHS = frozenset({"/filter", "/prioritize", "/bind", "/preempt"})


def ask_for_client_certificates(adapter: Any, ca_file: str) -> None:
    """Make ``adapter`` (the server's TLS adapter) request and verify client certificates;
    ConfigError when the CA file cannot be used."""
    try:
        adapter.context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError([f"server.tls_client_ca_file: {ca_file}: cannot load a CA "
                           f"certificate ({exc})"]) from None
    adapter.context.verify_mode = ssl.CERT_OPTIONAL


def scheduler_only(app: Callable[..., Iterable[bytes]], names: Iterable[str],
                   ) -> Callable[..., Iterable[bytes]]:
    """``app`` with the scheduling verbs refused (403) to clients without the
    scheduler's certificate."""
    allowed = frozenset(names)

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") in SCHEDULING_PATHS:
            verified = environ.get(CLIENT_VERIFY) == "SUCCESS"
            name = environ.get(CLIENT_CN, "")
            if not verified or name not in allowed:
                why = ("a client certificate from the scheduler is required" if not verified
                       else f"client certificate {name!r} is not the scheduler's")
                body = json.dumps({"Error": f"tandem: forbidden: {why}"}).encode()
                start_response("403 Forbidden", [("Content-Type", "application/json"),
                                                 ("Content-Length", str(len(body)))])
                return [body]
        return app(environ, start_response)

    return guarded
