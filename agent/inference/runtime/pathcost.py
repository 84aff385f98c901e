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

The start-up figure (``http.calibration.measure``) sends real requests through a
real HTTP front on this host as it is now (busy or quiet), from another process, at
a few rates: the whole path's tail as one figure (``path_ms``), not its steps' tails
added (a request rarely meets all of them at once), and the CPU a served request
really takes. An SLO registration before requests were served measures it again
beside an executor as busy as the sessions will keep it (``RequestPathCost.probe``);
once they were, what they showed stands for the host as it is, lower or higher.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from contracts.deadline import AnswerReserve
from contracts.window import SortedWindow


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
    path_ms: float = 0.0
    """The whole path's 99th percentile as real requests met it, connect to the client
    reading its answer, executor aside (``http.calibration``; 0: not measured so, the
    steps' tails are added instead)."""
    path_rate_rps: float = 0.0
    """The rate ``path_ms`` was measured at: its queue is in it already."""
    queue_scale: float = 1.0
    """How much the path's tail grew with the rate beyond what ``queue_tail_ms`` foresees
    (``http.calibration``): the queue admission counts is the model's times this."""
    executor_at: tuple[tuple[float, float], ...] = ()
    """(requests/s, share): what a CPU executor's priority met while the path served the
    calibration's requests at that rate (``http.calibration``; empty: not measured): one
    over its runs' time over their CPU time at the 99th percentile, the quantile the
    learned margin takes of batch time over profile. An idle host gives the executor a
    whole core; on a 2-core host its batches then ran at 7.4 times their profile at p99
    beside clients and the path at 100 requests/s, while the stand-in's mean share was
    0.8 and its p99 delay 2.3 ms, and sessions admitted on those lost 3-26% of their
    requests after admission."""

    cycle_ms: float = 0.0
    """The duty cycle whose requests the stand-in executor's batches held while measured
    (0: each batch took what waited; ``http.calibration``)."""

    def executor_share(self, rate_rps: float) -> float:
        """The executor's share of a core beside the path at ``rate_rps``: below the
        lowest rate measured, that rate's (not a whole core at none: a busy executor
        measured at 75 requests/s got 0.077 of a core on a loaded host, and a session
        planned at 45 requests/s on the 0.45 a line to a whole core gave ran its
        batches at 12.7 times their profile; at 20 requests/s, 4.7 times where the
        line said 1.2)."""
        points = sorted(self.executor_at)
        at_zero = points[0][1] if points else 1.0
        return min(1.0, max(0.05, _along(points, rate_rps, at_zero)))

    def cpu_per_request_ms(self, body_bytes: float) -> float:
        return self.cpu_ms + self.cpu_ms_per_kib * body_bytes / 1024.0

    def to_json(self) -> dict[str, Any]:
        return {"front_ms": self.front_ms, "back_ms": self.back_ms, "cpu_ms": self.cpu_ms,
                "cpu_ms_per_kib": self.cpu_ms_per_kib, "wake_ms": self.wake_ms,
                "write_ms": self.write_ms, "path_ms": self.path_ms,
                "path_rate_rps": self.path_rate_rps, "queue_scale": self.queue_scale,
                "executor_at": [list(x) for x in self.executor_at], "cycle_ms": self.cycle_ms}


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


BatchWork = Callable[[int], None]
"""The executor's compute for a batch of that many requests, run beside the path while it
is measured (``probe_work.own_batches``: the sessions' own models)."""


class RequestPathCost:
    """The request path's figures: the start-up calibration, then what serving shows.

    Thread-safe: HTTP workers ``observe``, the executor thread and registrations read.
    """

    def __init__(self, startup: PathFigures = ZERO, quantile: float = 0.99,
                 window: int = 2000, min_samples: int = 50,
                 probe: Callable[[float, BatchWork, float], PathFigures] | None = None):
        self.startup = startup
        """What the start-up calibration measured (``recalibrate`` replaces it)."""
        self.probe = probe
        """Measures the path on this host now at a rate (requests/s) beside an executor
        running the given batches, one each duty cycle (ms) at most
        (``http.calibration.probe_at``; None: not measured again after start-up)."""
        self._quantile = quantile
        self._min_samples = min_samples
        self._front = SortedWindow(window)
        self._back = SortedWindow(window)
        self._cpu: deque[float] = deque(maxlen=window)
        self._crossing = SortedWindow(window)
        self._whole = SortedWindow(window)
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

    def served(self) -> bool:
        """Whether enough requests were served for their own path to stand for the host."""
        with self._lock:
            return len(self._whole) >= self._min_samples

    def observe_front(self, front_ms: float) -> None:
        """One request's time from arrival until it was queued, or until it was dropped
        there: the tail that drops requests is the one planning must see."""
        with self._lock:
            self._front.append(front_ms)

    def observe(self, back_ms: float, cpu_ms: float, front_ms: float | None = None) -> None:
        """One request answered after the executor: its time after its result, the CPU
        its worker spent on it and (``front_ms``) its time before the queue, whose sum
        with ``back_ms`` is the request's own path (one request, both tails at once)."""
        with self._lock:
            self._back.append(back_ms)
            self._cpu.append(cpu_ms)
            if front_ms is not None:
                self._whole.append(front_ms + back_ms)
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

    def unseen_reserve_ms(self) -> float:
        """What the reserve will grow by once hand-offs are observed, as admission foresees
        it before: the way back measured with real requests (``back_ms``: the hand-off and
        the encoding) beyond the start-up wake-up (a 150 ms session was admitted on a
        6 ms reserve and served with 17 ms, its plan's tail dropped by the last check).
        Not kept back by serving before then: in the first seconds it dropped requests
        the served figures then passed (8 of a 20 requests/s session's first 40)."""
        if self.crossing_ms() or self.startup.path_ms <= 0:
            return 0.0
        return max(0.0, self.startup.back_ms - self.startup.wake_ms)

    def crossing_ms(self) -> float:
        """The observed quantile of the executor-to-worker crossing (0 before enough)."""
        with self._lock:
            if len(self._crossing) < self._min_samples:
                return 0.0
            return self._crossing.quantile(self._quantile)

    def back_reserve_ms(self) -> float:
        """What a request's executor deadline keeps for its answer to come back: the
        median observed (the start-up figure until enough requests were served). Not
        the 99th percentile: a request dropped for it is a certain miss, while the
        last deadline check still refuses the rare answer that comes back too late."""
        with self._lock:
            if len(self._back) < self._min_samples:
                return self.startup.back_ms
            return self._back.quantile(0.5)

    def own_ms(self, queue_ms: float) -> float:
        """A request's own time on the request path at p99, ``queue_ms`` its CPU queue's
        tail at the rates planned: with a start-up measured from real requests
        (``path_ms``), that whole path plus the queue scaled as measured, never below
        what served requests showed (their own path, each request's front and back
        together, and the last check's reserve), and once they were served, from what
        they showed where it is lower than the start-up's (one stall in its seconds
        must not decide admission for good); before that, the start-up path plus what
        the last check will keep back beyond the client's wake-up the path held
        (``unseen_reserve_ms``); else the steps' tails added (front, back,
        the reserve)."""
        figures = self.figures()
        if figures.path_ms <= 0:
            return figures.front_ms + figures.back_ms + self.write_reserve_ms() + queue_ms
        with self._lock:
            whole = (self._whole.quantile(self._quantile)
                     if len(self._whole) >= self._min_samples else 0.0)
        if not whole:  # the path measured holds the client's wake-up once, not the reserve
            return figures.path_ms + queue_ms * figures.queue_scale + self.unseen_reserve_ms()
        served = whole + self.write_reserve_ms()
        return max(min(figures.path_ms, served) + queue_ms * figures.queue_scale, served)

    def figures(self) -> PathFigures:
        """The startup figures, raised to the observed quantile (latency) and mean (CPU)
        once enough requests were served."""
        with self._lock:
            if len(self._front) < self._min_samples or len(self._back) < self._min_samples:
                return self.startup
            front = self._front.quantile(self._quantile)
            back = self._back.quantile(self._quantile)
            cpu = sum(self._cpu) / len(self._cpu)
        s = self.startup
        return replace(s, front_ms=max(front, s.front_ms), back_ms=max(back, s.back_ms),
                       cpu_ms=max(cpu, s.cpu_ms))


def _along(points: list[tuple[float, float]], rate_rps: float, at_zero: float) -> float:
    """The value at ``rate_rps`` of a figure measured at ``points`` (rate, value): linear
    between them (``at_zero`` at no requests), along the last two beyond them."""
    line = [(0.0, at_zero), *sorted(points)]
    if len(line) < 2 or rate_rps <= 0:
        return at_zero
    for (r0, v0), (r1, v1) in pairwise(line):
        if rate_rps <= r1 or r1 == line[-1][0]:
            return v0 + (v1 - v0) * (rate_rps - r0) / max(r1 - r0, 1e-9)
    return at_zero


def core_share(seconds: float = 0.5) -> float:
    """The share of one core a busy thread of this process gets now (1.0 on a quiet host)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    while time.perf_counter() - wall < seconds:
        pass
    return min(1.0, (time.thread_time() - cpu) / max(time.perf_counter() - wall, 1e-9))


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


def path_queue_ms(loads: list[PathLoad], figures: PathFigures,
                  limits: RequestPathLimits | None) -> float:
    """The CPU queue's tail a request's own path time gets at ``loads``: with a start-up
    figure from real requests (``path_ms``), which holds the queue at the rate it was
    measured at already, only what ``loads`` add beyond that rate (the model's
    ``S ln(100)`` at no load alone was twice the whole path measured at 50 requests/s
    on a 2-core host); else the whole tail (``queue_tail_ms``)."""
    tail = queue_tail_ms(loads, figures, limits)
    if figures.path_ms <= 0 or not math.isfinite(tail):
        return tail
    measured_at = queue_tail_ms([PathLoad(figures.path_rate_rps, 0.0, 0.0)], figures, limits)
    return max(0.0, tail - measured_at) if math.isfinite(measured_at) else tail


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
