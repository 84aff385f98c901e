"""The official client's connection pool holds kube-scheduler's concurrent binds: a second
burst of 16 writes reuses the first burst's connections instead of opening new ones."""

from __future__ import annotations

import itertools
import threading

import pytest
from kubernetes import client
from kubernetes.config import kube_config

from extender.cluster.kube import KubeSource
from lab.fakes import kube_api as fake_kube_api

BURST = 16  # kube-scheduler's binds in flight
_bursts = itertools.count()


def _burst(api: client.CoreV1Api) -> None:
    """``BURST`` writes at once through the official client (each waits on the server, so
    all are in flight together)."""
    gate = threading.Barrier(BURST)
    prefix = f"c{next(_bursts)}-"

    def post(i: int) -> None:
        gate.wait()
        answer = api.create_namespaced_config_map(
            "default", {"metadata": {"name": f"{prefix}{i}"}}, _preload_content=False)
        answer.drain_conn()  # read to the end: a socket with unread bytes is not reused
        answer.release_conn()
    threads = [threading.Thread(target=post, args=(i,)) for i in range(BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.fixture
def api_server():
    server = fake_kube_api.FakeKubeApi(record=False, write_latency_s=0.1)
    server.start()
    yield server
    server.stop()


def test_from_environment_keeps_a_burst_of_binds_connections(api_server, tmp_path,
                                                             monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{api_server.url}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a cluster
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    # load_kube_config sets the process-wide default configuration: restored after the test
    monkeypatch.setattr(client.Configuration, "_default", client.Configuration._default)
    api = KubeSource.from_environment().api
    _burst(api)
    first = api_server.connections_accepted
    _burst(api)
    assert first == BURST
    assert api_server.connections_accepted == first  # every connection of the first kept


def test_a_pool_below_the_burst_opens_connections_every_burst(api_server):
    """What the test above guards against (the client's default is cpu_count() * 5)."""
    cfg = client.Configuration(host=api_server.url)
    cfg.connection_pool_maxsize = 10
    api = client.CoreV1Api(client.ApiClient(cfg))
    _burst(api)
    first = api_server.connections_accepted
    _burst(api)
    assert api_server.connections_accepted > first
