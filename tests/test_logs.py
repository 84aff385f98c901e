"""The one JSON log setup shared by the extender, the agent and the servers."""

import io
import json
import logging
import sys

import pytest

from contracts.logs import setup_logging


def test_handler_follows_the_current_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    # A CLI runner swaps sys.stderr and closes its stream afterwards: records logged
    # later must go to the stream of their moment, not raise "Logging error".
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    log = setup_logging(logger_name="tandem.test-logs")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    log.info("bound", extra={"pod": "ml/p0", "duration_seconds": 0.5})
    doc = json.loads(second.getvalue())
    assert (doc["msg"], doc["pod"], doc["duration_seconds"]) == ("bound", "ml/p0", 0.5)
    assert (doc["level"], doc["logger"]) == ("info", "tandem.test-logs")


def test_setup_is_idempotent_and_takes_named_levels() -> None:
    setup_logging("debug", logger_name="tandem.test-idempotent")
    log = setup_logging("warning", logger_name="tandem.test-idempotent")
    assert sum(getattr(h, "_tandem", False) for h in log.handlers) == 1
    assert log.level == logging.WARNING and not log.propagate


def test_explicit_stream_is_used() -> None:
    out = io.StringIO()
    setup_logging(stream=out, logger_name="tandem.test-stream").error("boom")
    assert json.loads(out.getvalue())["level"] == "error"
