"""The public GPU-sharing trace format (Alibaba cluster-trace-gpu-v2023): node and pod lists.

Two CSV files, as published with "Beware of Fragmentation" (USENIX ATC'23):

- node list: ``sn, cpu_milli, memory_mib, gpu, model`` (one GPU node per row);
- pod list: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, ...``
  (further columns such as ``qos`` or ``creation_time`` are read past).

``gpu_milli`` is the share of one GPU a 1-GPU pod takes (1000 = the whole GPU);
pods with several GPUs take whole GPUs (``gpu_milli`` 1000), CPU-only pods 0.
``gpu_spec`` optionally names the GPU models a pod may use (``A|B``; empty = any).
Every row is checked: a bad one is an error naming the file, the line and the
column, never a silently dropped pod. The user's own download is read; nothing
of the trace ships with tandem.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
WHOLE_GPU_MILLI = 1000
MAX_GPUS_PER_NODE = 64
_MAX_VALUE = 10**12
"""Bound on every integer field (a petabyte of memory in MiB, a billion cores in milli)."""


class TraceError(ValueError):
    """A trace file cannot be read as the public format; the text names file, line and column."""


@dataclass(frozen=True)
class TraceNodes:
    """The node list, column by column (one entry per node, file order)."""

    names: tuple[str, ...]
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    gpus: np.ndarray
    models: tuple[str, ...]

    @property
    def gpu_capacity_milli(self) -> int:
        """Every node's GPUs together, in thousandths of a GPU."""
        return int(self.gpus.sum()) * WHOLE_GPU_MILLI


@dataclass(frozen=True)
class TracePods:
    """The pod list, column by column (one entry per pod, file order)."""

    names: tuple[str, ...]
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray
    """Per GPU: the share of each of its GPUs (1000 for multi-GPU pods, 0 for CPU-only)."""
    gpu_spec: tuple[frozenset[str], ...]
    """GPU models each pod may use; empty = any."""

    @property
    def gpu_demand_milli(self) -> np.ndarray:
        """Each pod's GPU demand in thousandths of a GPU (``num_gpu * gpu_milli``)."""
        return self.num_gpu * self.gpu_milli

    def __len__(self) -> int:
        return len(self.names)


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)} "
                                 f"(expected {', '.join(required)})")
            rows = [(reader.line_num, row) for row in reader]
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: not a CSV file: {exc}") from None
    if not rows:
        raise TraceError(f"{path}: no rows")
    return rows


def _int(path: Path, line: int, row: dict[str, str], column: str, low: int = 0) -> int:
    text = (row.get(column) or "").strip()
    if not text.isascii() or not text.lstrip("-").isdigit() or len(text) > 13:
        raise TraceError(f"{path}:{line}: {column}: {text!r} is not an integer")
    value = int(text)
    if not low <= value <= _MAX_VALUE:
        raise TraceError(f"{path}:{line}: {column}: {value} is out of range {low}..{_MAX_VALUE}")
    return value


def _name(path: Path, line: int, row: dict[str, str], column: str, seen: set[str]) -> str:
    name = (row.get(column) or "").strip()
    if not name:
        raise TraceError(f"{path}:{line}: {column}: empty")
    if name in seen:
        raise TraceError(f"{path}:{line}: {column}: {name!r} appears twice")
    seen.add(name)
    return name


def read_nodes(path: Path) -> TraceNodes:
    """The node list at ``path``; TraceError names the first bad row."""
    names, cpu, mem, gpus, models = [], [], [], [], []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        names.append(_name(path, line, row, "sn", seen))
        cpu.append(_int(path, line, row, "cpu_milli", 1))
        mem.append(_int(path, line, row, "memory_mib", 1))
        count = _int(path, line, row, "gpu", 1)
        if count > MAX_GPUS_PER_NODE:
            raise TraceError(f"{path}:{line}: gpu: {count} GPUs on one node "
                             f"(at most {MAX_GPUS_PER_NODE})")
        gpus.append(count)
        models.append((row.get("model") or "").strip() or "unknown")
    return TraceNodes(tuple(names), np.array(cpu, dtype=np.int64), np.array(mem, dtype=np.int64),
                      np.array(gpus, dtype=np.int64), tuple(models))


def read_pods(path: Path) -> TracePods:
    """The pod list at ``path``; TraceError names the first bad row."""
    names, cpu, mem, num, milli, specs = [], [], [], [], [], []
    seen: set[str] = set()
    for line, row in _rows(path, POD_COLUMNS):
        names.append(_name(path, line, row, "name", seen))
        cpu.append(_int(path, line, row, "cpu_milli"))
        mem.append(_int(path, line, row, "memory_mib"))
        count = _int(path, line, row, "num_gpu")
        share = _int(path, line, row, "gpu_milli")
        if count > MAX_GPUS_PER_NODE:
            raise TraceError(f"{path}:{line}: num_gpu: {count} (at most {MAX_GPUS_PER_NODE})")
        if count == 0 and share != 0:
            raise TraceError(f"{path}:{line}: gpu_milli: {share} on a pod with num_gpu 0")
        if count == 1 and not 1 <= share <= WHOLE_GPU_MILLI:
            raise TraceError(f"{path}:{line}: gpu_milli: {share} is out of range "
                             f"1..{WHOLE_GPU_MILLI}")
        if count > 1 and share != WHOLE_GPU_MILLI:
            raise TraceError(f"{path}:{line}: gpu_milli: {share}: a pod with {count} GPUs "
                             f"takes whole GPUs ({WHOLE_GPU_MILLI})")
        num.append(count)
        milli.append(share)
        spec = (row.get("gpu_spec") or "").strip()
        specs.append(frozenset(s.strip() for s in spec.split("|") if s.strip()))
    return TracePods(tuple(names), np.array(cpu, dtype=np.int64), np.array(mem, dtype=np.int64),
                     np.array(num, dtype=np.int64), np.array(milli, dtype=np.int64), tuple(specs))
