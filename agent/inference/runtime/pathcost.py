"""The request path's own cost: measured at start-up, then from the requests served.

What a request spends outside the executor counts against its deadline and takes
the host's CPU: waiting for a worker, reading and decoding the body, the hand-off
to the executor thread (the *front*), and the hand-off back, encoding and writing
the answer (the *back*). Admission and the duty-cycle plan count both:

- latency: each session is planned with its SLO less the front and back time a
  request takes (the observed ``quantile``, never below the start-up figure);
  the executor's deadline for a request is the client's less the back time;
- CPU: the sessions' rates times the CPU time per request (a fixed part and a
  part per byte) must fit the cores the request path has (``RequestPathLimits``).

The start-up figure (``calibrate``) times the same steps on this host as it is
now (busy or quiet): loopback connections, ``.npy`` decoding and encoding at two
sizes, and a hand-off between threads.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agent.inference.runtime.tensors import coerce_input, decode_npy, encode_npy
from contracts.deadline import AnswerReserve

_REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"


@dataclass(frozen=True)
class PathFigures:
    """One estimate of the request path: latency (ms) and CPU per request."""

    front_ms: float
    back_ms: float
    cpu_ms: float
    """CPU time per request, fixed part."""
    cpu_ms_per_kib: float = 0.0
    wake_ms: float = 0.0
    """One thread's wake-up tail on this host (the client reading its answer is one)."""
    write_ms: float = 0.0
    """Writing a small answer to a loopback socket."""

    def cpu_per_request_ms(self, body_bytes: float) -> float:
        return self.cpu_ms + self.cpu_ms_per_kib * body_bytes / 1024.0

    def to_json(self) -> dict[str, float]:
        return {"front_ms": self.front_ms, "back_ms": self.back_ms, "cpu_ms": self.cpu_ms,
                "cpu_ms_per_kib": self.cpu_ms_per_kib, "wake_ms": self.wake_ms,
                "write_ms": self.write_ms}


ZERO = PathFigures(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class RequestPathLimits:
    """What the request path may hold on this host."""

    workers: int
    """HTTP worker threads; each holds a request until it is answered."""
    cores: float
    """Cores the request path may use beside the executor."""
    max_load: float = 0.7
    """Share of ``cores`` admission may fill (queueing grows fast beyond it)."""

    def workers_needed(self, in_flight: float) -> int:
        """Workers that hold ``in_flight`` requests on average (Little's law) with
        Poisson bursts: the mean plus three standard deviations."""
        return math.ceil(in_flight + 3.0 * math.sqrt(in_flight)) + 1 if in_flight > 0 else 0


class HostLimits:
    """The request path's limits as the host is now: measured again when admission asks
    and the last measurement is older than ``max_age_s`` (a CPU hog that started after
    the server did counts at the next registration, not never)."""

    def __init__(self, measure: Callable[[], RequestPathLimits], max_age_s: float = 2.0,
                 timer: Callable[[], float] = time.monotonic):
        self._measure = measure
        self._max_age_s = max_age_s
        self._timer = timer
        self._limits = measure()
        self._at = timer()

    def now(self) -> RequestPathLimits:
        """The limits, measured again if the last measurement is too old."""
        if self._timer() - self._at > self._max_age_s:
            self._limits, self._at = self._measure(), self._timer()
        return self._limits


def current_limits(limits: RequestPathLimits | HostLimits | None) -> RequestPathLimits | None:
    """The limits to admit with now (``HostLimits`` measures the host again)."""
    return limits.now() if isinstance(limits, HostLimits) else limits


class RequestPathCost:
    """The request path's figures: the start-up calibration, raised by what serving shows.

    Thread-safe: HTTP workers ``observe``, the executor thread and registrations read.
    """

    def __init__(self, startup: PathFigures = ZERO, quantile: float = 0.99,
                 window: int = 2000, min_samples: int = 50):
        self.startup = startup
        """What ``calibrate`` measured (``recalibrate`` replaces it)."""
        self._quantile = quantile
        self._min_samples = min_samples
        self._front: deque[float] = deque(maxlen=window)
        self._back: deque[float] = deque(maxlen=window)
        self._cpu: deque[float] = deque(maxlen=window)
        self._crossing: deque[float] = deque(maxlen=window)
        self.answer = AnswerReserve(startup.write_ms, quantile, window,
                                    min_samples)
        """The write half of the last check's reserve (every answer's write observed)."""
        self._lock = threading.Lock()
        self.observed = 0

    def recalibrate(self, startup: PathFigures) -> None:
        """Take a new start-up measurement (the server measures once its app exists)."""
        with self._lock:
            self.startup = startup
        self.answer.floor_ms = startup.write_ms

    def observe_front(self, front_ms: float) -> None:
        """One request's time from arrival until it was queued, or until it was dropped
        there: the tail that drops requests is the one planning must see."""
        with self._lock:
            self._front.append(front_ms)

    def observe(self, back_ms: float, cpu_ms: float) -> None:
        """One request answered after the executor: its time after its result, and the
        CPU its worker spent on it."""
        with self._lock:
            self._back.append(back_ms)
            self._cpu.append(cpu_ms)
            self.observed += 1

    def observe_crossing(self, ms: float) -> None:
        """The time from the executor's result to the waiting worker running again (one
        thread wake-up), for every SLO request the executor answered, dropped ones too
        (a best-effort job's, which wait while best effort runs, do not set the figure
        the SLO sessions are planned with)."""
        with self._lock:
            self._crossing.append(ms)

    def observe_write(self, write_ms: float) -> None:
        """One answer's time from the last deadline check until it was written."""
        self.answer.observe(write_ms)

    def write_reserve_ms(self) -> float:
        """What the last deadline check keeps back: writing the answer (``AnswerReserve``)
        and the client's wake-up to read it: one thread wake-up on this host, the start-up
        tail or, once requests were served, the observed quantile of this process's
        executor-to-worker hand-off (one wake-up), whichever is longer."""
        return self.answer.reserve_ms() + max(self.startup.wake_ms, self.crossing_ms())

    def crossing_ms(self) -> float:
        """The observed quantile of the executor-to-worker crossing (0 before enough)."""
        with self._lock:
            if len(self._crossing) < self._min_samples:
                return 0.0
            return _quantile(self._crossing, self._quantile)

    def back_reserve_ms(self) -> float:
        """What a request's executor deadline keeps for its answer to come back: the
        median observed (the start-up figure until enough requests were served). Not
        the 99th percentile: a request dropped for it is a certain miss, while the
        last deadline check still refuses the rare answer that comes back too late."""
        with self._lock:
            if len(self._back) < self._min_samples:
                return self.startup.back_ms
            return _quantile(self._back, 0.5)

    def figures(self) -> PathFigures:
        """The startup figures, raised to the observed quantile (latency) and mean (CPU)
        once enough requests were served."""
        with self._lock:
            if len(self._front) < self._min_samples or len(self._back) < self._min_samples:
                return self.startup
            front = _quantile(self._front, self._quantile)
            back = _quantile(self._back, self._quantile)
            cpu = sum(self._cpu) / len(self._cpu)
        s = self.startup
        return PathFigures(max(front, s.front_ms), max(back, s.back_ms), max(cpu, s.cpu_ms),
                           s.cpu_ms_per_kib, s.wake_ms, s.write_ms)


def _quantile(values: deque[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def calibrate(repeats: int = 40, quantile: float = 0.9,
              probe: Callable[[bytes], object] | None = None) -> PathFigures:
    """Time the request path's steps on this host now (about 0.2-1 s).

    ``probe``: one request through the server's own web framework (routing,
    parsing, an error answer) with the given ``.npy`` body, timed like the rest.

    A request crosses threads four times (the accept loop to a worker, the worker to
    the executor, the executor to a post-processing thread, that thread back to the
    worker); on a busy host each crossing waits for a core, so the tail of one
    crossing (99th percentile of 5x ``repeats``) is counted four times. The tail is
    timed with the setter still running Python, as a worker or the executor loop is
    after a hand-off while serving: the woken thread then also waits for the
    interpreter lock (up to ``sys.getswitchinterval()``), which an idle hand-off
    never shows (0.04 ms idle against 8-28 ms observed crossings on a 2-core host)."""
    connect = _connections(repeats)
    small, large = 64, 256 * 1024
    decode_small = _codec(small // 4, repeats)
    decode_large = _codec(large // 4, max(repeats // 4, 5))
    wake = _wakeups(repeats)
    loaded = _wakeups(5 * repeats, busy=True)
    body = encode_npy(np.zeros((1, small // 4), np.float32))
    framework = _timed(lambda: probe(body), repeats) if probe else [0.0]
    per_kib = max(0.0, (_median(decode_large) - _median(decode_small)) / ((large - small) / 1024))
    q = lambda xs: _quantile(deque(xs), quantile)  # noqa: E731
    tail = _quantile(deque(loaded), 0.99)
    return PathFigures(front_ms=q(connect) + q(framework) + q(decode_small) + 2 * tail,
                       back_ms=2 * tail + q(decode_small) / 2,
                       cpu_ms=_median(connect) + _median(framework) + _median(decode_small)
                       + 4 * _median(wake),
                       cpu_ms_per_kib=per_kib, wake_ms=tail,
                       write_ms=_median(connect) / 2)


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    took = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        took.append((time.perf_counter() - start) * 1000)
    return took


def core_share(seconds: float = 0.5) -> float:
    """The share of one core a busy thread of this process gets now (1.0 on a quiet host)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    while time.perf_counter() - wall < seconds:
        pass
    return min(1.0, (time.thread_time() - cpu) / max(time.perf_counter() - wall, 1e-9))


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _connections(repeats: int) -> list[float]:
    """Loopback connect, send a request head, read an answer, close (ms each)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(repeats)
    port = listener.getsockname()[1]

    def answer() -> None:
        for _ in range(repeats):
            conn, _addr = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(_REPLY)

    server = threading.Thread(target=answer, daemon=True)
    server.start()
    took = []
    head = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(head)
                while sock.recv(4096):
                    pass
            took.append((time.perf_counter() - start) * 1000)
    finally:
        server.join(timeout=5)
        listener.close()
    return took


def _codec(floats: int, repeats: int) -> list[float]:
    """Decode, check and encode one ``.npy`` body of ``floats`` float32s (ms each)."""
    body = encode_npy(np.zeros((1, floats), np.float32))
    took = []
    for _ in range(repeats):
        start = time.perf_counter()
        array = coerce_input(decode_npy(body), np.dtype(np.float32), (floats,), True)
        encode_npy(array)
        took.append((time.perf_counter() - start) * 1000)
    return took


def _wakeups(repeats: int, busy: bool = False) -> list[float]:
    """How long a thread waiting on an event takes to run once it is set (ms each).
    ``busy``: the setter goes on running Python, as a worker or the executor loop does
    after handing a result over, so the woken thread also waits for the interpreter
    lock (up to ``sys.getswitchinterval()``)."""
    go, back = threading.Event(), threading.Event()
    woke: list[float] = []

    def waiter() -> None:
        for _ in range(repeats):
            go.wait()
            woke.append(time.perf_counter())
            go.clear()
            back.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    took = []
    for _ in range(repeats):
        set_at = time.perf_counter()
        go.set()
        while busy and not back.is_set() and time.perf_counter() - set_at < 5.0:
            sum(range(100))
        if not back.wait(timeout=5):
            break
        back.clear()
        took.append((woke[-1] - set_at) * 1000)
    thread.join(timeout=5)
    return took


@dataclass(frozen=True)
class PathLoad:
    """One SLO session as the request path sees it."""

    rate_rps: float
    held_ms: float
    """How long each request holds an HTTP worker at most."""
    body_bytes: float


@dataclass(frozen=True)
class HostRefusal:
    """The request path cannot hold the sessions: why, and the numbers."""

    reason: str
    """``RequestPathCpu`` (cores) or ``RequestWorkers`` (threads)."""
    required: float
    available: float

    def message(self) -> str:
        what = ("the request path needs {r:.3g} cores of the {a:.3g} it may use"
                if self.reason == "RequestPathCpu"
                else "the requests in flight need {r:.0f} HTTP workers, the server has {a:.0f}")
        return f"{self.reason}: " + what.format(r=self.required, a=self.available)


def queue_tail_ms(loads: list[PathLoad], figures: PathFigures,
                  limits: RequestPathLimits | None) -> float:
    """The 99th percentile of a request's time queued for and served on the request
    path's CPU: M/M/1 with the path as one server of ``limits.cores`` (a share of a
    core), ``S * ln(100) / (1 - rho)``; infinite when the path is saturated."""
    if limits is None or not loads:
        return 0.0
    rate = sum(x.rate_rps for x in loads)
    if rate <= 0:
        return 0.0
    demand = sum(x.rate_rps * figures.cpu_per_request_ms(x.body_bytes) for x in loads) / 1000.0
    rho = demand / limits.cores
    if rho >= 1.0:
        return math.inf
    service_ms = demand * 1000.0 / rate / limits.cores
    return service_ms * math.log(100.0) / (1.0 - rho)


def host_refusal(loads: list[PathLoad], figures: PathFigures,
                 limits: RequestPathLimits | None) -> HostRefusal | None:
    """None when the request path holds ``loads`` (or has no limits), else why not."""
    if limits is None:
        return None
    cores = sum(x.rate_rps * figures.cpu_per_request_ms(x.body_bytes) for x in loads) / 1000.0
    if cores > limits.cores * limits.max_load:
        return HostRefusal("RequestPathCpu", cores, limits.cores * limits.max_load)
    in_flight = sum(x.rate_rps * x.held_ms for x in loads) / 1000.0
    needed = limits.workers_needed(in_flight)
    if needed > limits.workers:
        return HostRefusal("RequestWorkers", needed, limits.workers)
    return None
