"""A small pair-profiling campaign on a simulated GPU type, imported as the product imports one.

Before jobs arrive, an admin can measure a few pairs of the cluster's own GPU type
(``tandem profile run`` with pairs) and hand them to the extender as its measured matrix
(``tandem import-interference --profiled DIR -o prior.yaml``, then ``learning.pair_prior:
prior.yaml``). This module runs that campaign against a simulator truth, then goes through
the same import and config loading:

- **Which pairs**: every model is measured beside ``k`` partners, chosen by a seeded rule
  that never reads the truth's figures (:func:`campaign_pairs`): the models in a seeded
  random order on a ring, each beside its ring neighbours at offsets ``1 .. k // 2`` and,
  for odd ``k``, the model opposite; ``n k / 2`` pairs in all, every model reached from
  every other (the completion then links them all).
- **What a run measures**: each job's slowdown beside its partner, the truth's times
  lognormal noise (:data:`lab.simulator.signal.PROGRESS_NOISE_SD` on the log, the H100
  retest's per-measurement spread), once; a pair that cannot share runs out of memory.
- **What it writes**: ``isolated.csv`` (one ok row per model: the product import needs
  the GPU product and the models alone), ``colocated.csv`` (two rows per pair) and a
  provenance marked ``"simulated": true`` (nothing here is a measurement), in the
  schema of :mod:`predictor.dataset_schema`.
- **Import**: :func:`lab.simulator.commands.import_interference_command` (``tandem
  import-interference --profiled``) writes the truth YAML, and :func:`load_config` reads it
  as ``learning.pair_prior``, as the extender would.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import typer
import yaml

from contracts.interferencefile import PairTable
from extender.config.sections import LearningConfig
from lab.simulator.signal import PROGRESS_NOISE_SD

WINDOW_SECONDS = 3.0
"""A run's GPU time in the committed H100 pair campaign (``hopper-pairs.yaml``: 1 s
warm-up, 2 s measured): what :attr:`Campaign.gpu_seconds` charges per run."""


@dataclass(frozen=True)
class Campaign:
    """The pairs a campaign measured and what it cost."""

    pairs: tuple[tuple[str, str], ...]
    runs: int
    """Runs on the GPU: each model alone (the slowdown's denominator) and each pair."""

    @property
    def gpu_seconds(self) -> float:
        """GPU time at :data:`WINDOW_SECONDS` a run."""
        return self.runs * WINDOW_SECONDS


def campaign_pairs(models: Sequence[str], k: int, seed: Any) -> list[tuple[str, str]]:
    """The unordered pairs a campaign of ``k`` partners per model measures (module
    docstring): a seeded ring, never the truth's figures."""
    n = len(models)
    if not 1 <= k < n:
        raise ValueError(f"k must be within 1..{n - 1}, got {k}")
    ring = [models[i] for i in np.random.default_rng(seed).permutation(n)]
    offsets = list(range(1, k // 2 + 1)) + ([n // 2] if k % 2 else [])
    out = {frozenset((ring[i], ring[(i + d) % n])) for i in range(n) for d in offsets}
    return sorted(tuple(sorted(p)) for p in out if len(p) == 2)  # type: ignore[misc]


def _split(name: str) -> tuple[str, int]:
    """``ResNet-50-bs64`` -> (``ResNet-50``, 64): the profiled row naming that model; a
    name without a batch size (Gavel's ``A3C``) is profiled at batch 1 (:func:`renamed`)."""
    match = re.fullmatch(r"(.+)-bs(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else (name, 1)


def renamed(table: PairTable, names: Sequence[str]) -> PairTable:
    """``table`` as imported, its models named as the pods of ``names`` name them (a model
    profiled at batch 1 for want of a batch size reads ``<model>-bs1`` in the import)."""
    back = {f"{m}-bs1": m for m in names if not re.fullmatch(r".+-bs\d+", m)}
    def name(m: str) -> str:
        return back.get(m, m)
    return PairTable({name(a): {name(b): v for b, v in row.items()}
                      for a, row in table.slowdown.items()},
                     frozenset(frozenset(name(m) for m in p) for p in table.cannot_share))


_NO_GRAPH: dict[str, Any] = {
    "driver_version": "-", "cuda_version": "-", "framework": "simulated",
    "framework_version": "-", "flops": 0, "params_bytes": 0, "activations_bytes": 0,
    "peak_activation_bytes": 0, "op_counts": {}}
"""An isolated row's fields the import does not read (no graph: a simulated model)."""


def _row(product: str, name: str, run_id: str, **values: Any) -> dict[str, Any]:
    model, batch = _split(name)
    return {"run_id": run_id, "timestamp": 0, "gpu_product": product, "model": model,
            "family": model, "workload": "training", "batch_size": batch, "error": "",
            **values}


def write_campaign(directory: Path, product: str, table: PairTable, pairs: Sequence[
        tuple[str, str]], alone: Mapping[str, tuple[float, float]], seed: Any) -> None:
    """The campaign's tables as ``tandem profile run`` writes them: ``alone`` gives each
    model's utilisation (percent) and memory (MiB) alone; ``table`` is the truth."""
    from predictor.dataset import write_csv

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    isolated = [_row(product, m, f"alone-{i}", status="ok", **_NO_GRAPH, util_mean_percent=u,
                     util_p50_percent=u, util_p90_percent=u, mem_used_nvml_mib=mem,
                     mem_peak_framework_mib=mem, step_time_ms=100.0, throughput_per_s=10.0,
                     n_samples=20)
                for i, (m, (u, mem)) in enumerate(sorted(alone.items()))]
    colocated = []
    for i, (a, b) in enumerate(pairs):
        cannot = frozenset((a, b)) in table.cannot_share
        for j, (me, other) in enumerate(((a, b), (b, a))):
            common = {"combo_id": f"pair-{i}", "n_jobs": 2, "job_index": j,
                      "isolated_util_percent": alone[me][0],
                      "cumulative_isolated_util_percent": alone[a][0] + alone[b][0]}
            if cannot:
                colocated.append(_row(product, me, f"pair-{i}", status="oom", **common))
                continue
            slowdown = table.slowdown[me][other] * math.exp(rng.normal(0.0, PROGRESS_NOISE_SD))
            colocated.append(_row(
                product, me, f"pair-{i}", status="ok", **common, isolated_step_time_ms=100.0,
                step_time_ms=100.0 * slowdown, slowdown=slowdown,
                util_mean_percent=min(100.0, alone[a][0] + alone[b][0]),
                mem_used_nvml_mib=alone[me][1]))
    write_csv(directory / "isolated.csv", "isolated", isolated)
    write_csv(directory / "colocated.csv", "colocated", colocated)
    hardware = {"gpu_product": product, "driver_version": "-", "cuda_version": "-", "cpu": "-"}
    (directory / "provenance.json").write_text(json.dumps({
        "command": "lab.simulator.pair_campaign (simulated from a truth)", "tandem_version": "-",
        "started_at": "-", "finished_at": "-", "hardware": hardware, "software": {},
        "notes": f"{len(pairs)} pairs, seed {seed}", "simulated": True}))


def campaign_prior(directory: Path, base: LearningConfig, names: Sequence[str],
                   side: Mapping[str, PairTable] | None = None) -> LearningConfig:
    """``base`` with the campaign in ``directory`` as ``learning.pair_prior`` (and
    ``learning.pairs`` on), through ``tandem import-interference --profiled`` and the
    config loader; ``names``: the pods' model names (:func:`renamed`); ``side``: other GPU
    types' matrices added to the same prior file."""
    from contracts.interferencefile import load_interference_file
    from extender.config.loader import load_config
    from lab.simulator.commands import import_interference_command
    from lab.simulator.truth import Truth, truth_document

    prior = directory.parent / f"{directory.name}-prior.yaml"
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the command's one-line summary
            import_interference_command(out=prior, profiled=directory)
    except typer.Exit:  # the command said why on stderr
        raise ValueError(f"{directory}: tandem import-interference --profiled failed") from None
    tables = {t: renamed(v, names) for t, v in load_interference_file(prior).items()}
    if side or tables != load_interference_file(prior):
        tables = {**(side or {}), **tables}
        prior.write_text(yaml.safe_dump(truth_document(Truth(interference=tables))))
    config = directory.parent / f"{directory.name}-config.yaml"
    config.write_text(yaml.safe_dump({"learning": {"pairs": True, "pair_prior": prior.name}}))
    learning = load_config(str(config), environ={}).learning
    return replace(base, pairs=True, pair_prior=learning.pair_prior,
                   pair_prior_tables=learning.pair_prior_tables)
