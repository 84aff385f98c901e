"""The agent report: the agent's encoding is what the extender's one decoder reads."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from test_agent_reporter import SAMPLE

import contracts.agentreport as contract
from agent.node.reporter import build_report
from contracts.agentreport import ReportError, decode_report, encode_report
from extender.errors import BadRequest
from extender.state.reports import decode_report as extender_decode


def test_what_the_agent_sends_decodes_and_encodes_back_unchanged() -> None:
    sent = json.loads(json.dumps(build_report("gpu-node-1", SAMPLE)))
    decoded = decode_report(sent)
    assert encode_report(decoded) == sent
    assert decoded.gpus[0].processes[0].util_percent == 30.12
    assert decoded.gpus[1].memory_used_mib is None  # lost GPU: null metrics kept as None
    ledger = extender_decode(sent)
    assert ledger.gpus[0].uuid == "GPU-8c1b" and ledger.util_percent[0] == 37.5
    assert ledger.processes[0][0].pod_uid == "6f1c-uid"


def test_an_older_agent_without_optional_fields_is_read_and_unknown_keys_ignored() -> None:
    minimal = {"node": "n", "gpus": [{"index": 0, "uuid": "GPU-0", "product": "A100",
                                      "memory_total_mib": 40960, "future_field": [1, 2]}],
               "future_top_level": {"x": 1}}
    report = decode_report(minimal)
    assert report.timestamp is None and report.gpus[0].utilization_percent is None
    assert report.gpus[0].processes == ()


@pytest.mark.parametrize(("gpu", "field"), [
    ({"power_watts": "hot"}, "gpus[0].power_watts"),
    ({"temperature_c": float("inf")}, "gpus[0].temperature_c"),
    ({"mig_mode": "yes"}, "gpus[0].mig_mode"),
    ({"xid_errors": -1}, "gpus[0].xid_errors"),
    ({"processes": [{"pid": True}]}, "gpus[0].processes[0].pid"),
    ({"processes": [{"container_id": "c" * 300}]}, "gpus[0].processes[0].container_id"),
])
def test_every_field_is_checked_not_only_those_the_ledger_reads(gpu: dict[str, Any],
                                                                field: str) -> None:
    doc = {"node": "n", "gpus": [{"index": 0, "uuid": "GPU-0", "product": "A100",
                                  "memory_total_mib": 40960, **gpu}]}
    with pytest.raises(ReportError) as err:
        decode_report(doc)
    assert err.value.path == field
    with pytest.raises(BadRequest) as bad:
        extender_decode(doc)
    assert bad.value.path == field


def test_each_optional_field_table_names_real_attributes() -> None:
    """Adding an optional field is one dataclass field plus one table row; a typo fails here."""
    for cls, table in ((contract.AgentReport, contract._REPORT_OPTIONAL),
                       (contract.ReportedGpu, contract._GPU_OPTIONAL),
                       (contract.ReportedProcess, contract._PROCESS_OPTIONAL)):
        names = {f.name for f in dataclasses.fields(cls)}
        assert {attr for _, attr, _ in table} <= names, cls.__name__
        required = {f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING}
        assert not required & {attr for _, attr, _ in table} - {"pod_uid", "used_memory_mib",
                                                                 "util_percent"}
