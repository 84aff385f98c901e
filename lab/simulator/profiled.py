"""A profiling campaign's measured pairs as a truth (``tandem import-interference --profiled``).

``tandem profile run`` writes, per GPU product, each job alone (``isolated.csv``) and in
co-located combinations (``colocated.csv``, with each job's ``slowdown``: co-located over
isolated step time). Its pairs are measured interference in the form
:mod:`lab.simulator.pairwise` takes, on graph-bearing models: a truth for the simulator,
and a matrix for ``learning.pair_prior``.

- A model is named ``<model>-bs<batch>`` for training, ``<model>-bs<batch>-inference``
  for inference, as a pod's ``tandem.io/model`` would name it.
- ``slowdown[a][b]``: the geometric mean over the campaign's ok runs of ``a`` beside ``b``
  (a resumed or repeated campaign measures a pair more than once). Combinations of three
  or more are left out: the truth's rule for them is built from the pairs.
- A pair whose run ran out of memory (``status=oom``) cannot share.
- Each model's utilisation and memory alone on the GPU (``models:``), from its ok
  isolated run: NVML's utilisation over the window and the process's memory.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contracts.gpus import gpu_type_of
from contracts.interferencefile import PairTable
from lab.simulator.truth import ModelTruth


class ProfiledError(ValueError):
    """The campaign directory cannot be imported."""


def profiled_model_name(row: Mapping[str, Any]) -> str:
    """``resnet50``, training, batch 32 -> ``resnet50-bs32``."""
    suffix = "" if row["workload"] == "training" else f"-{row['workload']}"
    return f"{row['model']}-bs{row['batch_size']}{suffix}"


def import_profiled(directory: Path) -> tuple[str, PairTable, dict[str, ModelTruth]]:
    """The GPU type, its pair table and its models' truths from one campaign directory."""
    from predictor.dataset import DatasetError, load_gpu_dir

    try:
        data = load_gpu_dir(directory)
    except (DatasetError, OSError) as exc:
        raise ProfiledError(str(exc)) from None
    products = {r["gpu_product"] for r in data.isolated}
    if len(products) != 1:
        raise ProfiledError(f"{directory}: expected one GPU product, found {sorted(products)}")
    gpu_type = gpu_type_of(products.pop())
    models = {profiled_model_name(r): ModelTruth(
        util_percent={gpu_type: round(r["util_mean_percent"], 2)},
        mem_mib={gpu_type: round(r["mem_used_nvml_mib"], 1)})
        for r in data.isolated if r["status"] == "ok"}  # fmt: skip
    combos: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for row in data.colocated:
        if row["n_jobs"] == 2:
            combos[(row["combo_id"], row["run_id"])].append(row)
    logs: dict[tuple[str, str], list[float]] = defaultdict(list)
    cannot: set[frozenset[str]] = set()
    for rows in combos.values():
        if len(rows) != 2:
            continue
        names = [profiled_model_name(r) for r in rows]
        if any(r["status"] == "oom" for r in rows):
            cannot.add(frozenset(names))
        elif all(r["status"] == "ok" and r["slowdown"] for r in rows):
            for (a, row), b in zip(zip(names, rows, strict=True), reversed(names), strict=True):
                logs[(a, b)].append(math.log(row["slowdown"]))
    if not logs and not cannot:
        raise ProfiledError(f"{directory}: no co-located pair was measured (colocated.csv)")
    slowdown: dict[str, dict[str, float]] = {}
    for (a, b), values in sorted(logs.items()):
        slowdown.setdefault(a, {})[b] = round(math.exp(sum(values) / len(values)), 4)
    return gpu_type, PairTable(slowdown, frozenset(cannot)), models
