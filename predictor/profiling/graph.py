"""Graph-feature columns of a profiled job, from its exported ONNX graph.

Zoo models and user torch models are exported once per (model, workload) with a
symbolic batch dimension and read at each batch size
(:func:`predictor.features.extract_features` binds it). If that graph cannot be
read, or binding leaves nodes whose shapes shape inference could not resolve
(features would then be lower bounds), the model is exported again at the fixed
batch size and read from that graph. User ONNX files are read as they are.
Exports live in a temporary directory for the campaign's lifetime.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from predictor.profiling.backend import JobSpec, TorchModelSpec

Exporter = Callable[..., Path]
"""``exporter(name, batch_size, path, training=..., dynamic_batch=..., torch_model=...)``:
a zoo model by name, or the user torch model ``torch_model`` describes."""
Extractor = Callable[[Path, int], Any]
"""``extract_features(path, batch_size)`` returning a ``GraphFeatures``-like value."""


def feature_columns(features: Any) -> dict[str, Any]:
    """The isolated.csv feature columns of a ``GraphFeatures`` value."""
    return {
        "flops": float(features.flops),
        "params_bytes": float(features.params_bytes),
        "activations_bytes": float(features.activations_bytes),
        "peak_activation_bytes": float(features.peak_activation_bytes),
        "op_counts": {str(k): int(v) for k, v in features.op_counts.items()},
    }


def _default_exporter(name: str, batch_size: int, path: Path, *, training: bool,
                      dynamic_batch: bool, torch_model: TorchModelSpec | None = None) -> Path:
    if torch_model is None:
        from predictor.zoo import export_onnx

        return export_onnx(name, batch_size, path, training=training,
                           dynamic_batch=dynamic_batch)  # fmt: skip
    from predictor.profiling.usermodels import build_module, example_input
    from predictor.zoo import export_module

    model = build_module(torch_model)
    doc = f"tandem user model {name} ({torch_model.factory}) batch={batch_size}"
    return export_module(model, example_input(torch_model, batch_size), path, training,
                         dynamic_batch, doc)  # fmt: skip


def _default_extractor(path: Path, batch_size: int) -> Any:
    from predictor.features import extract_features

    return extract_features(path, batch_size)


class GraphFeatureSource:
    """Exports zoo models to ONNX on CPU and extracts their features (cached).

    ``exporter`` and ``extractor`` default to the zoo's ``export_onnx`` and
    ``predictor.features.extract_features``; tests inject fakes.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        exporter: Exporter | None = None,
        extractor: Extractor | None = None,
    ):
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="tandem-profile-")
        self.workdir = Path(workdir) if workdir else Path(self._tmp.name)  # type: ignore[union-attr]
        self._exporter = exporter or _default_exporter
        self._extractor = extractor or _default_extractor
        self._exports: dict[tuple[str, str, int | None], Path] = {}
        self._cache: dict[str, dict[str, Any]] = {}
        self.fixed_batch_exports = 0
        """How many jobs needed the fixed-batch fallback (reported for diagnosis)."""

    def _export(self, job: JobSpec, batch: int | None) -> Path:
        key = (job.model, job.workload, batch)
        if key not in self._exports:
            name = f"{job.model}-{job.workload}-{batch or 'dyn'}.onnx"
            extra = {"torch_model": job.torch_model} if job.torch_model is not None else {}
            self._exports[key] = self._exporter(
                job.model, batch or 1, self.workdir / name,
                training=job.workload == "training", dynamic_batch=batch is None, **extra,
            )  # fmt: skip
        return self._exports[key]

    def _zoo_features(self, job: JobSpec) -> Any:
        try:
            features = self._extractor(self._export(job, None), job.batch_size)
        except Exception:  # a graph that will not bind a symbolic batch at all
            features = None
        if features is not None and not features.unresolved_nodes:
            return features
        # A hard-coded batch somewhere (a Reshape to a constant shape, say) leaves
        # shapes unresolved at other batch sizes: the fixed-batch graph is exact.
        self.fixed_batch_exports += 1
        return self._extractor(self._export(job, job.batch_size), job.batch_size)

    def features(self, job: JobSpec) -> dict[str, Any]:
        """Feature columns of ``job`` (raises when the graph cannot be exported or read)."""
        if job.key in self._cache:
            return self._cache[job.key]
        if job.onnx_path:
            result = feature_columns(self._extractor(Path(job.onnx_path), job.batch_size))
        else:
            result = feature_columns(self._zoo_features(job))
        self._cache[job.key] = result
        return result

    def close(self) -> None:
        """Remove the exported files."""
        if self._tmp is not None:
            self._tmp.cleanup()
