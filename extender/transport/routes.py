"""Thin Flask routes: read a bounded body, decode, call one Extender verb, encode.

:func:`build_routes` turns HTTP into calls on an assembled ``Extender``; the
process (learner, state, signer, metrics, source) is assembled in
:func:`extender.wiring.create_app`, which tests and the demo call too. Error
mapping follows ``extender.errors``: 400 for bodies that are not ExtenderArgs,
413 over the size limit, 404 for unknown paths, and 200 with ``Error`` for
logical failures: kube-scheduler treats any non-200 answer as an error anyway
and ``Error`` carries a readable reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from contracts.agentreport import REPORT_PATH
from contracts.httpserve import BadContentLength, read_body
from contracts.httpserve import BodyTooLarge as TooLarge
from contracts.listen import is_loopback
from contracts.logs import get_logger
from contracts.state import NODE_QUERY, STATE_PATH, encode_state
from extender.cluster.sim import SIM_PODS_PATH, SimPodError
from extender.config.loader import ConfigHolder
from extender.errors import BadRequest, ExtenderError
from extender.ops.metrics import Metrics
from extender.service.verbs import Extender
from extender.state.reports import decode_report
from extender.wire import (
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


class Verbs:
    """The scheduler's verbs and agent reports as HTTP handlers: decode, call, encode, count."""

    def __init__(self, ext: Extender, metrics: Metrics, config: ConfigHolder):
        self.ext, self.metrics, self.config = ext, metrics, config
        self.log = get_logger()
        self._children: dict[tuple, Any] = {}
        """Metric children by their labels (``labels()`` validates and locks on every call)."""
        self.fast = {"/filter": ("filter", self.do_filter),
                     "/prioritize": ("prioritize", self.do_prioritize),
                     "/bind": ("bind", self.do_bind), "/preempt": ("preempt", self.do_preempt)}

    def read_body(self) -> bytes:
        return _wsgi_body(request.environ, self.config.current().server.max_body_bytes)

    def decided(self, verb: str, outcome: str, reason: str) -> Any:
        """The decisions counter's child for these labels (resolved once, as in observe)."""
        child = self._children.get((verb, outcome, reason))
        if child is None:
            child = self._children[(verb, outcome, reason)] = self.metrics.decisions.labels(
                verb, outcome, reason)
        return child

    def observe(self, name: str, status: int, duration: float) -> None:
        pair = self._children.get((name, status))
        if pair is None:
            pair = self._children[(name, status)] = (
                self.metrics.requests.labels(name, str(status)),
                self.metrics.latency.labels(name))
        pair[0].inc()
        pair[1].observe(duration)

    def run(self, name: str, handler: Callable[[Any], Any], read: Callable[[], bytes],
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
            self.log.exception("internal error", extra={"verb": name})
            result, extra = _error_body(name, f"tandem: internal error: {exc!r}"), {}
        body = dumps(result)
        duration = time.perf_counter() - start
        self.observe(name, status, duration)
        # Agent reports (one per node a second) are request logs: debug unless refused.
        level = logging.DEBUG if name == "report" and status == 200 else logging.INFO
        if self.log.isEnabledFor(level):  # skip building the record when it is filtered
            self.log.log(level, name, extra={"verb": name,
                                             "duration_seconds": round(duration, 6),
                                             "status": status, **extra})
        return status, body

    def respond(self, name: str, handler: Callable[[Any], Any]) -> Response:
        status, body = self.run(name, handler, self.read_body)
        return Response(body, status=status, mimetype=JSON)

    def do_filter(self, doc: Any) -> tuple[Any, dict[str, Any]]:
        args = decode_extender_args(doc)
        result, outcome = self.ext.filter(args)
        for reason, count in outcome.reasons.items():
            self.decided("filter", "rejected", reason).inc(count)
        self.decided("filter", "passed", "").inc(outcome.passed)
        return result, {"pod": _pod_key(args.pod), "passed": outcome.passed,
                        "reasons": dict(outcome.reasons)}

    def do_prioritize(self, doc: Any) -> tuple[Any, dict[str, Any]]:
        args = decode_extender_args(doc)
        return self.ext.prioritize(args), {"pod": _pod_key(args.pod)}

    def do_bind(self, doc: Any) -> tuple[Any, dict[str, Any]]:
        args = decode_binding_args(doc)
        info = {"pod": f"{args.pod_namespace}/{args.pod_name}", "node": args.node}
        try:
            result = self.ext.bind(args)
        except ExtenderError as exc:
            self.decided("bind", "failed", type(exc).__name__).inc()
            if exc.http_status != 200:
                raise
            return {"Error": str(exc)}, {**info, "error": str(exc)}
        self.decided("bind", "bound", "").inc()
        return result, info

    def do_preempt(self, doc: Any) -> tuple[Any, dict[str, Any]]:
        pod, victims = decode_preemption_args(doc)
        return preemption_result(self.ext.preempt(pod, victims)), {"pod": _pod_key(pod)}

    def agent_report(self) -> Response:
        try:  # the node this agent may speak for (None: the shared token, any node)
            node = self.ext.agents.authorize(request.headers.get("Authorization"))
        except ExtenderError as exc:
            self.metrics.requests.labels("report", str(exc.http_status)).inc()
            return Response(dumps({"Error": str(exc)}), status=exc.http_status, mimetype=JSON)

        def do_report(doc: Any) -> tuple[Any, dict[str, Any]]:
            report = decode_report(doc)
            return self.ext.agents.report(report, node), {"node": report.node}
        return self.respond("report", do_report)

    def wsgi(self, flask_wsgi: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        """POSTs of the four verbs skip Flask's request context: the scheduler's hot path.

        Everything else (and any other method on these paths, which Flask answers
        with 405) goes through Flask. Both paths share :meth:`run`.
        """
        def scheduler_verbs(environ: dict[str, Any], start_response: Callable[..., Any],
                            ) -> Iterable[bytes]:
            route = self.fast.get(environ.get("PATH_INFO", ""))
            if route is None or environ.get("REQUEST_METHOD") != "POST":
                return flask_wsgi(environ, start_response)
            limit = self.config.current().server.max_body_bytes
            status, body = self.run(route[0], route[1], lambda: _wsgi_body(environ, limit))
            start_response(f"{status} {HTTPStatus(status).phrase}",
                           [("Content-Type", JSON), ("Content-Length", str(len(body)))])
            return [body]
        return scheduler_verbs


def build_routes(ext: Extender, metrics: Metrics, config: ConfigHolder,
                 readiness: Iterable[Callable[[], bool]] = ()) -> Flask:
    """The extender's WSGI app: each route decodes, calls ``ext`` and encodes (the process is
    assembled in :func:`extender.wiring.create_app`)."""
    checks = list(readiness)
    verbs = Verbs(ext, metrics, config)
    app = Flask("tandem-extender")
    app.extensions["tandem"] = ext
    app.extensions["tandem_metrics"] = metrics
    app.wsgi_app = verbs.wsgi(app.wsgi_app)  # type: ignore[method-assign]
    for path, (name, handler) in verbs.fast.items():
        app.add_url_rule(path, name, lambda n=name, h=handler: verbs.respond(n, h),
                         methods=["POST"])
    app.add_url_rule(REPORT_PATH, "report", verbs.agent_report, methods=["POST"])

    if hasattr(ext.source, "register_pod"):  # a sim: cluster only
        app.add_url_rule(SIM_PODS_PATH, "sim-pods", lambda: _register_sim_pod(ext, verbs),
                         methods=["POST"])

    @app.get(STATE_PATH)
    def get_state() -> Response:
        doc = ext.agents.read_state(request.headers.get("Authorization"),
                                    request.args.get(NODE_QUERY))
        return Response(dumps(encode_state(doc)), mimetype=JSON)

    @app.get("/livez")
    def livez() -> Response:
        return Response(dumps({"status": "ok"}), mimetype=JSON)

    @app.get("/readyz")
    def readyz() -> Response:
        failing = [getattr(c, "__name__", "check") for c in checks if not c()]
        if not ext.state.snapshot().synced:
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

    return app


def _register_sim_pod(ext: Extender, verbs: Verbs) -> Response:
    """Register a pending pod with the simulated cluster, for a client on this machine."""
    def answer(status: int, doc: Any) -> Response:
        return Response(dumps(doc), status=status, mimetype=JSON)

    if not is_loopback(str(request.remote_addr or "")):
        return answer(403, {"Error": f"{SIM_PODS_PATH} answers clients on this machine only"})
    try:
        ref = ext.source.register_pod(loads(verbs.read_body()))
    except ExtenderError as exc:  # not JSON (400), too large (413)
        return answer(exc.http_status, {"Error": str(exc)})
    except SimPodError as exc:
        return answer(409 if exc.conflict else 400, {"Error": str(exc)})
    verbs.log.info("sim pod registered", extra={"pod": ref.key, "uid": ref.uid})
    return answer(201, {"pod": ref.key, "uid": ref.uid})


def _wsgi_body(environ: Mapping[str, Any], limit: int) -> bytes:
    """The request body, at most ``limit`` bytes (``contracts.httpserve.read_body``)."""
    try:
        return read_body(environ, limit)
    except BadContentLength:
        raise BadRequest("Content-Length", "must be a non-negative integer") from None
    except TooLarge as exc:
        raise BodyTooLarge(str(exc)) from None


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


__all__ = ["BadRequest", "BodyTooLarge", "build_routes"]
