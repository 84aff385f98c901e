"""Graph-feature columns of a profiled job, from its exported ONNX graph.

Zoo models are exported once per (model, workload) with a symbolic batch
dimension and read at each batch size (:func:`predictor.features.extract_features`
binds it); if a graph will not bind a symbolic batch, it is exported again at the
fixed batch size. User ONNX files are read as they are. Exports live in a
temporary directory for the campaign's lifetime.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from predictor.profiling.backend import JobSpec


def feature_columns(features: Any) -> dict[str, Any]:
    """The isolated.csv feature columns of a ``GraphFeatures`` value."""
    return {
        "flops": float(features.flops),
        "params_bytes": float(features.params_bytes),
        "activations_bytes": float(features.activations_bytes),
        "peak_activation_bytes": float(features.peak_activation_bytes),
        "op_counts": {str(k): int(v) for k, v in features.op_counts.items()},
    }


class GraphFeatureSource:
    """Exports zoo models to ONNX on CPU and extracts their features (cached)."""

    def __init__(self, workdir: Path | None = None):
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="tandem-profile-")
        self.workdir = Path(workdir) if workdir else Path(self._tmp.name)  # type: ignore[union-attr]
        self._exports: dict[tuple[str, str, int | None], Path] = {}
        self._cache: dict[str, dict[str, Any]] = {}

    def _export(self, job: JobSpec, batch: int | None) -> Path:
        from predictor.zoo import export_onnx

        key = (job.model, job.workload, batch)
        if key not in self._exports:
            name = f"{job.model}-{job.workload}-{batch or 'dyn'}.onnx"
            self._exports[key] = export_onnx(
                job.model, batch or 1, self.workdir / name,
                training=job.workload == "training", dynamic_batch=batch is None,
            )  # fmt: skip
        return self._exports[key]

    def features(self, job: JobSpec) -> dict[str, Any]:
        """Feature columns of ``job`` (raises when the graph cannot be exported or read)."""
        from predictor.features import extract_features

        if job.key in self._cache:
            return self._cache[job.key]
        if job.onnx_path:
            result = feature_columns(extract_features(job.onnx_path, job.batch_size))
        else:
            try:
                result = feature_columns(extract_features(self._export(job, None), job.batch_size))
            except Exception:  # a graph with a hard-coded batch: export at this batch instead
                result = feature_columns(
                    extract_features(self._export(job, job.batch_size), job.batch_size)
                )
        self._cache[job.key] = result
        return result

    def close(self) -> None:
        """Remove the exported files."""
        if self._tmp is not None:
            self._tmp.cleanup()
