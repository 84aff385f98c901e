"""The progress counter a training job exposes for tandem (``tandem.io/progress``).

Standard library only, so any training image can vendor it::

    from tandem.progress import ProgressCounter

    progress = ProgressCounter(port=9400)    # serves /metrics on the pod's IP
    for batch in loader:
        train_step(batch)
        progress.step(samples=len(batch))

and on the pod::

    annotations:
      tandem.io/progress: >-
        port=9400,steps=tandem_train_steps_total,samples=tandem_train_samples_total

(:meth:`ProgressCounter.annotation` gives that value). The node agent scrapes the page
each interval and reports steps per second; the extender learns from them who slows whom
(docs/interference.md). The counters only ever increase; a restarted job starts again
from 0, which the agent sees as a reset and skips once.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STEPS = "tandem_train_steps_total"
SAMPLES = "tandem_train_samples_total"
PATH = "/metrics"


class ProgressCounter:
    """Step and sample counters served as Prometheus text on ``host:port`` ``/metrics``."""

    def __init__(self, port: int = 9400, host: str = "0.0.0.0", serve: bool = True):
        self._lock = threading.Lock()
        self.steps = 0
        self.samples = 0
        self.port = port
        self._server: ThreadingHTTPServer | None = None
        if serve:
            self._server = ThreadingHTTPServer((host, port), self._handler())
            self.port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, daemon=True,
                             name="tandem-progress").start()

    def step(self, samples: int = 0, steps: int = 1) -> None:
        """Count ``steps`` finished training steps of ``samples`` samples in all."""
        if steps < 0 or samples < 0:
            raise ValueError("progress only increases: steps and samples must be >= 0")
        with self._lock:
            self.steps += steps
            self.samples += samples

    def page(self) -> str:
        """The Prometheus text page."""
        with self._lock:
            steps, samples = self.steps, self.samples
        return (f"# TYPE {STEPS} counter\n{STEPS} {steps}\n"
                f"# TYPE {SAMPLES} counter\n{SAMPLES} {samples}\n")

    def annotation(self) -> str:
        """The ``tandem.io/progress`` value that names these counters."""
        return f"port={self.port},steps={STEPS},samples={SAMPLES}"

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the http.server name)
                if self.path != PATH:
                    self.send_error(404)
                    return
                body = counter.page().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # scrapes are not news
                return

        return Handler
