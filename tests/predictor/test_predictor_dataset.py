"""training_data/ schema: row validation with row/column problems, provenance, loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictor.dataset import (
    DatasetError,
    MissingProvenance,
    load_gpu_dir,
    load_training_data,
    write_csv,
)
from predictor.dataset_schema import (
    BATCHING_COLUMNS,
    COLOCATED_COLUMNS,
    ISOLATED_COLUMNS,
    validate_header,
    validate_provenance,
    validate_rows,
)


def isolated_row(**over) -> dict:
    row = dict.fromkeys(ISOLATED_COLUMNS, "x")
    row.update(
        timestamp="2026-01-01T00:00:00Z",
        workload="training",
        batch_size="32",
        status="ok",
        error="",
        flops="1e9",
        params_bytes="1000",
        activations_bytes="2000",
        peak_activation_bytes="500",
        op_counts='{"Conv": 3}',
        util_mean_percent="55.5",
        util_p50_percent="55",
        util_p90_percent="70",
        process_util_mean_percent="54",
        mem_used_nvml_mib="1234",
        mem_peak_framework_mib="1000",
        step_time_ms="12.5",
        throughput_per_s="2560",
        n_samples="40",
    )
    row.update(over)
    return row


PROBLEMS = {
    "valid": ({}, []),
    "bad-workload": ({"workload": "serving"}, [("workload", "must be one of")]),
    "bad-status": ({"status": "crashed"}, [("status", "must be one of")]),
    "util-over-100": ({"util_mean_percent": "140"}, [("util_mean_percent", "0..100")]),
    "negative-flops": ({"flops": "-1"}, [("flops", ">= 0")]),
    "op-counts-not-object": ({"op_counts": "[1, 2]"}, [("op_counts", "JSON object")]),
    "batch-not-int": ({"batch_size": "2.5"}, [("batch_size", "integer")]),
    "batch-zero": ({"batch_size": "0"}, [("batch_size", ">= 1")]),
    "ok-row-missing-util": ({"util_mean_percent": ""}, [("util_mean_percent", "empty")]),
    "oom-row-without-measurements": (
        {"status": "oom", "error": "CUDA OOM", "util_mean_percent": "", "step_time_ms": "",
         "flops": ""}, []),
    "missing-model": ({"model": ""}, [("model", "empty")]),
}  # fmt: skip


@pytest.mark.parametrize(("over", "expected"), PROBLEMS.values(), ids=PROBLEMS.keys())
def test_validate_rows_reports_row_and_column(over: dict, expected: list) -> None:
    problems = validate_rows("isolated", [isolated_row(), isolated_row(**over)])
    assert [(p.column, p.row) for p in problems] == [(c, 2) for c, _ in expected]
    for problem, (_, text) in zip(problems, expected, strict=True):
        assert text in problem.message


def test_unknown_columns_and_headers_are_reported() -> None:
    problems = validate_rows("batching", [dict.fromkeys(BATCHING_COLUMNS, "1") | {"extra": 1}])
    assert [(p.column, p.message) for p in problems] == [("extra", "unknown column")]
    header = [c for c in COLOCATED_COLUMNS if c != "slowdown"] + ["bogus"]
    got = {(p.column, p.message) for p in validate_header("colocated", header)}
    assert got == {("slowdown", "missing column"), ("bogus", "unknown column")}


def provenance() -> dict:
    return {"command": "tandem profile run", "tandem_version": "0.1.0",
            "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T01:00:00Z",
            "hardware": {"gpu_product": "G", "driver_version": "1", "cuda_version": "12",
                         "cpu": "c"}, "software": {"torch": "2.13"}, "notes": ""}  # fmt: skip


PROVENANCE_CASES = {
    "no-command": (lambda p: p.pop("command"), "command"),
    "no-cpu": (lambda p: p["hardware"].pop("cpu"), "hardware.cpu"),
    "software-not-object": (lambda p: p.update(software=[]), "software"),
    "empty-start": (lambda p: p.update(started_at=""), "started_at"),
}


@pytest.mark.parametrize(
    ("mutate", "column"), PROVENANCE_CASES.values(), ids=PROVENANCE_CASES.keys()
)
def test_validate_provenance(mutate, column: str) -> None:
    assert validate_provenance(provenance()) == []
    data = provenance()
    mutate(data)
    assert [p.column for p in validate_provenance(data)] == [column]


def test_load_requires_provenance_and_valid_rows(tmp_path: Path) -> None:
    gpu = tmp_path / "G"
    gpu.mkdir()
    write_csv(gpu / "isolated.csv", "isolated", [isolated_row()])
    with pytest.raises(MissingProvenance):
        load_gpu_dir(gpu)
    (gpu / "provenance.json").write_text("{not json")
    with pytest.raises(MissingProvenance):
        load_training_data(tmp_path)
    (gpu / "provenance.json").write_text(json.dumps(provenance()))
    [ds] = load_training_data(tmp_path)
    assert ds.gpu_product == "G"
    assert ds.isolated[0]["op_counts"] == {"Conv": 3}
    assert ds.isolated[0]["batch_size"] == 32
    assert ds.colocated == () and ds.batching == ()
    write_csv(gpu / "isolated.csv", "isolated", [isolated_row(), isolated_row(workload="nope")])
    with pytest.raises(DatasetError) as info:
        load_training_data(tmp_path)
    assert any("isolated.csv:2:workload" in p for p in info.value.problems)


def test_empty_root_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError):
        load_training_data(tmp_path)


def test_per_process_utilisation_is_optional_but_checked_when_present() -> None:
    # NVML has no per-process figure on vGPU, MIG and older cards: the column may be
    # empty in an ok row, and a file written before it existed may lack it.
    assert validate_rows("isolated", [isolated_row(process_util_mean_percent="")]) == []
    header = [c for c in ISOLATED_COLUMNS if c != "process_util_mean_percent"]
    assert validate_header("isolated", header) == []
    problems = validate_rows("isolated", [isolated_row(process_util_mean_percent="130")])
    assert [p.column for p in problems] == ["process_util_mean_percent"]
