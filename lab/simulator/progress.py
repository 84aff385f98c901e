"""Progress bars for long simulations and sweeps (tqdm on stderr).

Bars are shown only when asked for (``tandem simulate`` turns them off with
``--json``) and when stderr is a terminal, so pipes, logs and tests stay clean.
A simulation reports finished jobs through :class:`ProgressPolicy`, a proxy of
the policy the engine already calls every scheduling round, so the engine needs
no hook of its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from lab.simulator.engine import DONE, JobRun

REFRESH_S = 0.25
"""Wall-clock interval between counts of finished jobs (the count is O(jobs))."""


def wanted(enabled: bool, stream: Any = None) -> bool:
    """Bars only when enabled and the stream (default stderr) is a terminal."""
    stream = stream if stream is not None else sys.stderr
    return enabled and bool(getattr(stream, "isatty", lambda: False)())


def bar(total: int, desc: str, unit: str) -> Any:
    """A tqdm bar on stderr that disappears when closed."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True,
                file=sys.stderr)


class ProgressPolicy:
    """Forwards every call to ``policy``; counts finished jobs into ``tick`` as it goes."""

    def __init__(self, policy: Any, tick: Callable[[int], None],
                 clock: Callable[[], float] = time.monotonic):
        self._policy = policy
        self._tick = tick
        self._clock = clock
        self._runs: dict[int, JobRun] = {}
        self._reported = 0
        self._next = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def enqueue(self, run: JobRun, now_s: float) -> None:
        """Remember the run (to count it once done), then pass it on."""
        self._runs[run.idx] = run
        self._policy.enqueue(run, now_s)

    def schedule(self, ctx: Any) -> int:
        """Pass the round on; every REFRESH_S of wall time, report newly finished jobs."""
        if self._clock() >= self._next:
            self.flush()
            self._next = self._clock() + REFRESH_S
        return self._policy.schedule(ctx)

    def flush(self) -> None:
        """Report the jobs finished since the last report."""
        done = sum(1 for r in self._runs.values() if r.state == DONE)
        if done > self._reported:
            self._tick(done - self._reported)
            self._reported = done
