"""Every line a tandem process writes to its log is one JSON object, whatever happens.

Python prints uncaught exceptions (main thread, other threads, finalizers), warnings
and logging's own failures straight to stderr, and cheroot prints its error log there
too; ``contracts.logs.setup_logging`` and ``contracts.httpserve.harden`` route them all
through the JSON format. Checked in a process that provokes each of them, and in a real
extender (``kube`` source, loopback API server) driven through hostile scenarios: owner
edits, watches expiring (410, relist), broken and malformed HTTP clients, a restart.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fault_cluster import k8s_node, k8s_pod
from tandem_process import TandemProcess, free_port, kubeconfig

from lab.fakes import kube_api as fake_kube_api

RAW = "Traceback (most recent call last):"


def parse_lines(text: str) -> list[dict]:
    """Every line of ``text`` as JSON (AssertionError naming the first that is not)."""
    docs = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            raise AssertionError(f"a log line that is not JSON: {line!r}\n{text}") from None
        assert isinstance(doc, dict), line
        docs.append(doc)
    return docs


PROVOKE = textwrap.dedent("""
    import gc, logging, threading, warnings
    import typer  # first, as in the CLI: it keeps the excepthook of that moment as its own
    from cheroot import wsgi
    from contracts.httpserve import harden
    from contracts.logs import setup_logging

    log = setup_logging("info")
    warnings.warn("a library warning")
    t = threading.Thread(target=lambda: 1 / 0, name="doomed")
    t.start(); t.join()

    class Finalized:
        def __del__(self):
            raise RuntimeError("in a finalizer")

    Finalized(); gc.collect()
    log.info("%d apples", "not a number")  # logging's own failure
    server = harden(wsgi.Server(("127.0.0.1", 0), lambda e, s: []))
    try:
        raise OSError("a worker's socket error")
    except OSError:
        server.error_log("socket.error", level=logging.WARNING, traceback=True)
    cli = typer.Typer(pretty_exceptions_enable=False)

    @cli.command()  # typer installs its excepthook before the command runs
    def serve() -> None:
        setup_logging("info")  # as every tandem command does first
        raise SystemError("uncaught in the main thread")

    cli()
""")


def test_everything_python_prints_by_itself_comes_out_as_json() -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", PROVOKE], capture_output=True, text=True,
                          timeout=60, env=env, cwd=root)
    assert done.returncode == 1
    docs = parse_lines(done.stderr)
    by_msg = {d["msg"]: d for d in docs}
    assert any(d["logger"] == "py.warnings" and "a library warning" in d["msg"] for d in docs)
    assert "ZeroDivisionError" in by_msg["uncaught exception in a thread"]["exc"]
    assert by_msg["uncaught exception in a thread"]["thread_name"] == "doomed"
    assert "in a finalizer" in by_msg["exception ignored"]["exc"]
    assert by_msg["log record not written"]["record_msg"] == "%d apples"
    assert "a worker's socket error" in by_msg["socket.error"]["exc"]
    assert by_msg["socket.error"]["level"] == "warning"
    assert "uncaught in the main thread" in by_msg["uncaught exception"]["exc"]


# ---- a real extender under hostile scenarios ---------------------------------------------

class Extender:
    """``tandem extender serve`` against the loopback API server, started and stopped as many
    times as a test likes (one port); ``stderr``: every line of every run."""

    def __init__(self, api_url: str, tmp_path: Path):
        self.port = free_port()
        self.env = {"KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", api_url)),
                    "POD_NAMESPACE": "tandem-system", "TANDEM_AGENT_TOKEN": "agent-token",
                    "TANDEM_SIGNING_KEY": "log-lines-test-signing-key-0123",
                    "TANDEM__HANDOFF__MODE": "env"}
        self.runs: list[TandemProcess] = []

    def start(self) -> None:
        self.runs.append(TandemProcess(["extender", "serve", "--port", str(self.port)],
                                       self.env))
        self.runs[-1].wait_for("serving")

    def stop(self) -> int:
        code, _ = self.runs[-1].terminate(30)
        self.runs[-1].close()
        return code

    def kill(self) -> None:
        for run in self.runs:
            run.close()

    @property
    def stderr(self) -> list[str]:
        return [line for run in self.runs for line in run.lines]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture()
def world(tmp_path: Path) -> Iterator[tuple[object, Extender]]:
    fake = fake_kube_api.FakeKubeApi(nodes=[k8s_node("gpu-0")], record=False)
    fake.start()
    ext = Extender(fake.url, tmp_path)
    try:
        yield fake, ext
    finally:
        ext.kill()
        fake.stop()


def _place(fake, http: httpx.Client, name: str) -> None:
    fake.put_pod(k8s_pod(name))
    pod = fake.pod("ml", name)
    filtered = http.post("/filter", json={"Pod": pod, "NodeNames": ["gpu-0"]}).json()
    assert filtered["NodeNames"] == ["gpu-0"], filtered
    bound = http.post("/bind", json={"PodName": name, "PodNamespace": "ml",
                                     "PodUID": f"uid-{name}", "Node": "gpu-0"}).json()
    assert bound == {"Error": ""}


def _edit(fake, name: str, **changes: str | None) -> None:
    pod = fake.pod("ml", name)
    ann = pod["metadata"]["annotations"]
    for key, value in changes.items():
        if value is None:
            ann.pop(key, None)
        else:
            ann[key] = value
    fake.put_pod(pod)


def _hostile_clients(port: int) -> None:
    """Clients that hang up mid-request, mid-answer, or speak nonsense."""
    for payload in (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 40,
                    b"GET /v1/state HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                    b"GARBAGE\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(payload)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /v1/state HTTP/1.1\r\nHost: x\r\n\r\n")  # gone before the answer


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_hostile_run_of_the_extender_logs_only_json(world) -> None:
    fake, ext = world
    ext.start()
    with httpx.Client(base_url=ext.url, timeout=10) as http:
        for name in ("a", "b", "c"):
            _place(fake, http, name)
        _edit(fake, "a", **{"tandem.io/gpu-index": None})
        _edit(fake, "b", **{"tandem.io/predicted-gpu-util": "NaN"})
        _edit(fake, "c", **{"tandem.io/gpu-index": "1"})
        _hostile_clients(ext.port)
        fake.put_node(k8s_node("gpu-1"))  # the pod watch misses this version...
        fake.compact()
        fake.drop_watches()  # ...so its resumed watch gets 410 Gone and relists
        _wait_for(lambda: any("relisting" in line for line in ext.stderr))
        _place(fake, http, "d")
    assert ext.stop() == 0
    ext.start()  # a restart: the ledger rebuilt from the records, the edits seen again
    with httpx.Client(base_url=ext.url, timeout=10) as http:
        _place(fake, http, "e")
        _edit(fake, "e", **{"tandem.io/gpu-mem-mib": "1"})
        _hostile_clients(ext.port)
    assert ext.stop() == 0
    text = "".join(ext.stderr)
    assert RAW not in text
    docs = parse_lines(text)
    msgs = [d["msg"] for d in docs]
    assert msgs.count("serving") == 2 and "watch failed; relisting" in msgs
    assert "untrusted placement annotations" in msgs
