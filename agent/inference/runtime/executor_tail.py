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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

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


def start_delay_ms(executor: Executor, quantile: float, repeats: int = 100,
                   work: Callable[[], None] | None = None,
                   timer: Callable[[], float] = time.perf_counter) -> float:
    """The ``quantile`` of ``repeats`` timed runs of ``work`` (``elementwise``) less
    their median (ms, never < 0), on a thread at the executor's priority."""
    took: list[float] = []
    run = work or elementwise()

    def measure() -> None:
        yield_cpu_to_request_path(executor)  # the executor's own priority
        for _ in range(repeats):
            start = timer()
            run()
            took.append(timer() - start)

    thread = threading.Thread(target=measure, name="tandem-tail", daemon=True)
    thread.start()
    thread.join()
    ordered = sorted(took)
    if len(ordered) < repeats:
        return 0.0
    tail = ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]
    return max(0.0, tail - ordered[len(ordered) // 2]) * 1000.0
