"""Structured logs for every tandem process: one JSON object a line.

A record renders as ``{"ts", "time", "level", "logger", "msg", **extra}``: the
extender passes ``pod``, ``node``, ``verb`` and ``duration_seconds`` as ``extra``;
the agent and the inference server pass their own fields. The handler writes to
whatever ``sys.stderr`` is when a record is emitted, not the stream of the moment
logging was set up, because CLIs and test runners swap and close that stream.

Nothing else of the process may write a raw line there: Python prints uncaught
exceptions (main thread, other threads, ``__del__`` and finalizers) and warnings
straight to stderr, and so does ``logging`` when a handler fails. ``setup_logging``
routes all of them through this format (:func:`_route_uncaught`); a traceback then
sits in the ``exc`` field of one JSON line. cheroot's own error log goes the same way
(``contracts.httpserve.harden``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from types import TracebackType
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


class JsonStreamHandler(logging.StreamHandler):
    """A stream handler whose own failures are reported as a JSON line, not a traceback."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """logging prints ``--- Logging error ---`` and a traceback here; one line instead."""
        failure = sys.exc_info()[1]
        with contextlib.suppress(Exception):  # nowhere left to report it
            sys.stderr.write(json.dumps({
                "ts": round(time.time(), 3),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
                "level": "error", "logger": "logging",
                "msg": "log record not written", "error": repr(failure),
                "record_msg": str(getattr(record, "msg", ""))[:500]}) + "\n")


class StderrHandler(JsonStreamHandler):
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
    handler = JsonStreamHandler(stream) if stream is not None else StderrHandler()
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
    _route_uncaught()
    return logging.getLogger(LOGGER_NAME if logger_name is None else logger_name)


UNCAUGHT_LOGGER = "tandem.uncaught"
"""Where exceptions nobody caught and Python's warnings are logged."""


def _route_uncaught() -> None:
    """Send what Python prints to stderr by itself through logging: uncaught exceptions of
    the main thread and of other threads, unraisable ones (``__del__``, finalizers, a
    generator closed late) and ``warnings``."""
    log = logging.getLogger(UNCAUGHT_LOGGER)

    def main_hook(kind: type[BaseException], value: BaseException,
                  tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)  # Ctrl-C at a terminal: the usual
            return
        log.critical("uncaught exception", exc_info=(kind, value, tb))

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return  # as threading's own hook: a thread that exits is no error
        name = args.thread.name if args.thread is not None else None
        log.error("uncaught exception in a thread", extra={"thread_name": name},
                  exc_info=(args.exc_type, args.exc_value or args.exc_type(),
                            args.exc_traceback))

    def unraisable_hook(args: Any) -> None:
        value = args.exc_value
        log.warning("exception ignored", extra={
            "where": args.err_msg or "Exception ignored in", "object": repr(args.object)[:300]},
            exc_info=(args.exc_type, value, args.exc_traceback) if value is not None else None)

    # sys.excepthook always: the CLI framework installs its own, which prints the raw
    # traceback. The other two only when they are Python's own (or ours, from an earlier
    # setup): a hook someone else installed on purpose (a test runner's) stays.
    sys.excepthook = _mark(main_hook)
    if getattr(threading.excepthook, "_tandem", False) \
            or threading.excepthook is threading.__excepthook__:
        threading.excepthook = _mark(thread_hook)
    if getattr(sys.unraisablehook, "_tandem", False) \
            or sys.unraisablehook is sys.__unraisablehook__:
        sys.unraisablehook = _mark(unraisable_hook)
    logging.captureWarnings(True)  # warnings.showwarning -> the py.warnings logger


def _mark(hook: Any) -> Any:
    hook._tandem = True
    return hook


def get_logger() -> logging.Logger:
    """The extender logger."""
    return logging.getLogger(LOGGER_NAME)


def now() -> float:
    """Monotonic seconds for durations."""
    return time.perf_counter()
