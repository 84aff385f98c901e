"""Thin Flask routes: read a bounded body, decode, call one Extender verb, encode.

``create_app(config, source, clock)`` builds everything a process needs (state,
metrics, the verbs) around an injected cluster source and clock, so tests and
the demo build their own apps. Error mapping follows ``extender.errors``: 400
for bodies that are not ExtenderArgs, 413 over the size limit, 404 for unknown
paths, and 200 with ``Error`` for logical failures: kube-scheduler treats any
non-200 answer as an error anyway and ``Error`` carries a readable reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from contracts.logs import get_logger
from extender.cluster.source import ClusterSource
from extender.config import ConfigHolder
from extender.core.decide import PlannerFn
from extender.errors import BadRequest, ExtenderError
from extender.learning.learner import build_learner
from extender.ops.metrics import Metrics
from extender.service import DemandPredictor, Extender
from extender.state.ledger import ClusterState
from extender.state.node_identity import agent_identity, check_node
from extender.state.reports import check_token, decode_report
from extender.state.signing import load_signer
from extender.transport.wire import (
    decode_binding_args,
    decode_extender_args,
    decode_preemption_args,
    dumps,
    loads,
    preemption_result,
)

JSON = "application/json"


class BodyTooLarge(ExtenderError):
    """The body exceeds ``server.max_body_bytes``."""

    http_status = 413


def _error_body(verb: str, message: str) -> Any:
    if verb == "filter":
        return {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                "Error": message}
    if verb == "preempt":
        return {"NodeNameToMetaVictims": {}}
    return {"Error": message}


def create_app(
    config: ConfigHolder, source: ClusterSource, clock: Callable[[], float] = time.monotonic, *,
    predictor: DemandPredictor | None = None,
    profiles: Mapping[tuple[str, str], Any] | None = None, planner: PlannerFn | None = None,
    readiness: Iterable[Callable[[], bool]] = (), may_bind: Callable[[], bool] = lambda: True,
    metrics: Metrics | None = None, environ: Mapping[str, str] | None = None,
    start_source: bool = True,
) -> Flask:
    """The extender WSGI app over ``source``; starts the source unless told not to."""
    learner = build_learner(config.current().learning, source, may_bind,
                            lambda gpu_type: config.policy().curve_for(gpu_type),
                            getattr(predictor, "known_digest", None))
    state = ClusterState(lambda: learner.policy(config.policy(), config.current().learning),
                         clock, config.current().state.assume_ttl_seconds)
    ext = Extender(state, source, config, clock, predictor, profiles, planner, may_bind, learner)
    metrics = metrics or Metrics()
    metrics.watch_state(state.gpu_rows, lambda: state.synced)
    metrics.watch_learning(learner.curves.view, learner.stats)
    use_signer = getattr(source, "use_signer", None)  # sources that rebuild from annotations
    if use_signer is not None:
        use_signer(load_signer(config.current().state, environ, config.current().reports),
                   lambda problem: metrics.untrusted_placements.labels(problem).inc())
    checks = list(readiness)
    log = get_logger()
    app = Flask("tandem-extender")
    app.extensions["tandem"] = ext
    app.extensions["tandem_metrics"] = metrics

    def read_body() -> bytes:
        limit = config.current().server.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise BodyTooLarge(f"body larger than {limit} bytes")
        data = request.stream.read(limit + 1)
        if len(data) > limit:
            raise BodyTooLarge(f"body larger than {limit} bytes")
        return data

    children: dict[tuple[str, int], tuple[Any, Any]] = {}

    def observe(name: str, status: int, duration: float) -> None:
        pair = children.get((name, status))
        if pair is None:  # labels() validates and locks on every call; resolve each child once
            pair = children[(name, status)] = (metrics.requests.labels(name, str(status)),
                                               metrics.latency.labels(name))
        pair[0].inc()
        pair[1].observe(duration)

    def run_verb(name: str, handler: Callable[[Any], Any], read: Callable[[], bytes],
                 ) -> tuple[int, bytes]:
        start = time.perf_counter()
        status, extra = 200, {}
        try:
            result, extra = handler(loads(read()))
        except ExtenderError as exc:
            status = exc.http_status
            result = _error_body(name, str(exc)) if status == 200 else {"Error": str(exc)}
            extra = {"error": str(exc)}
        except Exception as exc:  # a bug must not become a 500 the scheduler cannot read
            log.exception("internal error", extra={"verb": name})
            result, extra = _error_body(name, f"tandem: internal error: {exc!r}"), {}
        body = dumps(result)
        duration = time.perf_counter() - start
        observe(name, status, duration)
        if log.isEnabledFor(logging.INFO):  # skip building the record when it is filtered
            log.info(name, extra={"verb": name, "duration_seconds": round(duration, 6),
                                  "status": status, **extra})
        return status, body

    def verb(name: str, handler: Callable[[Any], Any]) -> Response:
        status, body = run_verb(name, handler, read_body)
        return Response(body, status=status, mimetype=JSON)

    def do_filter(doc: Any) -> tuple[Any, dict[str, Any]]:
        args = decode_extender_args(doc)
        result, outcome = ext.filter(args)
        for reason, count in outcome.reasons.items():
            metrics.decisions.labels("filter", "rejected", reason).inc(count)
        metrics.decisions.labels("filter", "passed", "").inc(outcome.passed)
        return result, {"pod": _pod_key(args.pod), "passed": outcome.passed,
                        "reasons": dict(outcome.reasons)}

    def do_prioritize(doc: Any) -> tuple[Any, dict[str, Any]]:
        args = decode_extender_args(doc)
        return ext.prioritize(args), {"pod": _pod_key(args.pod)}

    def do_bind(doc: Any) -> tuple[Any, dict[str, Any]]:
        args = decode_binding_args(doc)
        info = {"pod": f"{args.pod_namespace}/{args.pod_name}", "node": args.node}
        try:
            result = ext.bind(args)
        except ExtenderError as exc:
            metrics.decisions.labels("bind", "failed", type(exc).__name__).inc()
            if exc.http_status != 200:
                raise
            return {"Error": str(exc)}, {**info, "error": str(exc)}
        metrics.decisions.labels("bind", "bound", "").inc()
        return result, info

    def do_preempt(doc: Any) -> tuple[Any, dict[str, Any]]:
        pod, victims = decode_preemption_args(doc)
        return preemption_result(ext.preempt(pod, victims)), {"pod": _pod_key(pod)}

    fast_routes = {"/filter": ("filter", do_filter), "/prioritize": ("prioritize", do_prioritize),
                   "/bind": ("bind", do_bind), "/preempt": ("preempt", do_preempt)}
    flask_wsgi = app.wsgi_app

    def scheduler_verbs(environ: dict[str, Any], start_response: Callable[..., Any],
                        ) -> Iterable[bytes]:
        """POSTs of the four verbs skip Flask's request context: the scheduler's hot path.

        Everything else (and any other method on these paths, which Flask answers
        with 405) goes through Flask. Both paths share ``run_verb``.
        """
        route = fast_routes.get(environ.get("PATH_INFO", ""))
        if route is None or environ.get("REQUEST_METHOD") != "POST":
            return flask_wsgi(environ, start_response)
        limit = config.current().server.max_body_bytes
        status, body = run_verb(route[0], route[1], lambda: _wsgi_body(environ, limit))
        start_response(f"{status} {HTTPStatus(status).phrase}",
                       [("Content-Type", JSON), ("Content-Length", str(len(body)))])
        return [body]

    app.wsgi_app = scheduler_verbs  # type: ignore[method-assign]
    app.add_url_rule("/filter", "filter", lambda: verb("filter", do_filter), methods=["POST"])
    app.add_url_rule("/prioritize", "prioritize", lambda: verb("prioritize", do_prioritize),
                     methods=["POST"])
    app.add_url_rule("/bind", "bind", lambda: verb("bind", do_bind), methods=["POST"])
    app.add_url_rule("/preempt", "preempt", lambda: verb("preempt", do_preempt),
                     methods=["POST"])

    node_identity = agent_identity(source)

    @app.post("/v1/agents/report")
    def agent_report() -> Response:
        speaks_for: list[str | None] = [None]

        def handle(doc: Any) -> tuple[Any, dict[str, Any]]:
            report = decode_report(doc)
            check_node(speaks_for[0], report.node)
            state.report(report.node, report.gpus, report.util_percent, report.memory_used_mib)
            samples = learner.observe(report, state.placement_of,
                                      state.source_gpu_types(report.node)) \
                if config.current().learning.enabled else 0
            return {"accepted": len(report.gpus), "samples": samples}, {"node": report.node}
        try:
            reports_cfg = config.current().reports
            if reports_cfg.identity == "service-account":
                speaks_for[0] = node_identity(reports_cfg).node_of(
                    request.headers.get("Authorization"))
            else:
                check_token(request.headers.get("Authorization"), reports_cfg, environ)
        except ExtenderError as exc:
            metrics.requests.labels("report", str(exc.http_status)).inc()
            return Response(dumps({"Error": str(exc)}), status=exc.http_status, mimetype=JSON)
        return verb("report", handle)

    @app.get("/v1/state")
    def get_state() -> Response:
        return Response(dumps({**state.view(), "learning": learner.view()}),
                        mimetype=JSON)

    @app.get("/livez")
    def livez() -> Response:
        return Response(dumps({"status": "ok"}), mimetype=JSON)

    @app.get("/readyz")
    def readyz() -> Response:
        failing = [getattr(c, "__name__", "check") for c in checks if not c()]
        if not state.synced:
            failing.insert(0, "state-synced")
        status = 200 if not failing else 503
        return Response(dumps({"ready": not failing, "failing": failing}), status=status,
                        mimetype=JSON)

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), mimetype=CONTENT_TYPE_LATEST)

    @app.errorhandler(404)
    def not_found(_: Any) -> Response:
        return Response(dumps({"Error": f"unknown path {request.path}"}), status=404,
                        mimetype=JSON)

    @app.errorhandler(405)
    def not_allowed(_: Any) -> Response:
        return Response(dumps({"Error": f"{request.method} not allowed on {request.path}"}),
                        status=405, mimetype=JSON)

    if start_source:
        source.start(state)
    return app


def _wsgi_body(environ: Mapping[str, Any], limit: int) -> bytes:
    """The request body, at most ``limit`` bytes (werkzeug's rules for unknown lengths)."""
    raw = environ.get("CONTENT_LENGTH")
    try:
        length = int(raw) if raw else None
    except ValueError:
        raise BadRequest("Content-Length", "must be an integer") from None
    if length is not None and length < 0:  # cheroot refuses it first; other servers may not
        raise BadRequest("Content-Length", "must not be negative")
    if length is not None and length > limit:
        raise BodyTooLarge(f"body larger than {limit} bytes")
    stream = environ["wsgi.input"]
    if length is None:
        # Without a length only a server-terminated stream (chunked) can be read safely.
        data = stream.read(limit + 1) if environ.get("wsgi.input_terminated") else b""
    else:
        data = stream.read(length)
    if len(data) > limit:
        raise BodyTooLarge(f"body larger than {limit} bytes")
    return data


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


__all__ = ["BadRequest", "BodyTooLarge", "create_app"]
