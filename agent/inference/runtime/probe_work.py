"""The registration probe's executor work: the sessions' own models on the real executor.

An SLO registration measures the request path again beside an executor as busy as the
sessions will keep it (``registration``, ``http.calibration.probe_at``). A stand-in that
spent the profiled batch times on a small elementwise loop (256 KiB, in cache) left the
path as fast as an idle executor did: beside a CPU hog the probe measured a 25 ms path
and served requests then met front p99 18 ms, back 21 ms and a 33 ms write reserve, and
a 150 ms session admitted at 100 requests/s lost 64%. The real executor streams the
models' weights (a 2048-wide MLP's are 16 MiB a layer) through the cache the request
path's threads share, and its batches come back through ONNX Runtime's own outputs;
running the sessions' own models, on the executor's own sessions, loads the host as the
served batches will.
"""

from __future__ import annotations

import numpy as np

from agent.inference.executors.executors import Executor, LoadedModel
from agent.inference.runtime.pathcost import BatchWork


def sample_batch(loaded: LoadedModel, n: int) -> np.ndarray:
    """``n`` zero samples of the model's input (one feature where its shape is any)."""
    dims = [int(d or 1) for d in loaded.sample_shape or (1,)]
    return np.zeros((n, *dims), dtype=loaded.input_dtype)


def own_batches(executor: Executor, mix: list[tuple[float, LoadedModel, int]]) -> BatchWork:
    """A batch of ``n`` requests as one run of one session's model on ``executor`` at
    ``min(n, its largest batch)``; ``mix``: (rate, model, largest batch) per session.
    The session whose share of the runs so far lags its share of the rate most runs
    next, so each model runs in proportion to its requests, as served."""
    total = sum(rate for rate, _m, _b in mix)
    if total <= 0 or not mix:
        raise ValueError("the probe's sessions send no requests")
    runs = [0] * len(mix)
    samples: dict[tuple[int, int], np.ndarray] = {}

    def run(n: int) -> None:
        done = sum(runs) + 1
        i = max(range(len(mix)), key=lambda k: mix[k][0] / total - runs[k] / done)
        runs[i] += 1
        _rate, loaded, largest = mix[i]
        size = min(max(n, 1), max(largest, 1))
        batch = samples.get((i, size))
        if batch is None:
            batch = samples[(i, size)] = sample_batch(loaded, size)
        executor.run_batch(loaded, batch)

    return run
