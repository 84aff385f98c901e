"""HTTP API of the inference server (Flask app factory; cheroot serves it).

Routes (DESIGN.md, "Inference server"): ``POST/GET /v1/sessions``,
``DELETE /v1/sessions/NAME``, ``POST /v1/sessions/NAME/infer``, ``/metrics``,
``/livez``, ``/readyz``. Every error is JSON from one handler; bodies over the
limit get 413 before they are read. With an ``AdminGuard``, adding and deleting
sessions need ``Authorization: Bearer <token>`` (401 otherwise); the rest stays
open, for the reasons in ``agent.inference.http.auth``.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from flask import Flask, Response, jsonify, request
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException, InternalServerError, RequestEntityTooLarge
from werkzeug.http import HTTP_STATUS_CODES

from agent.inference.errors import (
    BadRequest,
    ServerError,
    Unauthorized,
)
from agent.inference.http.auth import AdminGuard
from agent.inference.http.metrics import RuntimeCollector
from agent.inference.runtime.infer import (
    JSON_TYPE,
    Answer,
    InferRequest,
    WriteTimed,
    answer_infer,
    json_body,
)
from agent.inference.runtime.runtime import ServingRuntime
from contracts.annotations import (
    DEFAULT_WEIGHT,
    PRIORITY_RANGE,
    RATE_RPS_RANGE,
    SLO_MS_RANGE,
    WEIGHT_RANGE,
    AnnotationError,
    IntRange,
    NumberRange,
)

DEFAULT_MAX_BODY_BYTES = 64 * 2**20
SLO_FIELDS = {"name", "model", "slo_ms", "rate_rps", "priority"}
BEST_EFFORT_FIELDS = {"name", "model", "weight", "priority"}
_N = TypeVar("_N", int, float)
_INFER_PATH = re.compile(r"/v1/sessions/([^/]+)/infer")
"""What Flask's ``/v1/sessions/<name>/infer`` matches (a name without slashes)."""


def create_app(
    runtime: ServingRuntime,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    best_effort_timeout_seconds: float = 60.0,
    registry: CollectorRegistry | None = None,
    admin: AdminGuard | None = None,
    freeze_gc: bool = False,
) -> Flask:
    """The inference server's Flask app over ``runtime``.

    ``admin``: the guard of the session-management endpoints; None leaves them
    open, which ``serve.py`` allows only on a loopback address. ``freeze_gc``: the
    server owns its process (``settle_heap``).
    """
    app = Flask("tandem-inference-server")
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    registry = registry or CollectorRegistry()
    registry.register(RuntimeCollector(runtime))

    _json_errors(app)
    _after_requests(app, freeze_gc)
    app.wsgi_app = _infer_route(app, runtime, best_effort_timeout_seconds)  # type: ignore[method-assign]

    def _authorize() -> None:
        if admin is not None:
            admin.check(request.headers.get("Authorization"))

    @app.post("/v1/sessions")
    def add_session() -> tuple[Response, int]:
        _authorize()  # before the body is read: an unauthenticated caller costs nothing
        body = _json_object()
        if "slo_ms" in body or "rate_rps" in body:
            _check_fields(body, SLO_FIELDS, SLO_FIELDS - {"priority"})
            answer = runtime.add_slo_session(
                _str(body, "name"),
                _str(body, "model"),
                _in_range(_number(body, "slo_ms"), SLO_MS_RANGE, "slo_ms"),
                _in_range(_number(body, "rate_rps"), RATE_RPS_RANGE, "rate_rps"),
                _in_range(_int(body, "priority", 0), PRIORITY_RANGE, "priority"),
            )
        else:
            _check_fields(body, BEST_EFFORT_FIELDS, {"name", "model"})
            answer = runtime.add_best_effort_session(
                _str(body, "name"),
                _str(body, "model"),
                _in_range(_int(body, "weight", DEFAULT_WEIGHT), WEIGHT_RANGE, "weight"),
                _in_range(_int(body, "priority", 0), PRIORITY_RANGE, "priority"),
            )
        return jsonify(answer), 201

    @app.get("/v1/sessions")
    def list_sessions() -> Response:
        return jsonify(runtime.snapshot())

    @app.delete("/v1/sessions/<name>")
    def delete_session(name: str) -> tuple[Response, int]:
        _authorize()
        runtime.remove_session(name)
        return jsonify({"deleted": name}), 200

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    @app.get("/livez")
    def livez() -> Response:
        return jsonify({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> tuple[Response, int]:
        ready = runtime.is_running()
        return jsonify({"status": "ready" if ready else "not ready"}), 200 if ready else 503

    return app


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _infer_route(app: Flask, runtime: ServingRuntime, best_effort_timeout_seconds: float
                 ) -> WsgiApp:
    """``POST /v1/sessions/NAME/infer`` answered from the WSGI environ, before Flask: its
    routing, request context and hooks cost more CPU than the rest of the route
    (``benchmarks/serving_path_cpu.py``). Every other request goes on to Flask. The
    answers, errors included, are the ones Flask's handlers give; each one's write is
    timed (``WriteTimed``)."""
    flask_app, limit = app.wsgi_app, app.config["MAX_CONTENT_LENGTH"]

    def dumps(document: object) -> bytes:  # as ``jsonify``: the app's provider, compact
        return (app.json.dumps(document, separators=(",", ":")) + "\n").encode()

    def answer(name: str, environ: dict[str, Any]) -> Answer:
        try:
            return answer_infer(runtime, name, InferRequest(environ, limit), dumps,
                                best_effort_timeout_seconds)
        except Exception as exc:  # noqa: BLE001 - every error is answered, as Flask does
            if not isinstance(exc, ServerError | HTTPException):
                app.logger.error("Exception on %s [POST]", environ.get("PATH_INFO"),
                                 exc_info=True)
            document, status = error_document(exc)
            return Answer(status, dumps(document), JSON_TYPE)

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        match = _INFER_PATH.fullmatch(environ.get("PATH_INFO", ""))
        if match is None or environ.get("REQUEST_METHOD") != "POST":
            return flask_app(environ, start_response)
        # PATH_INFO holds the path's bytes as latin-1; the name is UTF-8 (as werkzeug).
        done = answer(match.group(1).encode("latin-1").decode("utf-8", "replace"), environ)
        start_response(f"{done.status} {HTTP_STATUS_CODES.get(done.status, '')}",
                       done.wsgi_headers())
        return WriteTimed(runtime, environ, done.body)

    # The same route in Flask's map, so its other methods get Flask's 405 (a POST is
    # answered above before Flask would route it here).
    @app.post("/v1/sessions/<name>/infer")
    def infer(name: str) -> Response:
        done = answer(name, request.environ)
        return Response(done.body, done.status, done.headers, content_type=done.content_type)

    return wsgi


def _after_requests(app: Flask, freeze_gc: bool) -> None:
    """The heap settles when sessions change."""

    @app.after_request
    def _after(response: Response) -> Response:
        if freeze_gc and request.endpoint in ("add_session", "delete_session") \
                and response.status_code < 300:
            settle_heap()
        return response


def settle_heap() -> None:
    """Collect once, then move every object alive now (the modules, the models loaded)
    out of the collector's reach. A full collection of a process holding ONNX Runtime
    or torch took 6-36 ms of CPU on a 2-core host, with every thread stopped, often
    more than a 50 ms SLO's slack on a busy host; after this only objects made while
    serving are scanned. Called when the sessions change (start-up, registration,
    removal), never on the request path; unfreezing first lets what a removal left
    behind be collected."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _json_errors(app: Flask) -> None:
    """Every error as JSON in one shape: the server's own, and werkzeug's."""

    @app.errorhandler(ServerError)
    def _server_error(err: ServerError) -> tuple[Response, int]:
        document, status = error_document(err)
        response = jsonify(document)
        if isinstance(err, Unauthorized):
            response.headers["WWW-Authenticate"] = 'Bearer realm="tandem-admin"'
        return response, status

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException) -> tuple[Response, int]:
        document, status = error_document(err)
        return jsonify(document), status


def error_document(err: BaseException) -> tuple[dict[str, Any], int]:
    """An error's JSON answer and status: the server's own, werkzeug's, and anything
    else as werkzeug's 500 (what Flask answers an unhandled exception with)."""
    if isinstance(err, ServerError):
        return err.to_json(), err.status
    if not isinstance(err, HTTPException):
        err = InternalServerError(original_exception=err)
    kind = "PayloadTooLarge" if isinstance(err, RequestEntityTooLarge) else type(err).__name__
    return {"error": kind, "message": err.description}, err.code or 500


def _json_object() -> dict[str, Any]:
    body = json_body()
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


def _check_fields(body: Mapping[str, Any], allowed: set[str], required: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    missing = sorted(required - set(body))
    if unknown or missing:
        raise BadRequest("invalid session fields", unknown=unknown, missing=missing)


def _str(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{key} must be a non-empty string")
    return value


def _number(body: Mapping[str, Any], key: str) -> float:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key} must be a number")
    return float(value)


def _in_range(value: _N, valid: IntRange | NumberRange, key: str) -> _N:
    """``value`` if the shared annotation contract accepts it (what the extender let bind)."""
    try:
        valid.check(value, key)  # type: ignore[arg-type]
    except AnnotationError as exc:
        raise BadRequest(f"{key} {exc.problem}") from None
    return value


def _int(body: Mapping[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer")
    return value
