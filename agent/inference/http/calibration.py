"""The request path's start-up figures from real requests through a real HTTP front.

Timing the path's steps one at a time (``pathcost.calibrate``) and adding their tails
overstates it: a request rarely meets every step's 99th percentile at once (on a quiet
2-core host the sum was 50-75 ms, while served requests spent 5-20 ms there), and the
steps' CPU summed to half of what a served request costs (1.15 against 2.34 ms). Here a
client in another process sends ``.npy`` requests over loopback, a new connection each, in
Poisson arrivals at a few rates, to a cheroot server hardened and with the same connection
files as the real one (``httpfront.direct_files``), its one route answered from the WSGI
environ as the real inference route is, doing what that route does around the executor:
read the body, decode and check it, hand it to another thread and wait for the result,
encode and write it. What comes back per request is the whole path as the client sees it
(connect, front, the crossing back, encode, write and the client's own wake-up) without
the stand-in executor's time, and the server process's CPU per request:

- ``path_ms``: the 99th percentile of that whole path at the lowest rate (the part no
  queue of this server's CPU explains: ``pathcost.queue_tail_ms`` adds that);
- ``queue_scale``: how much longer the path's tail grew from the lowest rate to the
  higher ones than the CPU queue model with the measured CPU foresees (at least 1), so
  admission's queue is the one measured, not one that under-predicts;
- ``front_ms``/``back_ms``/``write_ms``/``wake_ms``: the same requests' split (p99, the
  write's median), for the executor's deadline and the last check's reserve.

One stall of the host during the lowest rate sets its p99 alone (83 ms in one start of a
quiet 2-core host, 7-16 ms in the others of the same run, and a 50 ms session refused on
it): where that p99 is over ``STALL_RATIO`` times its median the measurement is made once
more and the lower path kept (a busy host stays slow in both). At an SLO registration the
stand-in executor runs the sessions' own models on the real executor
(``runtime.probe_work``) at the rate they will send (``probe_at``): beside a CPU hog the
path with the executor busy was 3-6 times what a start-up with an idle stand-in showed.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from queue import SimpleQueue
from typing import Any

import numpy as np

from agent.inference.runtime.execution import EXECUTOR_NICE
from agent.inference.runtime.pathcost import (
    BatchWork,
    PathFigures,
    PathLoad,
    RequestPathLimits,
    queue_tail_ms,
)
from agent.inference.runtime.tensors import NPY_TYPE, coerce_input, decode_npy, encode_npy
from contracts.httpfront import direct_files
from contracts.httpserve import ARRIVED, harden, read_body

RATES_RPS = (75.0, 200.0)
"""The rates the path is timed at (requests/s), each for ``SECONDS``: the first is the
path's own tail (its p99 needs a hundred requests), the others how it grows with load."""
SECONDS = (2.0, 1.0)
CLIENT_TIMEOUT_S = 10.0
"""A request not answered within this counts as taking it (it is in the path's tail)."""
STALL_RATIO = 4.0
"""The lowest rate's path p99 over its median beyond which the measurement is repeated."""
WARM_UP = 40
"""Requests sent one at a time before the timed ones: a fresh process's first requests
through the framework import and cache what later ones reuse (tens of ms)."""
FLOATS = 2048
"""The body: one float32 row of this width (a small MLP's input, 8 KiB)."""

_CLIENT = r"""
import http.client, json, random, sys, threading, time
spec = json.loads(sys.stdin.readline())
body = bytes.fromhex(spec["body"])
out, lock = [], threading.Lock()
def one(rid, which):
    start = time.monotonic()
    status = -1
    try:
        conn = http.client.HTTPConnection("127.0.0.1", spec["port"], timeout=spec["timeout"])
        conn.request("POST", "/calibrate", body, {"Content-Type": "application/x-npy",
                                                   "X-Calibration-Id": str(rid)})
        answer = conn.getresponse()
        answer.read()
        status = answer.status
        conn.close()
    except Exception:
        pass
    with lock:
        out.append([rid, status, start, time.monotonic(), which])
for rid in range(-spec["warm_up"], 0):  # the first requests import and cache: not timed
    one(rid, -1)
threads, rid, rng = [], 0, random.Random(spec["seed"])
for which, (rate, seconds) in enumerate(zip(spec["rates"], spec["seconds"])):
    began = t = time.monotonic()
    while True:
        t += rng.expovariate(rate)
        if t - began > seconds:
            break
        delay = t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=one, args=(rid, which), daemon=True)
        th.start()
        threads.append(th)
        rid += 1
    for th in threads:
        th.join(spec["timeout"] + 5)
    print(json.dumps({"rate": rate, "done": time.monotonic()}), flush=True)
    sys.stdin.readline()
print(json.dumps(out), flush=True)
"""


@dataclass
class _Stamps:
    """What the server saw of each calibration request (``time.monotonic()`` seconds)."""

    rows: dict[int, dict[str, float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, rid: int, **stamps: float) -> None:
        with self.lock:
            self.rows.setdefault(rid, {}).update(stamps)


class _Written:
    """The answer's body; its ``close`` (the WSGI server's, once written) stamps it."""

    def __init__(self, stamps: _Stamps, rid: int, body: bytes):
        self._stamps, self._rid, self._body = stamps, rid, body

    def __iter__(self) -> Any:
        return iter((self._body,))

    def close(self) -> None:
        self._stamps.put(self._rid, written=time.monotonic())


def _app(stamps: _Stamps, crossing: SimpleQueue) -> Any:
    """A WSGI app doing the inference route's work around the executor, answered from the
    environ as the real route is (``app._infer_route``: no framework on this path)."""

    def calibrate(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        rid = int(environ.get("HTTP_X_CALIBRATION_ID", "-1"))
        arrived = float(environ.get(ARRIVED, time.monotonic()))
        body = read_body(environ, 1 << 20)
        tensor = coerce_input(decode_npy(body), np.dtype(np.float32), (FLOATS,), True)
        submitted = time.monotonic()
        future: Future[tuple[np.ndarray, float]] = Future()
        crossing.put((tensor, future))
        result, ready = future.result(timeout=10)
        resumed = time.monotonic()
        answer = encode_npy(result)
        start_response("200 OK", [("Content-Type", NPY_TYPE),
                                  ("Content-Length", str(len(answer)))])
        stamps.put(rid, arrived=arrived, submitted=submitted, ready=ready, resumed=resumed,
                   done=time.monotonic())
        return _Written(stamps, rid, answer)

    return calibrate


def _executor_stand_in(crossing: SimpleQueue, work: Callable[[], None] | None,
                       batch_work: BatchWork | None, spent: list[float],
                       stretch: list[float], cycle_ms: float = 0.0) -> None:
    """Takes the requests waiting as one batch on another thread, runs ``work`` once
    for each (or ``batch_work`` once for the batch: the executor's compute, outside the
    interpreter lock, at the executor's priority: an executor busier with more
    requests, as a real one is) and hands each result back, as the executor loop does.
    ``spent``: the CPU seconds the runs took (the executor's, not the request path's);
    ``stretch``: each run's time over its CPU time. ``cycle_ms``: a batch starts at most
    once in this (the plan's duty cycle), so batches hold the requests of a cycle, as
    served: their answers then wake that many workers at once, whose way back queues
    for the interpreter lock (a 150 ms session planned at batch 8 met a 12.8 ms way back
    at p99 where a probe taking each request as it came measured 5.3 ms)."""
    if work is not None or batch_work is not None:
        import os

        with contextlib.suppress(OSError, AttributeError):  # the executor's priority
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid)
                           + EXECUTOR_NICE)
    while True:
        batch = [crossing.get()]
        if cycle_ms > 0 and None not in batch:
            time.sleep(cycle_ms / 1000.0)  # the cycle's requests come in meanwhile
        while not crossing.empty():
            batch.append(crossing.get())
        if None in batch:
            return
        runs = ([lambda n=len(batch): batch_work(n)] if batch_work is not None
                else [work] * len(batch) if work is not None else [])
        for run in runs:
            cpu, wall = time.thread_time(), time.perf_counter()
            run()
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            spent[0] += cpu
            stretch.append(wall / max(cpu, 1e-9))
        ready = time.monotonic()
        for tensor, future in batch:
            future.set_result((tensor, ready))


@dataclass(frozen=True)
class RateSample:
    """One rate's requests: the whole path's p99 (ms) and the CPU per request (ms)."""

    rate_rps: float
    answered: int
    path_p99_ms: float
    path_p90_ms: float
    cpu_ms: float
    path_p50_ms: float = 0.0

    def stalled(self) -> bool:
        """The p99 far above the median: a stall of the host, not the path's own tail."""
        return self.path_p99_ms > STALL_RATIO * max(self.path_p50_ms, 1e-3)


def measure(http_threads: int, rates: tuple[float, ...] = RATES_RPS,
            seconds: tuple[float, ...] = SECONDS, seed: int = 0,
            work: Callable[[], None] | None = None, batch_work: BatchWork | None = None,
            cycle_ms: float = 0.0) -> tuple[PathFigures, list[RateSample]]:
    """Time real requests through a real HTTP front on this host now (``sum(seconds)``
    and about 0.3 s to start the client, twice where the lowest rate met a stall); the
    figures and what each rate showed. The stand-in executor runs ``work`` for each
    request, or ``batch_work`` for each batch of at most a ``cycle_ms`` (none: it computes
    nothing)."""
    figures, samples = _measure_once(http_threads, rates, seconds, seed, work, batch_work,
                                     cycle_ms=cycle_ms)
    if samples[0].stalled():
        again = _measure_once(http_threads, rates, seconds, seed + 1, work, batch_work,
                              cycle_ms=cycle_ms)
        if again[0].path_ms < figures.path_ms:
            figures, samples = again
    return figures, samples


def probe_at(http_threads: int, rate_rps: float, batch_work: BatchWork,
             cycle_ms: float = 0.0) -> PathFigures:
    """The path beside the executor running ``batch_work`` for each batch (the sessions'
    own models, ``probe_work.own_batches``) of the requests of one ``cycle_ms`` (the
    plan's duty cycle; 0: each batch takes what waits), at the start-up's lowest rate and at the
    rate the SLO sessions will send (``rate_rps``; twice the lowest at least, for the
    queue's growth): an SLO registration's view of the host as it will be, a CPU hog's
    effect on both included, and the rates between for a session scaled down."""
    low = RATES_RPS[0]
    figures = measure(http_threads, (low, max(rate_rps, 2.0 * low)), batch_work=batch_work,
                      cycle_ms=cycle_ms)[0]
    return replace(figures, cycle_ms=cycle_ms)


def _measure_once(http_threads: int, rates: tuple[float, ...], seconds: tuple[float, ...],
                  seed: int, work: Callable[[], None] | None, batch_work: BatchWork | None,
                  cycle_ms: float = 0.0) -> tuple[PathFigures, list[RateSample]]:
    """One measurement (``measure``)."""
    from cheroot import wsgi

    stamps, crossing, spent, stretch = _Stamps(), SimpleQueue(), [0.0], []
    stand_in = threading.Thread(target=_executor_stand_in,
                                args=(crossing, work, batch_work, spent, stretch, cycle_ms),
                                daemon=True, name="tandem-calibration-executor")
    stand_in.start()
    server = direct_files(harden(wsgi.Server(("127.0.0.1", 0), _app(stamps, crossing),
                                             numthreads=http_threads, request_queue_size=128),
                                 10.0, 1 << 20))
    server.prepare()
    serving = threading.Thread(target=server.serve, daemon=True, name="tandem-calibration")
    serving.start()
    body = encode_npy(np.zeros((1, FLOATS), np.float32))
    client = subprocess.Popen([sys.executable, "-c", _CLIENT], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdin is not None and client.stdout is not None
        client.stdin.write(json.dumps({"port": server.bind_addr[1], "rates": list(rates),
                                       "seconds": list(seconds), "seed": seed, "warm_up": WARM_UP,
                                       "timeout": CLIENT_TIMEOUT_S,
                                       "body": body.hex()}) + "\n")
        client.stdin.flush()
        cpu, shares = [], []
        for _ in rates:
            at, executor, runs = time.process_time(), spent[0], len(stretch)
            json.loads(client.stdout.readline())
            cpu.append(time.process_time() - at - (spent[0] - executor))
            stretched = _p99(stretch[runs:])
            shares.append(min(1.0, max(0.05, 1.0 / stretched)) if stretched else 1.0)
            client.stdin.write("\n")
            client.stdin.flush()
        records = json.loads(client.stdout.readline())
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate(timeout=10)  # waits, and closes its pipes
        server.stop()
        crossing.put(None)
    figures, samples = _figures(records, stamps.rows, rates, cpu)
    if work is None and batch_work is None:
        return figures, samples
    # How much longer than its CPU time a run of the executor's priority took beside the
    # path at each rate, at p99 (the learned margin's quantile): admission plans the
    # executor so at the rate the sessions will send.
    return replace(figures, executor_at=tuple(zip(rates, shares, strict=True))), samples


def _figures(records: list[list[float]], rows: dict[int, dict[str, float]],
             rates: tuple[float, ...], cpu_s: list[float]) -> tuple[PathFigures, list[RateSample]]:
    """The figures from the client's records ``[id, status, start, end, rate index]``
    and the server's stamps."""
    by_id = {int(r[0]): r for r in records}
    samples, split = [], {"front": [], "back": [], "write": [], "wake": []}
    for which, (rate, cpu) in enumerate(zip(rates, cpu_s, strict=True)):
        whole = []
        for rid in (int(r[0]) for r in records if r[4] == which):
            rec, row = by_id[rid], rows.get(rid, {})
            if rec[1] != 200 or "written" not in row:  # unanswered: as long as a client waits
                whole.append(CLIENT_TIMEOUT_S * 1000)
                continue
            executor = row["ready"] - row["submitted"]
            whole.append((rec[3] - rec[2] - executor) * 1000)
            if which == 0:
                split["front"].append((row["submitted"] - rec[2]) * 1000)
                split["back"].append((row["done"] - row["ready"]) * 1000)
                split["write"].append((row["written"] - row["done"]) * 1000)
                split["wake"].append(max(rec[3] - row["written"], 0.0) * 1000)
        answered = sum(1 for r in records if r[4] == which and r[1] == 200)
        samples.append(RateSample(rate, answered, _p99(whole), _p99(whole, 0.90),
                                  cpu * 1000 / answered if answered else math.inf,
                                  _p99(whole, 0.50)))
    if len(split["front"]) < 5:
        raise RuntimeError(f"the request path's calibration: {len(split['front'])} of "
                           f"{sum(1 for r in records if r[4] == 0)} requests at "
                           f"{rates[0]:g}/s answered within {CLIENT_TIMEOUT_S:g} s")
    cpu_ms = max(s.cpu_ms for s in samples if s.answered)
    figures = PathFigures(front_ms=_p99(split["front"]), back_ms=_p99(split["back"]),
                          cpu_ms=cpu_ms, wake_ms=_p99(split["wake"]),
                          write_ms=sorted(split["write"])[len(split["write"]) // 2],
                          path_ms=samples[0].path_p99_ms, path_rate_rps=rates[0])
    return replace(figures, queue_scale=_queue_scale(figures, samples)), samples


def _queue_scale(figures: PathFigures, samples: list[RateSample]) -> float:
    """The measured tail's growth over the lowest rate's, against the CPU queue model's
    growth between the same rates (at least 1: the model is never trusted below what
    was seen). Compared at the 90th percentile: at the 95th, a stall of the host during
    the higher rate's 150 requests made it 4.5 in one of three runs on a quiet host
    and 1.0-1.1 in the others, flipping admission's verdicts."""
    limits = RequestPathLimits(workers=1 << 10, cores=1.0)
    at90 = math.log(10.0) / math.log(100.0)  # the model's p90 over its p99

    def model(rate: float) -> float:
        return queue_tail_ms([PathLoad(rate, 0.0, 0.0)], figures, limits) * at90

    base, scale = samples[0], 1.0
    for s in samples[1:]:
        grew, foreseen = s.path_p90_ms - base.path_p90_ms, model(s.rate_rps) - model(base.rate_rps)
        if s.answered >= 20 and foreseen > 0 and math.isfinite(foreseen) and grew > foreseen:
            scale = max(scale, grew / foreseen)
    return scale


def _p99(values: list[float], q: float = 0.99) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
