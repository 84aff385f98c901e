"""The webhook's HTTPS server: ``POST /mutate`` (AdmissionReview v1), ``GET /healthz``.

A plain WSGI callable on the hardened cheroot front (contracts.httpserve), served
with the extender's certificate; the API server is its only expected client.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from cheroot import wsgi

from contracts.httpserve import BodyTooLarge, harden, read_body, tls_adapter
from contracts.jsonbody import JsonBodyError, parse_json
from contracts.logs import get_logger
from extender.webhook.mutate import ReviewError, WebhookSettings, review

MAX_BODY_BYTES = 3 << 20  # the API server sends at most about 3 MiB of object
_JSON = [("Content-Type", "application/json")]


def make_app(settings: WebhookSettings) -> Callable[..., Iterable[bytes]]:
    """The WSGI app answering AdmissionReviews with ``settings``."""
    log = get_logger()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        if path == "/healthz" and method == "GET":
            return _answer(start_response, "200 OK", {"ok": True})
        if path != "/mutate":
            return _answer(start_response, "404 Not Found", {"error": "not found"})
        if method != "POST":
            return _answer(start_response, "405 Method Not Allowed", {"error": "POST only"})
        try:
            body = parse_json(read_body(environ, MAX_BODY_BYTES))
            answer = review(body, settings)
        except BodyTooLarge:
            return _answer(start_response, "413 Payload Too Large", {"error": "too large"})
        except (JsonBodyError, ReviewError, ValueError) as exc:
            return _answer(start_response, "400 Bad Request", {"error": str(exc)})
        response = answer["response"]
        log.info("admission review", extra={"verb": "mutate", "pod": _pod_key(body),
                                            "uid": response["uid"],
                                            "patched": "patch" in response})
        return _answer(start_response, "200 OK", answer)

    return app


def _pod_key(body: Any) -> str:
    """namespace/name of the reviewed pod (a new pod may have only generateName)."""
    def mapping(value: Any) -> dict[str, Any]:
        return value if isinstance(value, dict) else {}

    request = mapping(body.get("request"))
    meta = mapping(mapping(request.get("object")).get("metadata"))
    name = request.get("name") or meta.get("name") or f"{meta.get('generateName', '')}*"
    return f"{request.get('namespace') or meta.get('namespace', '')}/{name}"


def _answer(start_response: Callable[..., Any], status: str, doc: Any) -> list[bytes]:
    body = json.dumps(doc).encode()
    start_response(status, [*_JSON, ("Content-Length", str(len(body)))])
    return [body]


def make_server(settings: WebhookSettings, host: str, port: int, cert_file: str | None,
                key_file: str | None) -> wsgi.Server:
    """A hardened cheroot server for the webhook; HTTPS when cert and key are given."""
    server = wsgi.Server((host, port), make_app(settings), numthreads=4,
                         server_name="tandem-webhook")
    harden(server, body_limit=MAX_BODY_BYTES)
    if cert_file and key_file:
        server.ssl_adapter = tls_adapter(cert_file, key_file)
    return server
