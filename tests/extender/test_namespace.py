"""One namespace for everything the extender stores (extender.cluster.namespace)."""

from __future__ import annotations

import pytest
from kubernetes import client

from extender.cluster.kube import KubeSource
from extender.cluster.namespace import INSTALL_NAMESPACE, own_namespace
from extender.config.schema import build_config
from extender.ha.lifecycle import setup_leadership
from extender.learning.learner import build_learner
from lab.fakes import kube_api as fake_kube_api


def test_order_configured_then_pod_namespace_then_service_account_then_install(tmp_path):
    sa = tmp_path / "namespace"
    sa.write_text("from-sa\n")
    missing = tmp_path / "absent"
    assert own_namespace("cfg", {"POD_NAMESPACE": "env"}, sa) == "cfg"
    assert own_namespace(None, {"POD_NAMESPACE": "env"}, sa) == "env"
    assert own_namespace(None, {"POD_NAMESPACE": " "}, sa) == "from-sa"
    assert own_namespace(None, {}, missing) == INSTALL_NAMESPACE == "tandem-system"


@pytest.fixture
def api():
    fake = fake_kube_api.FakeKubeApi()
    fake.start()
    yield client.CoreV1Api(client.ApiClient(client.Configuration(host=fake.url))), fake
    fake.stop()


@pytest.mark.parametrize(("env", "expected"), [
    ({"POD_NAMESPACE": "ml-platform"}, "ml-platform"), ({}, "tandem-system")],
    ids=["pod-namespace", "outside-a-pod"])
def test_learning_configmap_goes_to_the_install_namespace(api, monkeypatch, env, expected):
    # Outside a pod it went to "default", which the install's RBAC refuses.
    core, fake = api
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = build_config({}).learning
    learner = build_learner(cfg, KubeSource(core, background_events=False), lambda: True)
    assert learner.persistence is not None and learner.persistence.namespace == expected
    paths = {r.path for r in fake.requests if "configmaps" in r.path}
    assert paths == {f"/api/v1/namespaces/{expected}/configmaps/tandem-learning"}


def test_leases_use_the_same_resolver():
    seen = {}

    class Coordination:
        def read_namespaced_lease(self, name, namespace, **_):
            seen["namespace"] = namespace
            raise client.ApiException(status=404)

    leadership, _ = setup_leadership("follow-scheduler", "tandem-scheduler",
                                     environ={"POD_NAME": "p"}, hostname=lambda: "h",
                                     clients=lambda: (Coordination(), object()))
    leadership.step()
    assert seen["namespace"] == "tandem-system"
