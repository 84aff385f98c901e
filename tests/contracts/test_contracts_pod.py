"""contracts.pod: a Pod read once into a typed, read-only view; nothing refused, every
malformed part listed with its path."""

from __future__ import annotations

import pytest

from contracts.pod import PodView
from extender.cluster.source import requests_gpus
from extender.core import DemandError, container_gpu_counts, parse_demand
from extender.service.demand_cache import demand_digest

POD = {"metadata": {"name": "p", "namespace": "ml", "uid": "u1", "labels": {"app": "x"},
                    "annotations": {"tandem.io/gpu-util": "10", "tandem.io/gpu-mem-mib": "100"},
                    "deletionTimestamp": "2026-01-01T00:00:00Z"},
       "spec": {"nodeName": "n1", "priority": 7, "preemptionPolicy": "Never",
                "initContainers": [{"name": "init", "resources": {
                    "requests": {"tandem.io/gpu": "1"}}}],
                "containers": [{"name": "a", "resources": {"limits": {"tandem.io/gpu": 2},
                                                           "requests": {"tandem.io/gpu": "1"}}},
                               {"name": "b", "resources": {"limits": {"cpu": "1"}}}]}}


def test_a_pod_is_read_once_into_a_typed_view():
    view = PodView.of(POD)
    assert (view.key, view.uid, view.node_name, view.priority) == ("ml/p", "u1", "n1", 7)
    assert view.preemption_policy == "Never" and view.deleting and view.labels == {"app": "x"}
    assert [(c.name, c.init, c.gpu_values) for c in view.containers] == [
        ("init", True, ("1",)), ("a", False, (2, "1")), ("b", False, ())]
    assert view.containers[1].path == "Pod.spec.containers[0].resources.tandem.io/gpu"
    assert view.requests_gpus and view.problems == () and PodView.of(view) is view
    assert view.asks_any_gpu and not any(c.names_nvidia_gpu for c in view.containers)
    with pytest.raises(TypeError):
        view.annotations["tandem.io/gpu-util"] = "99"  # read-only
    # every reader counts the same containers
    assert container_gpu_counts(view) == (("init", 1, True), ("a", 2, False))
    assert parse_demand(POD).gpu_count == 2 and demand_digest(POD) == demand_digest(view)


def test_malformed_parts_read_as_absent_and_are_listed_with_their_paths():
    view = PodView.of({"metadata": {"name": "", "annotations": ["x"]},
                       "spec": {"containers": {"a": 1}, "priority": "high"}})
    assert [p[0] for p in view.problems] == [
        "Pod.metadata.name", "Pod.metadata.annotations", "Pod.spec.containers"]
    assert view.namespace == "default" and view.priority == 0 and view.containers == ()
    with pytest.raises(DemandError) as err:
        parse_demand(view)
    assert err.value.field == "Pod.metadata.annotations"
    named_none = {"spec": {"containers": [{"resources": {"limits": {"tandem.io/gpu": None}}}]}}
    assert requests_gpus(named_none) and PodView.of(named_none).containers[0].gpu_values == ()
    assert not requests_gpus({"spec": "nope"})


def test_a_device_plugin_gpu_is_asked_for_but_not_tandem_s():
    view = PodView.of({"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"cpu": "1"}}},
        {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}})
    assert view.asks_any_gpu and not view.requests_gpus
    assert [c.names_nvidia_gpu for c in view.containers] == [False, True]
    assert not PodView.of({"spec": {"containers": [{"resources": {"claims": [{}]}}]}}).asks_any_gpu
