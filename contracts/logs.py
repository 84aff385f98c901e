"""Structured logs for every tandem process: one JSON object a line.

A record renders as ``{"ts", "time", "level", "logger", "msg", **extra}``: the
extender passes ``pod``, ``node``, ``verb`` and ``duration_seconds`` as ``extra``;
the agent and the inference server pass their own fields. The handler writes to
whatever ``sys.stderr`` is when a record is emitted, not the stream of the moment
logging was set up, because CLIs and test runners swap and close that stream.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

LOGGER_NAME = "tandem.extender"

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Render a record and its ``extra`` fields as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        """One record as one JSON line."""
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class StderrHandler(logging.StreamHandler):
    """A stream handler bound to the current ``sys.stderr`` at every record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass  # always the current sys.stderr


OWN_LOGGERS = ("tandem", "extender", "agent", "contracts", "predictor", "planner")
"""The loggers of tandem's code (``tandem.extender``, ``tandem.leader``, ``tandem.queue.gate``,
the agent's ``agent.*`` module loggers...): they log at the configured level."""


def setup_logging(level: str | int = "info", stream: TextIO | None = None,
                  logger_name: str | None = None) -> logging.Logger:
    """Send every record out as one JSON line, once for the whole process; idempotent.

    The handler sits on the root logger, so every tandem logger (and any library's
    warning) comes out in the same format with its ``extra`` fields. tandem's own
    loggers (:data:`OWN_LOGGERS`) log at ``level``; libraries only warn unless
    ``level`` is debug, which is where the HTTP clients' per-request lines (httpx,
    urllib3) belong. Returns ``logger_name``'s logger (the extender's by default).
    """
    number = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}")
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not getattr(h, "_tandem", False)]
    handler = logging.StreamHandler(stream) if stream is not None else StderrHandler()
    handler.setFormatter(JsonFormatter())
    handler._tandem = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(min(number, logging.WARNING) if number <= logging.DEBUG else logging.WARNING)
    for name in OWN_LOGGERS:
        own = logging.getLogger(name)
        own.setLevel(number)
        # A handler an earlier setup put on a tandem logger itself would print twice.
        own.handlers[:] = [h for h in own.handlers if not getattr(h, "_tandem", False)]
        own.propagate = True
    return logging.getLogger(LOGGER_NAME if logger_name is None else logger_name)


def get_logger() -> logging.Logger:
    """The extender logger."""
    return logging.getLogger(LOGGER_NAME)


def now() -> float:
    """Monotonic seconds for durations."""
    return time.perf_counter()
