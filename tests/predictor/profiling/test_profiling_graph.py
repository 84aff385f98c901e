"""GraphFeatureSource: one dynamic-batch export per (model, workload), fixed-batch fallback.

The exporter and extractor are injected fakes that record their calls, so each
case says exactly which graph the features came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from predictor.profiling.backend import JobSpec
from predictor.profiling.graph import GraphFeatureSource


@dataclass(frozen=True)
class FakeFeatures:
    flops: float
    params_bytes: float = 100.0
    activations_bytes: float = 10.0
    peak_activation_bytes: float = 5.0
    op_counts: dict[str, int] = field(default_factory=lambda: {"Conv": 2})
    unresolved_nodes: int = 0


class FakeGraphs:
    """Exports write a marker file; extraction answers per graph kind ('dyn' or 'fixed')."""

    def __init__(self, dynamic: str) -> None:
        self.dynamic = dynamic  # "ok", "unresolved" or "raises"
        self.exports: list[tuple[str, int, bool, bool]] = []
        self.reads: list[tuple[str, int]] = []

    def export(
        self, name: str, batch: int, path: Path, training: bool, dynamic_batch: bool
    ) -> Path:
        self.exports.append((name, batch, training, dynamic_batch))
        path.write_text("dyn" if dynamic_batch else "fixed")
        return path

    def extract(self, path: Path, batch: int) -> Any:
        kind = Path(path).read_text()
        self.reads.append((kind, batch))
        if kind == "dyn" and self.dynamic == "raises":
            raise ValueError("cannot bind batch")
        unresolved = 3 if kind == "dyn" and self.dynamic == "unresolved" else 0
        # fixed graphs report 1000 FLOPs per sample, dynamic ones 999, to tell them apart
        return FakeFeatures(
            (999.0 if kind == "dyn" else 1000.0) * batch, unresolved_nodes=unresolved
        )


@pytest.mark.parametrize(
    ("dynamic", "want_flops_per_sample", "want_fixed_exports"),
    [("ok", 999.0, 0), ("unresolved", 1000.0, 2), ("raises", 1000.0, 2)],
    ids=["dynamic-resolves", "dynamic-unresolved-falls-back", "dynamic-raises-falls-back"],
)
def test_features_fall_back_to_a_fixed_batch_export(
    tmp_path: Path, dynamic: str, want_flops_per_sample: float, want_fixed_exports: int
) -> None:
    fake = FakeGraphs(dynamic)
    source = GraphFeatureSource(tmp_path, exporter=fake.export, extractor=fake.extract)
    jobs = [JobSpec("resnet18", "resnet", "training", b) for b in (4, 16)]
    got = [source.features(j) for j in jobs]
    assert [g["flops"] for g in got] == [want_flops_per_sample * b for b in (4, 16)]
    assert got[0]["op_counts"] == {"Conv": 2}
    dyn = [e for e in fake.exports if e[3]]
    fixed = [e for e in fake.exports if not e[3]]
    assert dyn == [("resnet18", 1, True, True)]  # exported once, whatever the batch
    assert [(e[1], e[2]) for e in fixed] == [(4, True), (16, True)][:want_fixed_exports]
    assert source.fixed_batch_exports == want_fixed_exports
    source.features(jobs[0])  # cached: no new export or read
    assert len(fake.reads) == (2 if dynamic == "ok" else 4)


def test_unresolved_fixed_graph_is_still_used_rather_than_failing(tmp_path: Path) -> None:
    class AlwaysUnresolved(FakeGraphs):
        def extract(self, path: Path, batch: int) -> Any:
            return FakeFeatures(7.0 * batch, unresolved_nodes=1)

    fake = AlwaysUnresolved("unresolved")
    source = GraphFeatureSource(tmp_path, exporter=fake.export, extractor=fake.extract)
    assert source.features(JobSpec("mlp", "mlp", "inference", 2))["flops"] == 14.0
    assert [e[3] for e in fake.exports] == [True, False]


def test_user_onnx_is_read_as_is_without_export(tmp_path: Path) -> None:
    model = tmp_path / "mine.onnx"
    model.write_text("fixed")
    fake = FakeGraphs("ok")
    source = GraphFeatureSource(tmp_path, exporter=fake.export, extractor=fake.extract)
    job = JobSpec("mine", "custom", "inference", 8, str(model))
    assert source.features(job)["flops"] == 8000.0
    assert fake.exports == [] and fake.reads == [("fixed", 8)]
