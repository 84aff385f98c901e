"""``--metrics-port 0`` means off for the agent, as for the queue gate."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from agent.node import main


class StepOnce:
    config = type("C", (), {"node": "n1", "interval_seconds": 1.0})()
    registry = None
    servers = None

    def run(self, stop: threading.Event) -> None:
        stop.set()


@pytest.mark.parametrize(("port", "served"), [(0, False), (19401, True)])
def test_metrics_port_zero_serves_nothing(port: int, served: bool,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    class Server:
        server_port = port

        def shutdown(self) -> None: ...

        def server_close(self) -> None: ...

    def start_http_server(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        thread = threading.Thread(target=lambda: None)
        thread.start()
        return Server(), thread

    monkeypatch.setattr(main, "start_http_server", start_http_server)
    monkeypatch.setattr(main, "setup_logging", lambda **_: None)
    main.run_forever(StepOnce(), "127.0.0.1", port, threading.Event())  # type: ignore[arg-type]
    assert bool(calls) is served
