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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
from flask import Request, Response, current_app, jsonify
from flask import request as current_request

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


def answer_infer(runtime: ServingRuntime, name: str, request: Request,
                 encode: Callable[[Outcome, bool], Response],
                 best_effort_timeout_seconds: float) -> Response:
    """Decode, queue, wait and answer one request; raises ServerError subclasses."""
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
    as_json = request.mimetype == "application/json"
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
    response = encode(outcome, as_json)
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
        response.headers[LATE_HEADER] = "true"
    if path is not None:
        path.observe(back_ms=done - (arrival + outcome.latency_ms),
                     cpu_ms=(submitted - began) + (done - resumed), front_ms=submitted - arrival)
    return response


def observe_write(runtime: ServingRuntime, request: Request, response: Response) -> None:
    """Time every inference answer's write, errors too, from its last check (or from
    now, for an answer that had none): what the last check must keep back."""
    clock = runtime.clock
    stamp = request.environ.get(ANSWERED) or clock.now_ms()
    response.call_on_close(lambda: runtime.path_cost.observe_write(clock.now_ms() - stamp))

def body() -> bytes:
    """The current request's body, within the app's size limit
    (``contracts.httpserve.read_body``)."""
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    try:
        return read_body(current_request.environ, limit)
    except BodyTooLarge as exc:
        raise PayloadTooLarge(str(exc)) from None
    except BadContentLength as exc:
        raise BadRequest(str(exc)) from None


def json_body() -> object:
    """The current request's body as JSON within ``contracts.jsonbody``'s limits."""
    try:
        return parse_json(body())
    except JsonBodyError as exc:
        raise BadRequest(f"body: {exc.problem}") from None


def _decode(request: Request, dtype: np.dtype, as_json: bool) -> np.ndarray:
    if as_json:
        return decode_json_inputs(json_body(), dtype)
    if request.mimetype == NPY_TYPE:
        return decode_npy(body())
    raise BadRequest(f"Content-Type must be {NPY_TYPE} or application/json")


def encode_outcome(outcome: Outcome, as_json: bool) -> Response:
    """The 200 answer: JSON outputs, or the first output as ``.npy``."""
    assert outcome.outputs is not None
    if as_json:
        return jsonify({"outputs": [o.tolist() for o in outcome.outputs],
                        "latency_ms": outcome.latency_ms})
    response = Response(encode_npy(outcome.outputs[0]), mimetype=NPY_TYPE)
    response.headers["X-Tandem-Latency-Ms"] = f"{outcome.latency_ms:.3f}"
    return response
