"""Structured logs: one JSON object a line with pod, node, verb and duration_seconds."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

LOGGER_NAME = "tandem.extender"
_FIELDS = ("verb", "pod", "node", "duration_seconds", "status", "passed", "reasons", "error",
           "gpus", "path", "problems")


class JsonFormatter(logging.Formatter):
    """Render a record and its ``extra`` fields as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3), "level": record.levelname.lower(),
            "logger": record.name, "msg": record.getMessage(),
        }
        for key in _FIELDS:
            if key in record.__dict__:
                doc[key] = record.__dict__[key]
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(level: str = "info", stream: TextIO | None = None) -> logging.Logger:
    """Configure the extender logger (idempotent) and return it."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level.upper())
    if not any(getattr(h, "_tandem", False) for h in logger.handlers):
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(JsonFormatter())
        handler._tandem = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
    return logger


def get_logger() -> logging.Logger:
    """The extender logger."""
    return logging.getLogger(LOGGER_NAME)


def now() -> float:
    """Monotonic seconds for durations."""
    return time.perf_counter()
