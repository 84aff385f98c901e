"""The workload's pod shapes, learned from the pods the extender binds (the packing score's p_m).

Each bind counts one shape: the pod's GPU count, its GPU memory per GPU (MiB, the
core's unit of a GPU share; 0 for a pod with no GPU), and its host CPU and memory
requests. The counts are a bounded, decaying
:class:`extender.core.fragmentation.ShapeStats` (``packing.max_shapes``,
``packing.window``), persisted in the learning document under ``shapes``
(:mod:`extender.learning.persistence`) and read by decisions through
:class:`extender.learning.knowledge.Knowledge` (``shapes``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from extender.core.fragmentation import Shape, Shapes, ShapeStats
from extender.core.packing import PackingPolicy

DOCUMENT_KEY = "shapes"
"""Where the learning document keeps the counts: ``{"max_shapes", "window", "rows"}``."""


class ShapeLearner:
    """Thread-safe shape counts; ``version`` moves with every change (the knowledge's key)."""

    def __init__(self, policy: PackingPolicy = PackingPolicy()):
        self._lock = threading.Lock()
        self._stats = ShapeStats(policy.max_shapes, policy.window)
        self.version = 0
        self.dirty = False

    def bounds(self, policy: PackingPolicy) -> None:
        """Apply ``packing.max_shapes`` and ``packing.window`` (a reload that changed them)."""
        with self._lock:
            if (self._stats.max_shapes, self._stats.window) != (policy.max_shapes,
                                                                 policy.window):
                self._stats = ShapeStats.from_document(self._stats.document(),
                                                       policy.max_shapes, policy.window)
                self.version += 1

    def observe(self, gpus: int, mem_mib_per_gpu: float, cpu_milli: float,
                mem_mib: float) -> None:
        """Count one bound pod (at whole MiB and millicores: closer requests are one shape)."""
        shape = Shape(int(gpus), float(round(max(mem_mib_per_gpu, 0.0))) if gpus else 0.0,
                      float(round(max(cpu_milli, 0.0))), float(round(max(mem_mib, 0.0))))
        with self._lock:
            self._stats.observe(shape)
            self.version += 1
            self.dirty = True

    def shapes(self, weighting: str) -> Shapes:
        """The distribution now, weighted as ``packing.weighting`` says."""
        with self._lock:
            return self._stats.shapes(weighting)

    @property
    def count(self) -> int:
        """Distinct shapes held."""
        with self._lock:
            return len(self._stats.counts)

    def to_document(self) -> dict[str, Any]:
        """The persisted form (counts rounded to 1/1000: the document stays small)."""
        with self._lock:
            rows = [[*row[:4], round(row[4], 3)] for row in self._stats.document()]
            return {"max_shapes": self._stats.max_shapes, "window": self._stats.window,
                    "rows": rows}

    def load_document(self, doc: Any, merge: bool = False) -> int:
        """Counts from :meth:`to_document` (``merge``: added to those held); ValueError if
        malformed. Returns the shapes read."""
        if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
            raise ValueError("shapes: must be a mapping with a list of rows")
        rows: Sequence[Any] = doc["rows"]
        if not all(isinstance(r, list) and len(r) == 5 for r in rows):
            raise ValueError("shapes.rows: each row is [gpus, per_gpu, cpu, mem, count]")
        with self._lock:
            bounds = self._stats.max_shapes, self._stats.window
            try:
                loaded = ShapeStats.from_document(rows, *bounds)
            except TypeError as exc:
                raise ValueError(f"shapes.rows: {exc}") from None
            if merge:  # the larger count per shape: a replica's counts began as the document's
                for shape, count in self._stats.counts.items():
                    loaded.counts[shape] = max(loaded.counts.get(shape, 0.0), count)
                loaded = ShapeStats.from_document(loaded.document(), *bounds)
            self._stats = loaded
            self.version += 1
            return len(rows)

    def view(self) -> dict[str, Any]:
        """For ``/v1/state`` (``learning.shapes``): the most frequent shapes first."""
        with self._lock:
            rows = sorted(self._stats.document(), key=lambda r: -r[4])
        return {"count": len(rows), "top": [
            {"gpus": int(g), "gpu_mem_mib": p, "cpu_milli": c, "memory_mib": m,
             "weight": round(w, 3)} for g, p, c, m, w in rows[:20]]}
