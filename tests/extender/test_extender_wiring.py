"""Assembly in one place: the sources declare what callers use; the verbs own reports."""

from __future__ import annotations

import inspect

import pytest
from extender_builders import make_app, node, state_view

from contracts.agentreport import AgentReport, ReportedGpu
from extender.cluster.kube import KubeSource
from extender.cluster.sim import SimSource
from extender.cluster.source import ClusterSource
from extender.state.reports import DecodedReport

PROTOCOL_MEMBERS = sorted(
    name for name in {*ClusterSource.__annotations__,
                      *(n for n, v in vars(ClusterSource).items() if inspect.isfunction(v))}
    if not name.startswith("_"))


@pytest.mark.parametrize("source_class", [SimSource, KubeSource])
def test_each_source_has_every_member_the_protocol_declares(source_class: type) -> None:
    assert {"api", "sync", "start", "use_signer", "signs_placements", "kubelet_admits",
            "bind", "read_pod", "record_event", "stop"} <= set(PROTOCOL_MEMBERS)
    missing = [m for m in PROTOCOL_MEMBERS
               if not hasattr(source_class, m) and m not in source_class.__init__.__code__.co_names]
    assert missing == []


def test_agent_reports_are_handled_by_the_extender_not_the_routes() -> None:
    _, ext, *_ = make_app([node("n1", 1)])
    report = AgentReport("n1", (ReportedGpu(0, "GPU-x", "NVIDIA A100-SXM4-40GB", 40960.0,
                                            memory_used_mib=1000.0, utilization_percent=55.0),))
    assert ext.agents.report(DecodedReport.of(report)) == {"accepted": 1, "samples": 0}
    (gpu,) = state_view(ext.state)["nodes"]["n1"]["gpus"]
    assert gpu["uuid"] == "GPU-x" and gpu["observed_util"] == 55.0
