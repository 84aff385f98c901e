"""Simulated jobs and trace files (JSON, YAML or CSV).

A job is what a user submits: ``tasks`` pods of ``gpus_per_task`` GPUs each, a
duration in isolation, its true per-GPU utilisation and memory, and what the
predictor would have said (``predicted_*``; defaults to the truth). The gap
between truth and prediction is what makes OOM events and bad packings happen.

Trace file: a list of job objects (or ``{"jobs": [...]}``) with the field names
of :class:`SimJob`; CSV uses the same names as its header. Only ``id``,
``arrival_s`` and ``duration_s`` are required.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


class TraceError(ValueError):
    """A trace file or job record is malformed; ``path`` points at the culprit."""

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class SimJob:
    """One submitted job (all GPUs of a job carry the same per-GPU demand)."""

    id: str
    arrival_s: float
    duration_s: float
    tasks: int = 1
    gpus_per_task: int = 1
    util_percent: float = 50.0
    mem_mib: float = 2048.0
    predicted_util_percent: float | None = None
    predicted_mem_mib: float | None = None
    kind: str = ""
    """Free-form class label from the generator (``short-light`` ...), for reports."""
    model: str = ""
    """The model the job trains (``tandem.io/model``); a truth file keys its numbers by it,
    and online learning its observations. Empty: the job asserts its numbers."""

    @property
    def gpus(self) -> int:
        """Total GPUs of the job."""
        return self.tasks * self.gpus_per_task

    @property
    def pred_util(self) -> float:
        """Utilisation the scheduler believes (prediction, else truth)."""
        return self.util_percent if self.predicted_util_percent is None \
            else self.predicted_util_percent

    @property
    def pred_mem(self) -> float:
        """Memory the scheduler believes (estimate, else truth)."""
        return self.mem_mib if self.predicted_mem_mib is None else self.predicted_mem_mib


_FIELDS = {f.name: f for f in fields(SimJob)}
_INT_FIELDS = {"tasks", "gpus_per_task"}
_STR_FIELDS = {"id", "kind", "model"}
_OPTIONAL = {"predicted_util_percent", "predicted_mem_mib"}


def job_from_mapping(raw: Mapping[str, Any], path: str = "jobs[0]") -> SimJob:
    """Validate one job record; raises TraceError naming the first bad field."""
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise TraceError(f"{path}.{unknown[0]}", f"unknown field (valid: {', '.join(_FIELDS)})")
    for required in ("id", "arrival_s", "duration_s"):
        if required not in raw or raw[required] in ("", None):
            raise TraceError(f"{path}.{required}", "required")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name in _OPTIONAL and value in ("", None):
            continue
        if name in _STR_FIELDS:
            values[name] = str(value)
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TraceError(f"{path}.{name}", f"not a number: {value!r}") from None
        if not math.isfinite(number):
            raise TraceError(f"{path}.{name}", "must be finite")
        if name in _INT_FIELDS:
            if number != int(number) or number < 1:
                raise TraceError(f"{path}.{name}", f"must be an integer >= 1, got {value!r}")
            values[name] = int(number)
        else:
            values[name] = number
    job = SimJob(**values)
    if job.duration_s <= 0:
        raise TraceError(f"{path}.duration_s", "must be > 0")
    if job.arrival_s < 0:
        raise TraceError(f"{path}.arrival_s", "must be >= 0")
    for name in ("util_percent", "predicted_util_percent"):
        v = getattr(job, name)
        if v is not None and not 0 <= v <= 100:
            raise TraceError(f"{path}.{name}", "must be within 0..100")
    for name in ("mem_mib", "predicted_mem_mib"):
        v = getattr(job, name)
        if v is not None and v < 0:
            raise TraceError(f"{path}.{name}", "must be >= 0")
    return job


def validate_jobs(jobs: Sequence[SimJob]) -> list[SimJob]:
    """Reject duplicate ids; return the jobs sorted by (arrival, id)."""
    seen: set[str] = set()
    for i, job in enumerate(jobs):
        if job.id in seen:
            raise TraceError(f"jobs[{i}].id", f"duplicate id {job.id!r}")
        seen.add(job.id)
    return sorted(jobs, key=lambda j: (j.arrival_s, j.id))


def load_trace(path: Path) -> list[SimJob]:
    """Read a trace from ``.json``, ``.yaml``/``.yml`` or ``.csv``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(str(path), f"cannot read: {exc.strerror}") from None
    suffix = path.suffix.lower()
    if suffix == ".csv":
        rows: Iterable[Mapping[str, Any]] = list(csv.DictReader(text.splitlines()))
    else:
        try:
            if suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except ValueError as exc:  # yaml.YAMLError subclasses Exception, handled below
            raise TraceError(str(path), f"not valid JSON: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - YAML parser errors have no common base here
            raise TraceError(str(path), f"not valid YAML: {exc}") from None
        if isinstance(data, Mapping):
            data = data.get("jobs")
        if not isinstance(data, list):
            raise TraceError(str(path), "expected a list of jobs or {jobs: [...]}")
        rows = data
    jobs = []
    for i, raw in enumerate(rows):
        if not isinstance(raw, Mapping):
            raise TraceError(f"jobs[{i}]", "expected an object")
        jobs.append(job_from_mapping(raw, f"jobs[{i}]"))
    if not jobs:
        raise TraceError(str(path), "the trace has no jobs")
    return validate_jobs(jobs)


def dump_trace(jobs: Sequence[SimJob]) -> str:
    """JSON text of a trace (round-trips through :func:`load_trace`)."""
    return json.dumps({"jobs": [asdict(j) for j in jobs]}, indent=1)
