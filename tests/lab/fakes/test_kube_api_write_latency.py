"""The loopback API server's write latency: every write waits it before it is applied and
answered, reads do not, and concurrent writes wait side by side (as etcd batches them)."""

from __future__ import annotations

import http.client
import json
import threading
import time

from lab.fakes.kube_api import REAL_WRITE_LATENCY_S, FakeKubeApi

LATENCY_S = 0.3


def _pod(i: int) -> dict:
    return {"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}"},
            "spec": {"containers": []}, "status": {"phase": "Pending"}}


def _request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    t0 = time.perf_counter()
    conn.request(method, path, json.dumps(body).encode() if body is not None else None,
                 {"Content-Type": "application/json"})
    status = conn.getresponse().status
    elapsed = time.perf_counter() - t0
    conn.close()
    return status, elapsed


def _binding(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}"},
            "target": {"kind": "Node", "name": "n"}}


def test_writes_wait_reads_do_not_and_concurrent_writes_overlap():
    api = FakeKubeApi([{"metadata": {"name": "n"}}], [_pod(i) for i in range(9)],
                      write_latency_s=LATENCY_S)
    port = api.start()
    try:
        status, read = _request(port, "GET", "/api/v1/namespaces/ml/pods/p0")
        assert status == 200 and read < LATENCY_S
        status, wrote = _request(port, "POST", "/api/v1/namespaces/ml/pods/p0/binding",
                                 _binding(0))
        assert status == 201 and wrote >= LATENCY_S
        assert api.pod("ml", "p0")["spec"]["nodeName"] == "n"
        results: list[tuple[int, float]] = []
        threads = [threading.Thread(target=lambda i=i: results.append(_request(
            port, "POST", f"/api/v1/namespaces/ml/pods/p{i}/binding", _binding(i))))
            for i in range(1, 9)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        together = time.perf_counter() - t0
    finally:
        api.stop()
    assert [s for s, _ in results] == [201] * 8
    assert together < 4 * LATENCY_S  # one after another would take 8 x LATENCY_S
    assert all(api.pod("ml", f"p{i}")["spec"]["nodeName"] == "n" for i in range(9))


def test_no_latency_by_default_and_the_realistic_figure_is_milliseconds():
    assert FakeKubeApi().write_latency_s == 0.0
    assert 0.001 <= REAL_WRITE_LATENCY_S <= 0.02
