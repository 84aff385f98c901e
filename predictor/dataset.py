"""Loading ``training_data/``: one validated ``GpuDataset`` per ``<gpu-product>/`` directory.

The schema (columns, cell kinds, row and provenance validation) is
:mod:`predictor.dataset_schema`; this module reads and writes the files. A
directory without valid provenance raises ``MissingProvenance``, one marked
simulated raises ``SimulatedData`` unless allowed, and any invalid row raises
``DatasetError`` listing every problem, so synthetic or unexplained rows never
pass for measurements.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.dataset_schema import (
    DATA_FILES,
    FILES,
    PROVENANCE_FILE,
    SCHEMAS,
    Problem,
    parse_row,
    validate_header,
    validate_provenance,
)
from predictor.observed import OBSERVED_FILE, ObservationDocumentError, read_observed


class DatasetError(ValueError):
    """A training-data directory is missing files or holds invalid rows."""

    def __init__(self, problems: Sequence[Problem | str]):
        self.problems = tuple(str(p) for p in problems)
        shown = "; ".join(self.problems[:20])
        more = f" (and {len(self.problems) - 20} more)" if len(self.problems) > 20 else ""
        super().__init__(shown + more)


class MissingProvenance(DatasetError):
    """The directory has no valid provenance.json, so its data cannot be trusted."""


class SimulatedData(DatasetError):
    """The directory holds synthetic rows (``"simulated": true``) and they were not allowed."""


def write_csv(path: Path, kind: str, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write ``rows`` as a ``kind`` CSV (header in schema order; dicts as JSON)."""
    columns = SCHEMAS[kind]
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {
                    c: json.dumps(v, sort_keys=True)
                    if isinstance(v, dict)
                    else ("" if v is None else v)
                    for c, v in row.items()
                }
            )
    return Path(path)


def read_table(path: Path, kind: str) -> list[dict[str, Any]]:
    """Read and validate one CSV; raises DatasetError listing every problem."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        raw_rows = list(reader)
    problems = validate_header(kind, header, path.name)
    if problems:
        raise DatasetError(problems)
    rows = []
    for i, raw in enumerate(raw_rows, start=1):
        parsed, row_problems = parse_row(kind, raw, path.name, i)
        problems.extend(row_problems)
        rows.append(parsed)
    if problems:
        raise DatasetError(problems)
    return rows


@dataclass(frozen=True)
class GpuDataset:
    """Validated tables of one ``training_data/<gpu-product>/`` directory."""

    gpu_product: str
    path: Path
    provenance: dict[str, Any]
    isolated: tuple[dict[str, Any], ...]
    colocated: tuple[dict[str, Any], ...]
    batching: tuple[dict[str, Any], ...]
    observed: tuple[dict[str, Any], ...] = ()
    """``observed.csv`` rows (fleet observations), empty when the file is absent."""

    @property
    def simulated(self) -> bool:
        """Whether provenance marks these rows as synthetic (the ``sim:`` backend)."""
        return self.provenance.get("simulated") is True


def load_provenance(directory: Path) -> dict[str, Any]:
    """Read and validate ``provenance.json``; raises MissingProvenance when absent or invalid."""
    path = Path(directory) / PROVENANCE_FILE
    if not path.is_file():
        raise MissingProvenance(
            [
                f"{path}: no provenance.json; training data must record how it was measured "
                "(write it with `tandem profile`)"
            ]
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MissingProvenance([f"{path}: not valid JSON ({exc})"]) from exc
    problems = validate_provenance(data, str(path))
    if problems:
        raise MissingProvenance(problems)
    return data


def load_gpu_dir(directory: Path) -> GpuDataset:
    """Load one GPU product's directory (provenance first; missing CSVs are empty)."""
    directory = Path(directory)
    provenance = load_provenance(directory)
    tables: dict[str, tuple[dict[str, Any], ...]] = {}
    problems: list[str] = []
    for kind, name in FILES.items():
        path = directory / name
        if not path.is_file():
            tables[kind] = ()
            continue
        try:
            tables[kind] = tuple(read_table(path, kind))
        except DatasetError as exc:
            problems.extend(f"{directory.name}/{p}" for p in exc.problems)
    observed: tuple[dict[str, Any], ...] = ()
    if (directory / OBSERVED_FILE).is_file():
        try:
            observed = tuple(read_observed(directory / OBSERVED_FILE))
        except ObservationDocumentError as exc:
            problems.append(f"{directory.name}/{exc}")
    if problems:
        raise DatasetError(problems)
    return GpuDataset(
        directory.name,
        directory,
        provenance,
        tables["isolated"],
        tables["colocated"],
        tables["batching"],
        observed,
    )


def any_simulated(datasets: Iterable[GpuDataset]) -> bool:
    """Whether any of ``datasets`` is synthetic; what it trains must then say so."""
    return any(d.simulated for d in datasets)


def load_training_data(root: Path, allow_simulated: bool = False) -> list[GpuDataset]:
    """Load every ``<gpu-product>/`` directory under ``root`` (sorted by name).

    A directory whose provenance says ``"simulated": true`` raises SimulatedData
    unless ``allow_simulated``; callers then mark what they produce as simulated.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetError([f"{root}: not a directory"])
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    data_dirs = [d for d in dirs if any((d / f).is_file() for f in DATA_FILES)]
    if not data_dirs:
        raise DatasetError(
            [
                f"{root}: no <gpu-product>/ directory with isolated.csv, "
                "colocated.csv, batching.csv or observed.csv"
            ]
        )
    datasets = [load_gpu_dir(d) for d in data_dirs]
    simulated = [d.gpu_product for d in datasets if d.simulated]
    if simulated and not allow_simulated:
        raise SimulatedData(
            [
                f"{root / name}: provenance.json says simulated (synthetic rows from the "
                "sim: backend, not measurements); pass --allow-simulated for a dry run"
                for name in simulated
            ]
        )
    return datasets
