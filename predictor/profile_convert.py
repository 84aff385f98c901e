"""The profiler's ``batching.csv`` as the extender's ``profiles.files`` YAML (plan-file form).

``tandem profile`` measures ``l(b)`` per model and batch into
``training_data/<gpu>/batching.csv`` (``latency_mean_ms``, ``latency_std_ms``,
``mem_mib``); the extender, ``tandem plan`` and the inference server read
profiles as ``{model, gpu_type, table: [[b, ms], ...], memory_mib}`` entries.
This is the one conversion between the two: rows are validated as the dataset
loader validates them, latencies are planned with a margin (Nexus's
``(mean + std) * 1.15`` by default, as for vendored Nexus profiles), and each
entry is built into a :class:`BatchingProfile` before it is written, so a file
this writes always loads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from contracts.gpus import gpu_type_of
from predictor.batching import BatchingProfile
from predictor.dataset import read_table
from predictor.profiles import NEXUS_MARGIN, Margin


class ConvertError(ValueError):
    """The rows cannot be converted as asked (ambiguous rename, no rows)."""


def profile_entries(
    rows: Iterable[Mapping[str, Any]],
    *,
    gpu_type: str | None = None,
    model: str | None = None,
    margin: Margin = NEXUS_MARGIN,
) -> list[dict[str, Any]]:
    """``profiles:`` entries from validated ``batching.csv`` rows, one per (model, GPU).

    ``gpu_type`` and ``model`` rename; each is refused when the rows hold several
    GPU products or models, since one name for several profiles would lose all but one.
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((str(row["model"]), str(row["gpu_product"])), []).append(row)
    if not groups:
        raise ConvertError("no batching rows to convert")
    products = sorted({p for _, p in groups})
    models = sorted({m for m, _ in groups})
    if gpu_type is not None and len(products) > 1:
        raise ConvertError(f"--gpu-type names one GPU type, the rows hold {len(products)}: "
                           f"{', '.join(products)}")
    if model is not None and len(models) > 1:
        raise ConvertError(f"--model names one model, the rows hold {len(models)}: "
                           f"{', '.join(models)}")
    out = []
    for (name, product), group in sorted(groups.items()):
        by_batch: dict[int, Mapping[str, Any]] = {}
        for r in group:  # a batch measured twice keeps the slower (safer) row
            b = int(r["batch_size"])
            if b not in by_batch or _planned(r, margin) > _planned(by_batch[b], margin):
                by_batch[b] = r
        table = [[b, round(_planned(by_batch[b], margin), 6)] for b in sorted(by_batch)]
        entry = {
            "model": model or name,
            "gpu_type": gpu_type or gpu_type_of(product),
            "table": table,
            "memory_mib": round(max(float(r["mem_mib"]) for r in group), 3),
        }
        # Built once here so that what is written is exactly what the loaders accept.
        BatchingProfile.from_table(entry["model"], entry["gpu_type"], table, entry["memory_mib"])
        out.append(entry)
    return out


def _planned(row: Mapping[str, Any], margin: Margin) -> float:
    return margin.apply(float(row["latency_mean_ms"]), float(row["latency_std_ms"]))


def convert_file(path: Path, **kwargs: Any) -> dict[str, Any]:
    """``{"profiles": [...]}`` from one ``batching.csv`` (raises DatasetError on bad rows)."""
    return {"profiles": profile_entries(read_table(Path(path), "batching"), **kwargs)}
