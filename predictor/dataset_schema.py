"""The ``training_data/<gpu-product>/`` schema: column tuples and row validation.

One directory per GPU product holds what ``tandem profile`` measured on it:

``isolated.csv``   one row per (model, workload, batch size) run alone on the GPU.
    run_id, timestamp (ISO 8601 or unix seconds), gpu_product, driver_version,
    cuda_version, framework, framework_version, model, family,
    workload (training|inference), batch_size (int >= 1),
    status (ok|oom|error|timeout), error (text, empty when ok),
    flops, params_bytes, activations_bytes, peak_activation_bytes (graph features
    of the exported ONNX graph at that batch size), op_counts (JSON object
    ``{"Conv": 53, ...}``), util_mean_percent, util_p50_percent, util_p90_percent
    (NVML utilisation over the steady-state window, 0..100), mem_used_nvml_mib
    (device memory NVML attributes to the process), mem_peak_framework_mib (the
    framework allocator's peak), step_time_ms, throughput_per_s (samples per
    second), n_samples (NVML samples in the window).
``colocated.csv``  one row per job of a co-location combination.
    run_id, timestamp, gpu_product, combo_id, n_jobs, job_index, model, family,
    workload, batch_size, status, error, isolated_util_percent (that job alone),
    cumulative_isolated_util_percent (sum over the combination),
    isolated_step_time_ms, step_time_ms (co-located), slowdown
    (step_time_ms / isolated_step_time_ms), util_mean_percent (whole GPU while the
    combination ran), mem_used_nvml_mib.
``batching.csv``   model, family, gpu_product, batch_size, latency_mean_ms,
    latency_std_ms, mem_mib, n_samples (inference latency of one batch).
``observed.csv``   what a cluster running tandem observed
    (``tandem predictor export-observations``, :mod:`predictor.observed`): per
    model reference, workload and batch size its utilisation alone on this GPU.
    Training uses these rows too unless told not to (``--no-observed``).
``provenance.json`` command, tandem_version, started_at, finished_at,
    hardware {gpu_product, driver_version, cuda_version, cpu}, software
    {package: version}, notes, and optionally ``simulated`` (a JSON boolean;
    ``true`` for rows from the profiler's ``sim:`` backend). Training refuses a
    directory without provenance, and one marked simulated unless asked to
    accept it (``allow_simulated``), so synthetic rows never pass for measurements.

Measurement columns may be empty on rows whose status is not ``ok`` (an OOM run
has no utilisation); on ``ok`` rows they are required. ``validate_rows`` returns
every problem with its row and column so a profiler can fix a file in one pass.

Loading a directory (provenance first, then every table) is :mod:`predictor.dataset`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from predictor.observed import OBSERVED_FILE

ISOLATED_COLUMNS: tuple[str, ...] = (
    "run_id",
    "timestamp",
    "gpu_product",
    "driver_version",
    "cuda_version",
    "framework",
    "framework_version",
    "model",
    "family",
    "workload",
    "batch_size",
    "status",
    "error",
    "flops",
    "params_bytes",
    "activations_bytes",
    "peak_activation_bytes",
    "op_counts",
    "util_mean_percent",
    "util_p50_percent",
    "util_p90_percent",
    "process_util_mean_percent",
    "mem_used_nvml_mib",
    "mem_peak_framework_mib",
    "step_time_ms",
    "throughput_per_s",
    "n_samples",
)
COLOCATED_COLUMNS: tuple[str, ...] = (
    "run_id",
    "timestamp",
    "gpu_product",
    "combo_id",
    "n_jobs",
    "job_index",
    "model",
    "family",
    "workload",
    "batch_size",
    "status",
    "error",
    "isolated_util_percent",
    "cumulative_isolated_util_percent",
    "isolated_step_time_ms",
    "step_time_ms",
    "slowdown",
    "util_mean_percent",
    "process_util_mean_percent",
    "mem_used_nvml_mib",
)
BATCHING_COLUMNS: tuple[str, ...] = (
    "model",
    "family",
    "gpu_product",
    "batch_size",
    "latency_mean_ms",
    "latency_std_ms",
    "mem_mib",
    "n_samples",
)
PROVENANCE_KEYS: tuple[str, ...] = (
    "command",
    "tandem_version",
    "started_at",
    "finished_at",
    "hardware",
    "software",
    "notes",
)
PROVENANCE_HARDWARE_KEYS: tuple[str, ...] = ("gpu_product", "driver_version", "cuda_version", "cpu")

WORKLOADS = ("training", "inference")
STATUSES = ("ok", "oom", "error", "timeout")

FILES = {"isolated": "isolated.csv", "colocated": "colocated.csv", "batching": "batching.csv"}
DATA_FILES = (*FILES.values(), OBSERVED_FILE)
"""Every table a ``<gpu-product>/`` directory may hold (profiled and observed)."""
PROVENANCE_FILE = "provenance.json"

# Column kinds: "str" (non-empty text), "text" (may be empty), "int", "float",
# "percent" (0..100, per process; combined GPU may not exceed 100 either), "json".
_KINDS: dict[str, str] = {
    "error": "text",
    "notes": "text",
    "batch_size": "int",
    "n_jobs": "int",
    "job_index": "int",
    "n_samples": "int",
    "flops": "float",
    "params_bytes": "float",
    "activations_bytes": "float",
    "peak_activation_bytes": "float",
    "op_counts": "json",
    "util_mean_percent": "percent",
    "util_p50_percent": "percent",
    "util_p90_percent": "percent",
    "process_util_mean_percent": "percent",
    "isolated_util_percent": "percent",
    "cumulative_isolated_util_percent": "float",
    "mem_used_nvml_mib": "float",
    "mem_peak_framework_mib": "float",
    "step_time_ms": "float",
    "isolated_step_time_ms": "float",
    "throughput_per_s": "float",
    "slowdown": "float",
    "latency_mean_ms": "float",
    "latency_std_ms": "float",
    "mem_mib": "float",
}
# Columns that only ok rows must fill (the rest are always required, except "text"): in
# both per-run schemas, everything after ``status, error`` is a measurement.
_MEASUREMENTS = frozenset(
    ISOLATED_COLUMNS[ISOLATED_COLUMNS.index("error") + 1 :]
    + COLOCATED_COLUMNS[COLOCATED_COLUMNS.index("error") + 1 :]
)
# Columns a file may lack (written before they existed) and an ok row may leave empty:
# NVML's per-process utilisation is unsupported on some GPUs (vGPU, MIG, older cards).
OPTIONAL_COLUMNS = frozenset({"process_util_mean_percent"})
SCHEMAS: dict[str, tuple[str, ...]] = {
    "isolated": ISOLATED_COLUMNS,
    "colocated": COLOCATED_COLUMNS,
    "batching": BATCHING_COLUMNS,
}
"""Columns of each table kind (isolated|colocated|batching), in file order."""


@dataclass(frozen=True)
class Problem:
    """One invalid cell: ``row`` is 1-based over data rows (0 = the header or file)."""

    file: str
    row: int
    column: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.row}:{self.column}: {self.message}"


def _parse_cell(kind: str, raw: Any) -> Any:
    """Convert one cell; raises ValueError with a short reason."""
    if kind in ("str", "text"):
        return "" if raw is None else str(raw)
    if kind == "json":
        value = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in value.items()
        ):
            raise ValueError("expected a JSON object of operator -> count >= 0")
        return value
    if kind == "int":
        value = float(raw)
        if value != int(value) or value < 0:
            raise ValueError(f"expected an integer >= 0, got {raw!r}")
        return int(value)
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a finite number >= 0, got {raw!r}")
    if kind == "percent" and value > 100.0:
        raise ValueError(f"percent must be within 0..100, got {raw!r}")
    return value


def parse_row(
    kind: str, raw: Mapping[str, Any], file: str = "", row: int = 0
) -> tuple[dict[str, Any], list[Problem]]:
    """Typed values of one row of ``kind`` (isolated|colocated|batching) and its problems."""
    columns = SCHEMAS[kind]
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    status = str(raw.get("status", "ok") or "")
    ok = status == "ok" or kind == "batching"
    for column in columns:
        cell = raw.get(column)
        ckind = _KINDS.get(column, "str")
        empty = cell is None or (isinstance(cell, str) and cell.strip() == "")
        if empty:
            out[column] = "" if ckind == "text" else None
            if ckind != "text" and column not in OPTIONAL_COLUMNS and (
                    ok or column not in _MEASUREMENTS):  # fmt: skip
                problems.append(Problem(file, row, column, "required value is empty"))
            continue
        try:
            out[column] = _parse_cell(ckind, cell)
        except (ValueError, TypeError) as exc:
            out[column] = None
            problems.append(Problem(file, row, column, str(exc)))
    for column, allowed in (("workload", WORKLOADS), ("status", STATUSES)):
        if column in columns and out.get(column) not in allowed and out.get(column) is not None:
            problems.append(Problem(file, row, column, f"must be one of {'|'.join(allowed)}"))
    if kind != "batching" and out.get("batch_size") == 0:
        problems.append(Problem(file, row, "batch_size", "must be >= 1"))
    return out, problems


def validate_rows(kind: str, rows: Iterable[Mapping[str, Any]], file: str = "") -> list[Problem]:
    """Every problem of ``rows`` (dicts keyed by column) against the ``kind`` schema."""
    if kind not in SCHEMAS:
        raise ValueError(f"unknown table {kind!r}; expected one of {sorted(SCHEMAS)}")
    file = file or FILES[kind]
    problems: list[Problem] = []
    for i, raw in enumerate(rows, start=1):
        extra = sorted(set(raw) - set(SCHEMAS[kind]))
        if extra:
            problems.append(Problem(file, i, ",".join(extra), "unknown column"))
        problems.extend(parse_row(kind, raw, file, i)[1])
    return problems


def validate_header(kind: str, header: Sequence[str], file: str = "") -> list[Problem]:
    """Problems of a CSV header: missing or unknown columns (order is free)."""
    file = file or FILES[kind]
    expected = SCHEMAS[kind]
    problems = [Problem(file, 0, c, "missing column") for c in expected
                if c not in header and c not in OPTIONAL_COLUMNS]  # fmt: skip
    problems += [Problem(file, 0, c, "unknown column") for c in header if c not in expected]
    return problems


def validate_provenance(data: Any, file: str = PROVENANCE_FILE) -> list[Problem]:
    """Every problem of a parsed provenance.json object."""
    if not isinstance(data, dict):
        return [Problem(file, 0, "", "expected a JSON object")]
    problems = [Problem(file, 0, k, "missing key") for k in PROVENANCE_KEYS if k not in data]
    for key in ("command", "tandem_version", "started_at", "finished_at"):
        if key in data and not (isinstance(data[key], str) and data[key].strip()):
            problems.append(Problem(file, 0, key, "must be a non-empty string"))
    hardware = data.get("hardware")
    if "hardware" in data:
        if not isinstance(hardware, dict):
            problems.append(Problem(file, 0, "hardware", "must be an object"))
        else:
            problems += [
                Problem(file, 0, f"hardware.{k}", "missing key")
                for k in PROVENANCE_HARDWARE_KEYS
                if k not in hardware
            ]
    if "software" in data and not isinstance(data["software"], dict):
        problems.append(Problem(file, 0, "software", "must be an object of package -> version"))
    if "simulated" in data and not isinstance(data["simulated"], bool):
        # "false" as a string would be truthy: refuse anything but a JSON boolean
        problems.append(Problem(file, 0, "simulated", "must be true or false"))
    return problems

