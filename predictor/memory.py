"""GPU memory estimate: Horus Eq. 2 for training, its analogue for inference.

Horus writes ``GMem_j = (B*A + P) + B*G + delta``: activations of the batch, the
parameters, gradients, and an initialisation overhead ``delta``. Here, from graph
features at batch ``B`` (activation bytes are already for the whole batch):

- training:  weights P + gradients P + optimizer state (slots x P) + every
  activation kept for the backward pass (``activations_bytes``) + overhead
- inference: weights P + peak live activations (``peak_activation_bytes``) + overhead

Gradients are parameter-sized (frameworks accumulate one gradient per weight, not
per sample), which is how ``B*G`` is read here. The overhead (CUDA context,
allocator pools, workspace) is *fitted* from profiling rows per (framework,
workload) with ``fit_overhead``; when no fitted value exists the estimate carries
``overhead_source="none"`` and excludes it, and callers must say so.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from predictor.features import GraphFeatures

MIB = 1 << 20
OPTIMIZER_SLOTS: Mapping[str, int] = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
"""Per-parameter optimizer state tensors (Adam keeps first and second moments)."""


@dataclass(frozen=True)
class Overhead:
    """Fitted framework overhead for one (framework, workload)."""

    framework: str
    workload: str
    overhead_mib: float
    n_rows: int
    mae_mib: float
    """Mean absolute error of the estimate on the rows it was fitted on."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory components in MiB; ``overhead_source`` is ``fitted`` or ``none``."""

    weights_mib: float
    gradients_mib: float
    optimizer_mib: float
    activations_mib: float
    overhead_mib: float
    total_mib: float
    overhead_source: str


def estimate_memory(
    features: GraphFeatures,
    workload: str,
    overhead: Overhead | None = None,
    optimizer: str = "adam",
) -> MemoryEstimate:
    """Eq. 2 (training) or weights + peak activations (inference), in MiB."""
    if workload not in ("training", "inference"):
        raise ValueError(f"workload must be training or inference, got {workload!r}")
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_SLOTS)}")
    weights = features.params_bytes / MIB
    if workload == "training":
        grads = weights
        opt = OPTIMIZER_SLOTS[optimizer] * weights
        acts = features.activations_bytes / MIB
    else:
        grads = opt = 0.0
        acts = features.peak_activation_bytes / MIB
    extra = overhead.overhead_mib if overhead is not None else 0.0
    total = weights + grads + opt + acts + extra
    source = "fitted" if overhead is not None else "none"
    return MemoryEstimate(weights, grads, opt, acts, extra, total, source)


def fit_overhead(rows: Iterable[Mapping[str, Any]], optimizer: str = "adam") -> list[Overhead]:
    """Fit the overhead per (framework, workload) from ok isolated rows.

    The overhead is the median of (measured NVML memory - estimate without
    overhead): the median because a few runs with allocator fragmentation should
    not move it. Rows need params/activation bytes and ``mem_used_nvml_mib``.
    """
    residuals: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row.get("status") != "ok" or row.get("mem_used_nvml_mib") is None:
            continue
        feats = GraphFeatures(
            flops=0,
            params_bytes=int(row["params_bytes"]),
            activations_bytes=int(row["activations_bytes"]),
            peak_activation_bytes=int(row["peak_activation_bytes"]),
            batch_size=int(row["batch_size"]),
            op_counts={},
        )
        base = estimate_memory(feats, row["workload"], None, optimizer).total_mib
        key = (str(row["framework"]), str(row["workload"]))
        residuals.setdefault(key, []).append(float(row["mem_used_nvml_mib"]) - base)
    out = []
    for (framework, workload), values in sorted(residuals.items()):
        delta = max(0.0, statistics.median(values))
        mae = statistics.fmean(abs(v - delta) for v in values)
        out.append(Overhead(framework, workload, delta, len(values), mae))
    return out


def save_overheads(path: Path, overheads: Iterable[Overhead], meta: Mapping[str, Any]) -> Path:
    """Write fitted overheads as JSON ``{"meta": ..., "overheads": [...]}``."""
    payload = {"meta": dict(meta), "overheads": [asdict(o) for o in overheads]}
    Path(path).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return Path(path)


def load_overheads(path: Path) -> dict[tuple[str, str], Overhead]:
    """Read overheads written by ``save_overheads``, keyed by (framework, workload)."""
    payload = json.loads(Path(path).read_text(encoding="utf-8"))
    out = {}
    for item in payload["overheads"]:
        o = Overhead(**item)
        out[(o.framework, o.workload)] = o
    return out
