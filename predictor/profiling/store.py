"""The ``training_data/<gpu-product>/`` writer: append-only CSVs, resume state, provenance.

Every finished run is validated against :mod:`predictor.dataset_schema` (the one source
of the schema), appended as whole lines in one write, flushed and fsynced, so an
interrupted campaign loses at most the run in flight. Opening a directory repairs
what a crash can leave behind, so that resuming duplicates nothing:

- a torn last line (killed mid-write) is cut off;
- a co-located combination with fewer rows than jobs is dropped (it reruns);
- a batching row is written *before* its isolated row, and one without an ok
  isolated inference row is dropped (that configuration reruns).
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from predictor.dataset_schema import (
    BATCHING_COLUMNS,
    COLOCATED_COLUMNS,
    FILES,
    ISOLATED_COLUMNS,
    PROVENANCE_FILE,
    parse_row,
    validate_header,
    validate_provenance,
    validate_rows,
)
from predictor.profiling.errors import DataDirError

COLUMNS: Mapping[str, tuple[str, ...]] = {
    "isolated": ISOLATED_COLUMNS,
    "colocated": COLOCATED_COLUMNS,
    "batching": BATCHING_COLUMNS,
}


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _render(kind: str, rows: Iterable[Mapping[str, Any]], header: bool,
            columns: Sequence[str] | None = None) -> str:
    columns = COLUMNS[kind] if columns is None else columns
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({c: _cell(row.get(c)) for c in columns})
    return buf.getvalue()


class DataDir:
    """One GPU product's output directory, opened for appending."""

    def __init__(self, directory: Path):
        self.path = Path(directory)
        self.repairs: list[str] = []
        """What opening had to fix (torn lines, partial combinations), for provenance."""

    def file(self, kind: str) -> Path:
        """Path of the ``kind`` CSV."""
        return self.path / FILES[kind]

    def has_data(self) -> bool:
        """Whether any CSV exists with at least one row."""
        return any(self.raw_rows(kind) for kind in COLUMNS)

    def raw_rows(self, kind: str) -> list[dict[str, str]]:
        """Rows as strings (empty when the file does not exist)."""
        path = self.file(kind)
        if not path.is_file():
            return []
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            problems = validate_header(kind, list(reader.fieldnames or []), path.name)
            if problems:
                raise DataDirError(f"{path}: " + "; ".join(map(str, problems)))
            return [dict(r) for r in reader]

    def _header(self, kind: str) -> list[str]:
        with self.file(kind).open(newline="", encoding="utf-8") as fh:
            return next(csv.reader(fh), [])

    def rows(self, kind: str) -> list[dict[str, Any]]:
        """Typed rows of ``kind``; raises DataDirError if an existing row is invalid."""
        out, problems = [], []
        for i, raw in enumerate(self.raw_rows(kind), start=1):
            parsed, row_problems = parse_row(kind, raw, FILES[kind], i)
            out.append(parsed)
            problems += row_problems
        if problems:
            shown = "; ".join(map(str, problems[:10]))
            raise DataDirError(f"{self.file(kind)} holds invalid rows, fix or move it: {shown}")
        return out

    def append(self, kind: str, rows: list[Mapping[str, Any]]) -> None:
        """Validate and append ``rows`` in one write, then flush and fsync."""
        problems = validate_rows(kind, [{c: _cell(r.get(c)) for c in COLUMNS[kind]} for r in rows])
        if problems:
            # A bug in the profiler, not bad luck on the GPU: refuse to corrupt the file.
            raise DataDirError(f"refusing to write invalid {kind} rows: "
                               + "; ".join(map(str, problems)))  # fmt: skip
        path = self.file(kind)
        self.path.mkdir(parents=True, exist_ok=True)
        new = not path.is_file() or path.stat().st_size == 0
        # A file written before an optional column existed keeps its header.
        columns = None if new else [c for c in COLUMNS[kind] if c in self._header(kind)]
        with path.open("a", encoding="utf-8", newline="") as fh:
            fh.write(_render(kind, rows, header=new, columns=columns))
            fh.flush()
            os.fsync(fh.fileno())

    def repair(self) -> list[str]:
        """Fix what an interrupted campaign leaves behind; returns what was done."""
        for kind in COLUMNS:
            self._cut_torn_line(kind)
        self._drop_partial_combos()
        self._drop_orphan_batching()
        return self.repairs

    def _cut_torn_line(self, kind: str) -> None:
        path = self.file(kind)
        if not path.is_file():
            return
        data = path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        keep = data[: data.rfind(b"\n") + 1]
        path.write_bytes(keep)
        self.repairs.append(f"{path.name}: cut a torn last line ({len(data) - len(keep)} bytes)")

    def _rewrite(self, kind: str, rows: list[dict[str, str]]) -> None:
        _atomic_write(self.file(kind), _render(kind, rows, header=True))

    def _drop_partial_combos(self) -> None:
        rows = self.raw_rows("colocated")
        counts = Counter(r["combo_id"] for r in rows)
        partial = {r["combo_id"] for r in rows if counts[r["combo_id"]] < _int(r["n_jobs"])}
        if partial:
            self._rewrite("colocated", [r for r in rows if r["combo_id"] not in partial])
            self.repairs.append(f"colocated.csv: dropped {len(partial)} partial combination(s)")

    def _drop_orphan_batching(self) -> None:
        rows = self.raw_rows("batching")
        if not rows:
            return
        done = {(r["model"], r["batch_size"]) for r in self.raw_rows("isolated")
                if r["workload"] == "inference" and r["status"] == "ok"}  # fmt: skip
        seen: set[tuple[str, str]] = set()
        keep = []
        for r in rows:
            key = (r["model"], r["batch_size"])
            if key in done and key not in seen:
                keep.append(r)
                seen.add(key)
        if len(keep) != len(rows):
            self._rewrite("batching", keep)
            self.repairs.append(f"batching.csv: dropped {len(rows) - len(keep)} orphan row(s)")

    def read_provenance(self) -> dict[str, Any] | None:
        """The provenance object, or None when absent; DataDirError when unreadable."""
        path = self.path / PROVENANCE_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise DataDirError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise DataDirError(f"{path}: expected a JSON object")
        return data

    def write_provenance(self, data: Mapping[str, Any]) -> None:
        """Validate and atomically replace provenance.json."""
        problems = validate_provenance(dict(data))
        if problems:
            raise DataDirError("refusing to write invalid provenance: "
                               + "; ".join(map(str, problems)))  # fmt: skip
        self.path.mkdir(parents=True, exist_ok=True)
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        _atomic_write(self.path / PROVENANCE_FILE, text)


def _int(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return 0
