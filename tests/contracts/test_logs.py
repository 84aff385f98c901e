"""The one JSON log setup shared by the extender, the agent and the servers."""

import io
import json
import logging
import sys

import pytest
from queue_gate_fakes import NOW, FakeCoreV1, pod

from contracts.logs import setup_logging
from extender.ha.leader import PodLabeler
from extender.queue.gate import GateConfig, GateController


@pytest.fixture(autouse=True)
def restore_logging():
    """Each test's setup is undone: the handler and levels are process-wide."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level,
             {n: logging.getLogger(n).level for n in ("tandem", "agent", "httpx")})
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def lines(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_handler_follows_the_current_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    # A CLI runner swaps sys.stderr and closes its stream afterwards: records logged
    # later must go to the stream of their moment, not raise "Logging error".
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging()
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("tandem.test-logs").info("bound",
                                               extra={"pod": "ml/p0", "duration_seconds": 0.5})
    doc = json.loads(second.getvalue())
    assert (doc["msg"], doc["pod"], doc["duration_seconds"]) == ("bound", "ml/p0", 0.5)
    assert (doc["level"], doc["logger"]) == ("info", "tandem.test-logs")


def test_setup_is_idempotent_and_takes_named_levels() -> None:
    out = io.StringIO()
    setup_logging("debug", stream=out)
    setup_logging("warning", stream=out)
    assert sum(getattr(h, "_tandem", False) for h in logging.getLogger().handlers) == 1
    assert logging.getLogger("tandem").level == logging.WARNING
    logging.getLogger("agent.node.runner").info("dropped")
    logging.getLogger("agent.node.runner").warning("kept")
    assert [d["msg"] for d in lines(out)] == ["kept"]
    with pytest.raises(ValueError, match="unknown log level"):
        setup_logging("loud")


def test_explicit_stream_is_used() -> None:
    out = io.StringIO()
    setup_logging(stream=out).error("boom")
    assert json.loads(out.getvalue())["level"] == "error"


def test_queue_release_is_a_json_line_with_its_fields() -> None:
    # The gate's logger was never configured: its "released" lines were lost.
    out = io.StringIO()
    setup_logging(stream=out)
    report = GateController(FakeCoreV1([pod("a")]), GateConfig(), clock=lambda: NOW).reconcile()
    assert report.released == ("ml/a",)
    (doc,) = [d for d in lines(out) if d["msg"] == "released"]
    assert (doc["logger"], doc["level"], doc["pod"], doc["event"]) == \
        ("tandem.queue.gate", "info", "ml/a", "released")
    assert "class" in doc


class FailingCore:
    def patch_namespaced_pod(self, *args, **kwargs):
        raise RuntimeError("API server down")


def test_leader_warning_is_a_json_line_with_its_fields() -> None:
    # tandem.leader printed bare text ("leader label patch failed") without its fields.
    out = io.StringIO()
    setup_logging(stream=out)
    PodLabeler(FailingCore(), "tandem-system", "extender-0").sync(True)
    (doc,) = lines(out)
    assert (doc["logger"], doc["level"], doc["msg"]) == \
        ("tandem.leader", "warning", "leader label patch failed")
    assert (doc["pod"], doc["error"]) == ("extender-0", "RuntimeError")


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_http_client_request_lines_only_at_debug(level: str, shown: bool) -> None:
    # httpx logs every request at info: an agent printed two lines a second.
    out = io.StringIO()
    setup_logging(level, stream=out)
    logging.getLogger("httpx").info('HTTP Request: POST http://x/v1/agents/report "200 OK"')
    logging.getLogger("httpx").warning("retrying")
    assert [d["msg"] for d in lines(out)].count("retrying") == 1
    assert any("HTTP Request" in d["msg"] for d in lines(out)) is shown
