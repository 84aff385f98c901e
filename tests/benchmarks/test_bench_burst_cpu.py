"""benchmarks/burst_cpu.py: the writer-process prototype keeps the Binding's outcome, and
the reporting route counts per bind."""

from __future__ import annotations

import importlib

import pytest
from bench_modules import load
from kubernetes.client.rest import ApiException

fake_kube_api = importlib.import_module("lab.fakes.kube_api")
burst_cpu = load("burst_cpu")

PATH = "/api/v1/namespaces/ml/pods/p/binding"


@pytest.fixture
def fake():
    server = fake_kube_api.FakeKubeApi(pods=[{"metadata": {"name": "p", "namespace": "ml",
                                                           "uid": "u"}, "spec": {}}])
    server.start()
    yield server
    server.stop()


def test_writer_process_posts_the_binding_and_returns_its_refusal(fake):
    pipes = burst_cpu.writer_process(2, int(fake.url.rsplit(":", 1)[1]))

    class Direct:
        posted: list[str] = []

        def post(self, path, body):
            self.posted.append(path)
            return b"{}"
    inner = Direct()
    poster = burst_cpu.PipePoster(pipes, inner)
    body = b'{"metadata": {"name": "p", "uid": "u"}, "target": {"name": "n1"}}'
    try:
        poster.post(PATH, body)
        assert fake.pod("ml", "p")["spec"]["nodeName"] == "n1"  # applied by the writer
        with pytest.raises(ApiException) as refused:
            poster.post(PATH, body)  # already bound: the API server's 409 comes back
        assert refused.value.status == 409
        poster.post("/api/v1/namespaces/ml/events", b"{}")
        assert inner.posted == ["/api/v1/namespaces/ml/events"]  # not a Binding: directly
    finally:
        for pipe in pipes:
            pipe.close()  # the writer process ends


def test_per_bind_divides_cpu_into_ms_and_keeps_counts():
    before = {"user": 1.0, "connects": 2, "bind_verb": 0.5}
    after = {"user": 1.032, "connects": 6, "bind_verb": 0.516}
    assert burst_cpu._per_bind(before, after, 16) == {"user": 2.0, "connects": 0.25,
                                                      "bind_verb": 1.0}


def test_per_bind_keeps_a_counter_whose_thread_ended_at_zero():
    before = {"user": 1.0, "thread:tandem-records": 0.2}
    assert burst_cpu._per_bind(before, {"user": 1.016}, 16) == {
        "user": 1.0, "thread:tandem-records": 0.0}


def test_report_groups_thread_cpu_by_what_each_thread_does():
    import json
    import threading

    gate = threading.Event()
    workers = [threading.Thread(target=gate.wait, name=f"CP Server Thread-{i}")
               for i in range(3)]
    for t in workers:
        t.start()
    try:
        parts = burst_cpu.bind_cpu.PartMeter([])
        reporter = burst_cpu.Reporter(lambda environ, start: [b""], parts, [0])
        doc = json.loads(b"".join(reporter({"PATH_INFO": burst_cpu.MARK},
                                           lambda status, headers: None)))
    finally:
        gate.set()
        for t in workers:
            t.join()
    assert "thread:http_workers" in doc and doc["thread:http_workers"] >= 0.0
    assert not any(k.startswith("thread:CP Server") for k in doc)  # one group, not three
