"""The executor's latency tail on this host, measured at start-up, before any batch.

The learned latency margin (``admission.LatencyMargin``) needs a hundred batches;
until then a server plans with its profiles, which are medians of a few runs. On a
busy host (a CPU hog, other work) a CPU executor's thread, running below the
request path's priority, is preempted now and then for far longer than a median
shows, and sessions admitted on the medians were missed after admission (a 250 ms
session at 64% beside a hog). ``start_delay_ms`` times a fixed single-threaded
workload of about a millisecond on a thread at the executor's priority, as the
host is now, and gives the ``quantile`` of run time less the median: the delay a
preemption adds to a batch, which planning adds to every batch time until served
batches give the learned margin. A delay, not a ratio: a 40 ms preemption
stretches a 1 ms run 40-fold but a 13 ms batch only 4-fold. A quiet host gives
about 0.

The same runs give the share of a core the executor's priority gets (its thread's
CPU time over the time taken): beside a CPU hog the executor's batches ran at 8.7x
their profile at p99 (a 250 ms session admitted at its full rate lost 17% after
admission), which a delay alone does not foresee. Planning takes every batch at
1/share of its profile at least, measured at start-up and again at each SLO
registration (``measure_host``), so a host that got busier is seen before it is
promised to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agent.inference.executors.executors import Executor
from agent.inference.runtime.execution import yield_cpu_to_request_path


def elementwise(floats: int = 1_000_000) -> Callable[[], None]:
    """One thread's pass over ``floats`` float32s (about 1 ms on a current core)."""
    data = np.linspace(0.0, 1.0, floats, dtype=np.float32)
    out = np.empty_like(data)

    def run() -> None:
        np.sqrt(data, out=out)
        np.multiply(out, data, out=out)

    return run


@dataclass(frozen=True)
class ExecutorHost:
    """The host as the executor's priority finds it now."""

    delay_ms: float
    """The delay a preemption adds to a batch (``quantile`` less median)."""
    share: float
    """The share of one core a thread at the executor's priority gets (1: all of it)."""


def measure_host(executor: Executor, quantile: float, repeats: int = 100,
                 work: Callable[[], None] | None = None,
                 timer: Callable[[], float] = time.perf_counter,
                 cpu_timer: Callable[[], float] = time.thread_time) -> ExecutorHost:
    """``repeats`` timed runs of ``work`` (``elementwise``) on a thread at the
    executor's priority: their ``quantile`` less their median (ms, never < 0), and the
    thread's CPU time over the time they took (at most 1, at least 0.05)."""
    took: list[float] = []
    spent: list[float] = []
    run = work or elementwise()

    def measure() -> None:
        yield_cpu_to_request_path(executor)  # the executor's own priority
        cpu = cpu_timer()
        for _ in range(repeats):
            start = timer()
            run()
            took.append(timer() - start)
        spent.append(cpu_timer() - cpu)

    thread = threading.Thread(target=measure, name="tandem-tail", daemon=True)
    thread.start()
    thread.join()
    ordered = sorted(took)
    if len(ordered) < repeats or not spent:
        return ExecutorHost(0.0, 1.0)
    tail = ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]
    share = min(1.0, max(0.05, spent[0] / max(sum(took), 1e-9)))
    return ExecutorHost(max(0.0, tail - ordered[len(ordered) // 2]) * 1000.0, share)


def steady_host(measure: Callable[[], ExecutorHost], rounds: int = 3) -> ExecutorHost:
    """The median share and delay of ``rounds`` measurements: one of 100 ms can meet a
    blip of the host, and a registration refused on it named a rate that the same
    registration, repeated at once, refused too (a hog present stays in every round)."""
    hosts = [measure() for _ in range(max(rounds, 1))]
    middle = len(hosts) // 2
    return ExecutorHost(sorted(h.delay_ms for h in hosts)[middle],
                        sorted(h.share for h in hosts)[middle])


def start_delay_ms(executor: Executor, quantile: float, repeats: int = 100,
                   work: Callable[[], None] | None = None,
                   timer: Callable[[], float] = time.perf_counter) -> float:
    """``measure_host``'s delay alone."""
    return measure_host(executor, quantile, repeats, work, timer).delay_ms
