"""``POST /v1/sessions/NAME/infer``: one request from its arrival to its answer.

The deadline counts from when the request arrived at the server (the accept of
its connection, ``contracts.httpserve.ARRIVED``), not from when a worker took
it: an SLO session's deadline is arrival + SLO, or earlier where the client sent
``X-Tandem-Timeout-Ms`` or ``X-Tandem-Deadline`` (``contracts.deadline``). It
is checked wherever the request waits: when a worker
takes it (before its body is decoded), before it is queued, when the executor
forms a batch, and before the answer is sent. Nothing is answered 200 after its
deadline unless the client sent ``X-Tandem-Late: accept``; such an answer carries
``X-Tandem-Late: true``. Each request's own time on this path is measured for
admission (``pathcost.py``).

The route is served from the WSGI environ (``InferRequest``, ``Answer``), not through
Flask's request and response objects: at the SLO trio's rates their routing, contexts
and hooks were a third of the server's CPU per request (``benchmarks/serving_path_cpu.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flask import current_app
from flask import request as current_request
from werkzeug.datastructures import EnvironHeaders

from agent.inference.errors import BadRequest, DropReason, PayloadTooLarge, RequestDropped
from agent.inference.runtime.runtime import ServingRuntime
from agent.inference.runtime.stats import Outcome
from agent.inference.runtime.tensors import (
    NPY_TYPE,
    coerce_input,
    decode_json_inputs,
    decode_npy,
    encode_npy,
)
from contracts.deadline import (
    LATE_HEADER,
    DeadlineHeaderError,
    absolute_deadline_left_ms,
    accepts_late,
    client_budget_ms,
)
from contracts.httpserve import ARRIVED, BadContentLength, BodyTooLarge, read_body
from contracts.jsonbody import JsonBodyError, parse_json

ANSWERED = "tandem.answered"
"""WSGI environ key: when the last deadline check passed (the clock's ms)."""


JSON_TYPE = "application/json"


class InferRequest:
    """What the route reads of one request: its WSGI environ, headers, media type and
    body (within ``limit`` bytes)."""

    __slots__ = ("environ", "headers", "limit", "mimetype")

    def __init__(self, environ: dict[str, Any], limit: int):
        self.environ = environ
        self.headers: Mapping[str, str] = EnvironHeaders(environ)
        self.limit = limit
        # As werkzeug's ``Request.mimetype``: the type without parameters, lower case.
        self.mimetype = environ.get("CONTENT_TYPE", "").split(";", 1)[0].strip().lower()

    def body(self) -> bytes:
        return limited_body(self.environ, self.limit)


@dataclass
class Answer:
    """A response: status, body, its media type and any further headers."""

    status: int
    body: bytes
    content_type: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    def wsgi_headers(self) -> list[tuple[str, str]]:
        return [("Content-Type", self.content_type), ("Content-Length", str(len(self.body))),
                *self.headers]


def answer_infer(runtime: ServingRuntime, name: str, request: InferRequest,
                 dumps: Callable[[object], bytes], best_effort_timeout_seconds: float) -> Answer:
    """Decode, queue, wait and answer one request; raises ServerError subclasses.
    ``dumps``: the app's JSON encoding of a document."""
    clock = runtime.clock
    began = clock.now_ms()
    arrival = began - max(0.0, time.monotonic() - request.environ.get(ARRIVED, time.monotonic())
                          ) * 1000.0
    try:
        budget, late_ok = client_budget_ms(request.headers), accepts_late(request.headers)
        left = absolute_deadline_left_ms(request.headers, time.time() * 1000.0)
    except DeadlineHeaderError as exc:
        raise BadRequest(str(exc)) from None
    if left is not None:  # the absolute deadline as a budget from arrival
        absolute = began + left - arrival
        budget = absolute if budget is None else min(budget, absolute)
    dtype, shape, slo = runtime.input_contract(name)
    limits = [b for b in (slo, budget) if b is not None]
    deadline = arrival + min(limits) if limits else None
    # The request path's figures are what SLO requests meet: a best-effort job's requests
    # (bodies of any size, no SLO) must not set what the SLO sessions are planned with.
    path = runtime.path_cost if slo is not None else None
    if deadline is not None and began >= deadline:  # it waited for a worker past its deadline
        if path is not None:
            path.observe_front(began - arrival)
        # A deadline that passed before the request arrived says nothing of this server.
        runtime.note_answer(name, DropReason.DEADLINE_EXPIRED, counted=False,
                            held=deadline > arrival)
        raise RequestDropped(DropReason.DEADLINE_EXPIRED)
    as_json = request.mimetype == JSON_TYPE
    tensor = coerce_input(_decode(request, dtype, as_json), dtype, shape, slo is not None)
    submitted = clock.now_ms()
    if path is not None:
        path.observe_front(submitted - arrival)
    future = runtime.submit_future(name, tensor, arrival,
                                   None if budget is None else arrival + budget, late_ok)
    if deadline is None or late_ok:
        wait_s = best_effort_timeout_seconds if slo is None else 4 * slo / 1000.0 + 1.0
    else:
        wait_s = max(deadline - clock.now_ms(), 1.0) / 1000.0
    try:
        outcome = future.result(timeout=wait_s)
    except FutureTimeout:
        runtime.note_answer(name, DropReason.TIMEOUT)
        raise RequestDropped(DropReason.TIMEOUT) from None
    resumed = clock.now_ms()
    if path is not None and outcome.reason in (None, DropReason.EARLY_DROP):  # executor's
        path.observe_crossing(resumed - arrival - outcome.latency_ms)
    if outcome.reason is not None or not outcome.outputs:
        runtime.note_answer(name, outcome.reason or DropReason.EXECUTION_FAILED)
        raise RequestDropped(outcome.reason or DropReason.EXECUTION_FAILED)
    response = encode_outcome(outcome, as_json, dumps)
    done = clock.now_ms()
    request.environ[ANSWERED] = done
    # The answer is written after this check, and the client must wake to read it: the
    # check keeps back the time both take (``pathcost.RequestPathCost.write_reserve_ms``).
    reserve = runtime.path_cost.write_reserve_ms()
    late = outcome.late or (deadline is not None and done + reserve > deadline)
    if late and not late_ok:
        runtime.note_answer(name, DropReason.DEADLINE_MISSED, counted=outcome.late)
        raise RequestDropped(DropReason.DEADLINE_MISSED)
    runtime.note_answer(name, None)
    if late:
        response.headers.append((LATE_HEADER, "true"))
    if path is not None:
        path.observe(back_ms=done - (arrival + outcome.latency_ms),
                     cpu_ms=(submitted - began) + (done - resumed), front_ms=submitted - arrival)
    return response


class WriteTimed:
    """An answer's body whose ``close`` (the WSGI server's, once it is written) times the
    write from the answer's last check (or from its making, for an answer that had
    none): what the last check must keep back."""

    def __init__(self, runtime: ServingRuntime, environ: dict[str, Any], body: bytes):
        self._runtime, self._body = runtime, body
        self._stamp = environ.get(ANSWERED) or runtime.clock.now_ms()

    def __iter__(self) -> Iterator[bytes]:
        return iter((self._body,))

    def close(self) -> None:
        self._runtime.path_cost.observe_write(self._runtime.clock.now_ms() - self._stamp)


def limited_body(environ: Mapping[str, Any], limit: int) -> bytes:
    """A request's body within ``limit`` bytes (``contracts.httpserve.read_body``)."""
    try:
        return read_body(environ, limit)
    except BodyTooLarge as exc:
        raise PayloadTooLarge(str(exc)) from None
    except BadContentLength as exc:
        raise BadRequest(str(exc)) from None


def parsed_json(raw: bytes) -> object:
    """A body as JSON within ``contracts.jsonbody``'s limits."""
    try:
        return parse_json(raw)
    except JsonBodyError as exc:
        raise BadRequest(f"body: {exc.problem}") from None


def json_body() -> object:
    """The current Flask request's body as JSON, within the app's size limit."""
    return parsed_json(limited_body(current_request.environ,
                                    current_app.config["MAX_CONTENT_LENGTH"]))


def _decode(request: InferRequest, dtype: np.dtype, as_json: bool) -> np.ndarray:
    if as_json:
        return decode_json_inputs(parsed_json(request.body()), dtype)
    if request.mimetype == NPY_TYPE:
        return decode_npy(request.body())
    raise BadRequest(f"Content-Type must be {NPY_TYPE} or {JSON_TYPE}")


def encode_outcome(outcome: Outcome, as_json: bool, dumps: Callable[[object], bytes]) -> Answer:
    """The 200 answer: JSON outputs, or the first output as ``.npy``."""
    assert outcome.outputs is not None
    if as_json:
        return Answer(200, dumps({"outputs": [o.tolist() for o in outcome.outputs],
                                  "latency_ms": outcome.latency_ms}), JSON_TYPE)
    return Answer(200, encode_npy(outcome.outputs[0]), NPY_TYPE,
                  [("X-Tandem-Latency-Ms", f"{outcome.latency_ms:.3f}")])
