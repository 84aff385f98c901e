"""Where concurrent binds waited (kube-scheduler binds a burst of pods at once): new API
connections per burst, the scheduler's connections closed, events among the binds."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from extender_builders import placement
from kubernetes import client

from extender.cluster.kube import KubeSource
from extender.cluster.record_writer import WORKERS, RecordWriter
from extender.cluster.traffic import BindTraffic
from extender.config.sections import ServerConfig
from extender.core import PodRef
from extender.transport.server import start_background
from lab.fakes import kube_api as fake_kube_api

BURST = 16


@pytest.fixture
def fake():
    pods = [{"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}"},
             "spec": {"containers": []}, "status": {"phase": "Pending"}}
            for i in range(2 * BURST)]
    server = fake_kube_api.FakeKubeApi(pods=pods)
    server.start()
    yield server
    server.stop()


def burst(calls):
    gate = threading.Barrier(len(calls))

    def run(call):
        gate.wait()
        call()
    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_a_second_burst_of_binds_opens_no_new_api_connection(fake):
    # With 4 idle connections kept, every burst of 16 opened 12 (a TLS handshake each on
    # a real API server) on the bind path.
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=fake.url)))
    source = KubeSource(api, background_events=False)

    def binder(i):
        # a node each: bind creates the Binding, then queues the node's placement record
        return lambda: source.bind(PodRef("ml", f"p{i}", f"u{i}"), f"gpu-{i}", {},
                                   placement(f"u{i}", pod=f"ml/p{i}", node=f"gpu-{i}"))
    burst([binder(i) for i in range(BURST)])
    assert source.record_writer.flush(5)
    burst([binder(i) for i in range(BURST, 2 * BURST)])
    assert source.record_writer.flush(5)
    # Never more connections than binds at once plus the record writer's workers (they may
    # still write the first burst's records while it ends): the second burst reuses the
    # first's (the first may have needed fewer when some binds finished before others began).
    assert fake.connections_accepted <= BURST + WORKERS
    assert [fake.pod("ml", f"p{i}")["spec"].get("nodeName") for i in range(2 * BURST)] == \
        [f"gpu-{i}" for i in range(2 * BURST)]
    source.stop()


def test_the_server_keeps_the_schedulers_connections_open():
    # cheroot's default answered "Connection: close" to everything once 10 were open.
    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return [b"{}"]
    server = start_background(app, ServerConfig(host="127.0.0.1", port=0))
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(BURST + 4)]
    try:
        closing = 0
        for sock in socks:
            sock.sendall(b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(4096)
            closing += b"connection: close" in head.lower()
        assert closing == 0
    finally:
        for sock in socks:
            sock.close()
        server.stop()


def test_events_wait_for_binds_in_flight():
    traffic = BindTraffic()
    assert traffic.wait_idle(0.0)
    with traffic.binding():
        start = time.monotonic()
        assert not traffic.wait_idle(0.05)
        assert time.monotonic() - start >= 0.05
    released = []
    with traffic.binding():
        waiter = threading.Thread(target=lambda: released.append(traffic.wait_idle(5.0)))
        waiter.start()
        time.sleep(0.05)
        assert released == []
    waiter.join(5.0)
    assert released == [True]


def test_writers_wait_for_a_quiet_moment_after_the_last_binding():
    traffic = BindTraffic()
    with traffic.binding():
        pass
    assert not traffic.wait_idle(0.0)  # one just ended: the burst's next may follow
    start = time.monotonic()
    assert traffic.wait_idle(1.0) and time.monotonic() - start < 0.5


def test_a_binding_in_the_quiet_time_holds_the_writers_until_it_ends_and_after():
    traffic = BindTraffic()
    with traffic.binding():
        pass
    returned = []

    def waiter():
        ok = traffic.wait_idle(3.0, quiet=0.1)
        returned.append((ok, time.monotonic()))
    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.03)  # the waiter is in the quiet time of the first binding
    with traffic.binding():
        time.sleep(0.2)
    ended = time.monotonic()
    thread.join(5.0)
    assert returned and returned[0][0] and returned[0][1] >= ended + 0.1


def test_pod_watch_waits_for_binds_in_flight_at_most_its_lag_then_catches_up():
    traffic = BindTraffic()
    start = time.monotonic()
    traffic.pace_watch(5.0)  # nothing in flight: no wait
    assert time.monotonic() - start < 0.5
    read = []
    with traffic.binding():
        waiter = threading.Thread(target=lambda: (traffic.pace_watch(5.0),
                                                  read.append(time.monotonic())))
        waiter.start()
        time.sleep(0.1)
        assert read == []  # held back while the binding is in flight
        ended = time.monotonic()
    waiter.join(5.0)
    assert read and read[0] >= ended
    with traffic.binding():  # a binding that outlasts the lag: waited once, then free
        start = time.monotonic()
        traffic.pace_watch(0.1)
        assert time.monotonic() - start >= 0.1
        start = time.monotonic()
        for _ in range(100):
            traffic.pace_watch(0.1)
        assert time.monotonic() - start < 0.1  # catching up: no wait per event


def test_pod_watch_applies_events_after_the_bind_burst(fake):
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=fake.url)))
    applied, done = [], threading.Event()

    class Events:  # a watch of three pod events, then the source stops
        def stream(self, lister, **kw):
            for i in range(3):
                yield {"type": "MODIFIED", "object": {"metadata": {"uid": f"u{i}"}}}
            done.set()

    source = KubeSource(api, watch_factory=Events, background_events=False)
    source.apply_pod_event = lambda state, kind, pod: applied.append(time.monotonic())
    source._stop.wait = lambda timeout: True  # one pass of the stream
    pace = source._traffic.pace_watch
    source._traffic.pace_watch = lambda: pace(10.0)  # a lag no loaded machine outlasts
    with source._traffic.binding():
        watch = threading.Thread(target=source._watch, args=(
            None, api.list_pod_for_all_namespaces, source.apply_pod_event, "1"))
        watch.start()
        deadline = time.monotonic() + 5
        while not applied and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert len(applied) == 1  # the first event, then it waits for the binding
        ended = time.monotonic()
    watch.join(5.0)
    assert done.is_set() and len(applied) == 3 and applied[1] >= ended


def test_record_writes_wait_for_the_bind_burst_and_gather_its_entries():
    class Written:  # the record store: what each PUT would carry
        def __init__(self):
            self.puts: list[tuple[str, dict[str, str]]] = []

        def write_batch(self, node, entries, keeps):
            self.puts.append((node, dict(entries)))
    traffic, records = BindTraffic(), Written()
    writer = RecordWriter(records, workers=1, traffic=traffic)  # type: ignore[arg-type]
    with traffic.binding():
        writer.submit("n1", "u1", "e1", lambda uid: True)
        time.sleep(0.2)
        assert records.puts == []  # held back while a binding is in flight
        writer.submit("n1", "u2", "e2", lambda uid: True)
    assert writer.flush(5)
    assert records.puts == [("n1", {"u1": "e1", "u2": "e2"})]  # one PUT after the burst
    writer.stop()


def test_event_worker_posts_after_the_bind_burst(fake):
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=fake.url)))
    source = KubeSource(api)
    worker = threading.Thread(target=source._events.run, daemon=True)
    with source._traffic.binding():
        worker.start()
        source.record_event(PodRef("ml", "p0", "u0"), "TandemBound", "placed", False)
        time.sleep(0.2)
        assert fake.events == []  # held back while a binding is in flight
    deadline = time.monotonic() + 5
    while not fake.events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [e["reason"] for e in fake.events] == ["TandemBound"]
    source.stop()
    worker.join(5)
