"""Remote model references never block a caller: fetched in the background, bounded."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from extender_builders import H100, PodBuilder, args, make_app, node

from predictor.api import Predictor
from predictor.errors import ModelUnavailable
from predictor.fetch import BackgroundFetcher, ModelBeingFetched
from predictor.store import ModelStore, StoreConfig


class SilentHost:
    """A loopback socket that accepts connections and never answers (bounded: tests only)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def url(self, name="m.onnx"):
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/{name}"

    def _run(self):
        while not self._stop.is_set():
            try:
                self.accepted.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent():
    host = SilentHost()
    yield host
    host.close()


def store(tmp_path, timeout=0.5):
    return ModelStore(StoreConfig(root=tmp_path, allow_http=True, timeout_seconds=timeout))


def wait_for(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_without_a_trained_model_a_silent_host_still_never_blocks(tmp_path, silent):
    """Day one needs the graph for the memory estimate, so the model is fetched, but
    off the caller's thread: predict answers at once that it is being fetched."""
    predictor = Predictor(None, store(tmp_path), fetcher=BackgroundFetcher(store(tmp_path)))
    start = time.monotonic()
    with pytest.raises(ModelBeingFetched):
        predictor.predict(silent.url(), 1, None, "training")
    assert time.monotonic() - start < 0.2


def test_a_silent_host_never_blocks_and_its_failure_is_remembered(tmp_path, silent):
    fetcher = BackgroundFetcher(store(tmp_path), workers=1, max_pending=2)
    start = time.monotonic()
    for _ in range(3):  # one fetch, however often it is asked for
        with pytest.raises(ModelBeingFetched, match="being fetched"):
            fetcher.resolve(silent.url())
    assert time.monotonic() - start < 0.2
    with pytest.raises(ModelBeingFetched):
        fetcher.resolve(silent.url("other.onnx"))
    with pytest.raises(ModelUnavailable, match="too many"):  # the cap on pending fetches
        fetcher.resolve(silent.url("third.onnx"))
    wait_for(lambda: fetcher.in_flight() == 0)
    with pytest.raises(ModelUnavailable, match="fetch failed") as exc:
        fetcher.resolve(silent.url())
    assert not isinstance(exc.value, ModelBeingFetched)
    assert len(silent.accepted) == 2
    fetcher.close()


def test_filter_answers_at_once_while_the_model_is_fetched(tmp_path, silent):
    """H1: /filter never waits on the network; the pod's GPUs are DemandUnknown meanwhile."""
    fetch_store = store(tmp_path, timeout=2.0)
    predictor = Predictor(object(), fetch_store, fetcher=BackgroundFetcher(fetch_store))
    app, _, _, _ = make_app([node("n1", 2), node("n2", 2, H100)], predictor=predictor)
    client = app.test_client()
    pods = [PodBuilder(f"p{i}").uid(f"u{i}").model(silent.url(f"m{i}.onnx")).obj()
            for i in range(8)]
    start = time.monotonic()
    bodies = [client.post("/filter", json=args(p, ["n1", "n2"])).get_json() for p in pods]
    assert time.monotonic() - start < 1.0  # before: 30 s per GPU type and pod
    assert bodies[0]["NodeNames"] == []
    assert "model being fetched" in bodies[0]["FailedAndUnresolvableNodes"]["n1"]
    assert client.get("/livez").status_code == 200


def test_a_fetched_model_is_served_from_the_cache(tmp_path):
    import httpx

    served = []

    def handler(request):
        served.append(str(request.url))
        return httpx.Response(200, content=b"onnx bytes")

    fetch_store = ModelStore(StoreConfig(root=tmp_path), transport=httpx.MockTransport(handler))
    fetcher = BackgroundFetcher(fetch_store)
    with pytest.raises(ModelBeingFetched):
        fetcher.resolve("https://models.example/m.onnx")
    wait_for(lambda: fetcher.in_flight() == 0)
    path = fetcher.resolve("https://models.example/m.onnx")
    assert path.read_bytes() == b"onnx bytes" and served == ["https://models.example/m.onnx"]
    with pytest.raises(Exception, match="plain http is not allowed"):  # refused, not queued
        fetcher.resolve("http://models.example/m.onnx")
    assert fetcher.in_flight() == 0
