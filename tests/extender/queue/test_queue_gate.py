"""The scheduling-gate controller against a fake CoreV1Api (no cluster)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from queue_gate_fakes import NOW, FakeCoreV1, pod

from extender.queue.fair import QueueConfig
from extender.queue.gate import (
    GATE_NAME,
    RELEASED_ANNOTATION,
    GateConfig,
    GateController,
    release_patch,
)


def controller(api: FakeCoreV1, beta: int = 2, k: int = 1,
               starvation_s: float = 3600.0) -> GateController:
    cfg = GateConfig(queue=QueueConfig(k=k, beta=beta, starvation_seconds=starvation_s))
    return GateController(api, cfg, clock=lambda: NOW)


def test_releases_the_oldest_beta_gated_gpu_pods() -> None:
    api = FakeCoreV1([pod("young", age_s=5), pod("old", age_s=50), pod("mid", age_s=20),
                      pod("cpu-only", gpus=0, age_s=999), pod("ungated", gated=False)])
    report = controller(api, beta=2).reconcile()
    assert report.gated == 3
    assert report.released == ("ml/old", "ml/mid")
    assert [p[0] for p in api.patches] == ["old", "mid"]
    assert api.patches[0][3]["_content_type"] == "application/json-patch+json"


def test_in_flight_pods_use_up_the_round_budget() -> None:
    api = FakeCoreV1([pod("a", age_s=50), pod("b", age_s=40),
                      pod("flying", gated=False, released=True),
                      pod("bound", gated=False, released=True, node="n1")])
    report = controller(api, beta=2).reconcile()
    assert report.in_flight == 1
    assert report.released == ("ml/a",)


def test_release_patch_tests_removes_and_stamps() -> None:
    p = pod("x", other_gates=("someone.else/gate",))
    ops = release_patch(p, 1, NOW)
    assert ops[0] == {"op": "test", "path": "/spec/schedulingGates/1/name", "value": GATE_NAME}
    assert ops[1] == {"op": "remove", "path": "/spec/schedulingGates/1"}
    assert ops[2]["path"] == "/metadata/annotations/tandem.io~1queue-released-at"


def test_release_patch_creates_annotations_when_the_pod_has_none() -> None:
    p = pod("x", util=None, mem=None)
    p["metadata"]["annotations"] = {}
    ops = release_patch(p, 0, NOW)
    assert ops[2]["path"] == "/metadata/annotations"
    assert RELEASED_ANNOTATION in ops[2]["value"]


def test_gate_behind_another_gate_is_found_by_name() -> None:
    api = FakeCoreV1([pod("x", other_gates=("a/b", "c/d"))])
    controller(api).reconcile()
    assert api.patches[0][2][1] == {"op": "remove", "path": "/spec/schedulingGates/2"}


def test_conflicting_patch_is_reported_and_not_fatal() -> None:
    api = FakeCoreV1([pod("a", age_s=30), pod("b", age_s=20)], conflict_on={"a"})
    report = controller(api).reconcile()
    assert report.conflicts == ("ml/a",)
    assert report.released == ("ml/b",)


def test_api_failure_is_a_report_not_an_exception() -> None:
    report = controller(FakeCoreV1([], fail_list=True)).reconcile()
    assert report.error is not None and "unreachable" in report.error
    assert report.released == ()


def test_starving_class_gets_through_ahead_of_a_busy_class() -> None:
    busy = [pod(f"heavy{i}", age_s=5 + i, util=95, mem=7000) for i in range(10)]
    starving = pod("tiny", age_s=4000, util=5, mem=100, gpus=1)
    api = FakeCoreV1([*busy, starving])
    report = controller(api, beta=1, k=2, starvation_s=3600).reconcile()
    assert report.released == ("ml/tiny",)


def test_tasks_of_one_owner_are_counted_together() -> None:
    pods = [pod(f"w{i}", owner="job-1", age_s=10) for i in range(4)] + [pod("solo", age_s=11)]
    ctrl = controller(FakeCoreV1(pods), beta=5, k=2)
    items = {}
    original = ctrl._item

    def spy(p: Mapping[str, Any], tasks: int, now: float) -> Any:
        item = original(p, tasks, now)
        items[item.key] = item
        return item

    ctrl._item = spy  # type: ignore[method-assign]
    ctrl.reconcile()
    assert items["ml/w0"].tasks == 4 and items["ml/solo"].tasks == 1
    assert items["ml/w0"].util_percent == 40.0 and items["ml/w0"].mem_mib == 2000.0


def test_pods_without_demand_use_the_injected_demand_function() -> None:
    api = FakeCoreV1([pod("m", util=None, mem=None)])
    api.pods[0]["metadata"]["annotations"]["tandem.io/model"] = "resnet50.onnx"
    seen = []
    ctrl = GateController(api, GateConfig(), clock=lambda: NOW,
                          demand_fn=lambda p: (seen.append(p) or (70.0, 3000.0)))
    assert ctrl.reconcile().released == ("ml/m",)
    assert len(seen) == 1


def test_interval_must_be_positive() -> None:
    from extender.queue.fair import QueueError

    with pytest.raises(QueueError) as err:
        GateConfig(interval_seconds=0)
    assert err.value.field == "interval_seconds"


def test_namespaces_limit_listing_to_those_namespaces() -> None:
    other = pod("elsewhere", age_s=500)
    other["metadata"]["namespace"] = "team-b"
    api = FakeCoreV1([pod("here", age_s=5), other])
    cfg = GateConfig(queue=QueueConfig(k=1, beta=5), namespaces=("ml",))
    report = GateController(api, cfg, clock=lambda: NOW).reconcile()
    assert api.lists == ["ml"]
    assert report.released == ("ml/here",)


def test_all_namespaces_is_one_cluster_wide_list() -> None:
    api = FakeCoreV1([pod("a")])
    controller(api).reconcile()
    assert api.lists == [None]


def test_custom_gate_name_is_the_only_gate_removed() -> None:
    api = FakeCoreV1([pod("ours", gated=False, other_gates=("example.com/fair",)),
                      pod("default-gate", age_s=99)])
    cfg = GateConfig(queue=QueueConfig(k=1, beta=5), gate_name="example.com/fair")
    report = GateController(api, cfg, clock=lambda: NOW).reconcile()
    assert report.released == ("ml/ours",)
    assert api.patches[0][2][0]["value"] == "example.com/fair"


@pytest.mark.parametrize(("leading", "rounds"), [(True, 1), (False, 0)],
                         ids=["leader-releases", "standby-idles"])
def test_run_reconciles_only_while_leading(leading: bool, rounds: int) -> None:
    import threading

    api = FakeCoreV1([pod("a")])
    stop = threading.Event()
    checks: list[bool] = []

    def is_leader() -> bool:
        stop.set()  # ask to stop now: the loop must still finish this one iteration
        checks.append(leading)
        return leading

    ctrl = GateController(api, GateConfig(interval_seconds=0.001), clock=lambda: NOW)
    ctrl.run(stop, is_leader)
    assert checks == [leading]
    assert len(api.lists) == rounds
    assert len(api.patches) == rounds


@pytest.mark.parametrize(("kwargs", "field_name"), [
    ({"gate_name": ""}, "gate_name"),
    ({"namespaces": ("ml", "")}, "namespaces"),
], ids=["empty-gate-name", "empty-namespace"])
def test_gate_config_rejects(kwargs: dict[str, Any], field_name: str) -> None:
    from extender.queue.fair import QueueError

    with pytest.raises(QueueError) as err:
        GateConfig(**kwargs)
    assert err.value.field == field_name


def test_report_names_the_oldest_wait_and_classes_even_without_a_free_slot() -> None:
    api = FakeCoreV1([pod("a", age_s=50), pod("b", age_s=400),
                      pod("flying", gated=False, released=True)])
    report = controller(api, beta=1).reconcile()
    assert report.in_flight == 1 and report.released == ()
    assert report.oldest_wait_seconds == 400.0
    assert report.classes == ((0, 2, 225.0, 450.0),)


def test_report_of_an_empty_queue() -> None:
    report = controller(FakeCoreV1([pod("cpu", gpus=0)])).reconcile()
    assert report.gated == 0 and report.oldest_wait_seconds == 0.0 and report.classes == ()
