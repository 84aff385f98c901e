"""benchmarks/fault_injection.py at a tiny size: every endpoint fuzzed, faults injected of
every kind, and the audit finds nothing lost or leaked."""

from __future__ import annotations

import json

from bench_modules import load

fault_injection = load("fault_injection")


def test_tiny_run_counts_every_endpoint_and_fault_kind_and_loses_nothing(tmp_path):
    out = tmp_path / "fi.json"
    result = fault_injection.main(["--examples", "2", "--binds", "12", "--seed", "3",
                                   "--out", str(out)])
    assert json.loads(out.read_text()) == result
    summary = result["summary"]
    assert len(summary["endpoints_fuzzed"]) == 11
    assert summary["cases_tried"] >= 11 * 4
    assert summary["answers_5xx"] == 0 and summary["property_violations"] == 0
    assert (summary["reservations_lost"], summary["reservations_leaked"]) == (0, 0)
    assert summary["gpus_over_pod_limit"] == 0
    campaign = result["fault_campaign"]
    assert campaign["ledger_settled_within_10s"] and campaign["unclear_errors"] == []
    assert set(campaign["faults_per_kind"]) == set(fault_injection.FAULT_KINDS)
    assert summary["faults_injected"] == 12 - campaign["faults_per_kind"]["none"]
    assert result["machine"]["cores"] >= 1 and "command" in result
