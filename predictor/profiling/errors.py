"""Errors of the profiler, as one small hierarchy.

::

    ProfilingError                 anything the profiler refuses or cannot do
    ├── SpecError                  bad campaign spec or CLI options (all problems at once)
    ├── BackendUnavailable         the backend cannot start: no NVML driver, no CUDA, bad sim file
    ├── DataDirError               the output directory conflicts with this campaign
    │                              (other GPU, real vs simulated, existing data without --resume)
    └── WorkerFailed               a profiling worker process died or broke its protocol
        └── WorkerTimeout          ... or did not answer in time

Per-configuration failures (out of memory, a model that raises) are not exceptions
of the campaign: they become rows with ``status`` oom|error|timeout and the
campaign goes on.
"""

from __future__ import annotations

from collections.abc import Sequence


class ProfilingError(Exception):
    """Base class: the campaign cannot go on as asked."""


class SpecError(ProfilingError):
    """The campaign spec is invalid; ``problems`` lists every ``path: message``."""

    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class BackendUnavailable(ProfilingError):
    """The selected backend cannot run here (the reason says what is missing)."""


class DataDirError(ProfilingError):
    """The output directory holds data this campaign must not mix with."""


class WorkerFailed(ProfilingError):
    """A worker process exited or wrote something that is not the protocol."""

    def __init__(self, message: str, stderr_tail: str = ""):
        self.stderr_tail = stderr_tail
        tail = f"\n--- worker stderr ---\n{stderr_tail}" if stderr_tail else ""
        super().__init__(message + tail)


class WorkerTimeout(WorkerFailed):
    """A worker did not answer within its deadline (it has been killed)."""
