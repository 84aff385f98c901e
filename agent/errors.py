"""Typed errors of the node agent; each says what the caller does next.

::

    AgentError
    ├── ConfigError            bad flag, sim file or token source: fix and restart
    ├── GpuSourceError         the GPU source could not be read
    │   ├── DriverNotLoaded    no NVML / no driver: report nothing this interval, retry init
    │   └── GpuLost            one GPU fell off the bus: report it with null metrics
    ├── ReportError            the extender did not take a report
    │   ├── ReportRejected     permanent (4xx other than 429): do not retry this report
    │   └── ExtenderUnavailable retries exhausted within the interval: next report supersedes
    └── StateError             the extender's /v1/state could not be read or parsed: keep the last
"""

from __future__ import annotations


class AgentError(Exception):
    """Root of the agent's errors."""


class ConfigError(AgentError):
    """Invalid configuration (flags, sim file, token source)."""


class GpuSourceError(AgentError):
    """The GPU source could not be read."""


class DriverNotLoaded(GpuSourceError):
    """NVML or the NVIDIA driver is unavailable; the whole source is down."""


class GpuLost(GpuSourceError):
    """One GPU stopped answering (NVML_ERROR_GPU_IS_LOST or a reset is required)."""

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(f"GPU {index} lost: {detail}")
        self.index = index
        self.detail = detail


class ReportError(AgentError):
    """A report did not reach the extender."""


class ReportRejected(ReportError):
    """The extender answered with a permanent error (e.g. 401, 400)."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"extender rejected the report with HTTP {status_code}")
        self.status_code = status_code


class ExtenderUnavailable(ReportError):
    """Every attempt within the interval failed (network error, 5xx or 429)."""

    def __init__(self, attempts: int, last_error: str) -> None:
        super().__init__(f"extender unavailable after {attempts} attempts: {last_error}")
        self.attempts = attempts
        self.last_error = last_error


class StateError(AgentError):
    """The extender's state could not be fetched or parsed."""
