"""Training pipeline: training_data/ -> table -> grouped CV (whole families held out) ->
XGBoost JSON + model card + fitted memory overhead.

Artifacts directory layout (``save_artifacts``/``load_artifacts``):

- ``utilisation.xgb.json``: the XGBoost model (XGBoost's own JSON format).
- ``model_card.json``: feature names, GPU types, data digest (sha256 over the CSV
  files), ``n_rows_by_source`` (``profiled`` rows from ``isolated.csv``,
  ``observed`` rows from the fleet's ``observed.csv``) and
  ``observed_rows_skipped`` (fleet rows whose model features were not found),
  provenance summary, per-learner RMSLE overall and per held-out family,
  library versions, the sha256 of the model file (``model_digest``) and
  ``simulated``: true when any training directory was synthetic (``sim:``), in
  which case every prediction's source says ``,simulated`` too.
- ``memory_overhead.json``: ``predictor.memory`` overheads per (framework, workload).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from predictor.dataset import GpuDataset, any_simulated
from predictor.dataset_schema import DATA_FILES
from predictor.errors import NoTrainedModel
from predictor.memory import Overhead, fit_overhead, load_overheads, save_overheads
from predictor.model import KINDS, UtilisationRegressor, feature_names, feature_row, rmsle
from predictor.observed import Featurise, observed_training_rows

MODEL_FILE = "utilisation.xgb.json"
CARD_FILE = "model_card.json"
OVERHEAD_FILE = "memory_overhead.json"


@dataclass(frozen=True)
class TrainingTable:
    """Feature matrix, targets and grouping of the ok isolated rows."""

    X: np.ndarray
    y: np.ndarray
    families: tuple[str, ...]
    models: tuple[str, ...]
    gpu_types: tuple[str, ...]
    feature_names: tuple[str, ...]
    data_digest: str
    rows: tuple[dict[str, Any], ...]
    simulated: bool = False
    """True when any row came from a directory marked simulated."""
    sources: tuple[str, ...] = ()
    """Per row: ``profiled`` (isolated.csv) or ``observed`` (observed.csv)."""
    observed_skipped: int = 0
    """Observed rows left out because their model's graph features were not found."""


def data_digest(datasets: Sequence[GpuDataset]) -> str:
    """sha256 over every table file and provenance of the datasets, in name order."""
    h = hashlib.sha256()
    for ds in sorted(datasets, key=lambda d: d.gpu_product):
        for name in sorted([*DATA_FILES, "provenance.json"]):
            path = ds.path / name
            if path.is_file():
                h.update(f"{ds.gpu_product}/{name}\n".encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def build_table(
    datasets: Sequence[GpuDataset], observed: bool = True, featurise: Featurise | None = None
) -> TrainingTable:
    """Rows with status ok and a measured utilisation, across all GPU products, then
    (``observed``) the fleet's observed rows (:func:`predictor.observed.observed_training_rows`)."""
    rows = [
        r
        for ds in datasets
        for r in ds.isolated
        if r["status"] == "ok" and r["util_mean_percent"] is not None
    ]
    sources = ["profiled"] * len(rows)
    skipped = 0
    if observed:
        fleet, skipped = observed_training_rows(datasets, featurise)
        rows += fleet
        sources += ["observed"] * len(fleet)
    if not rows:
        raise NoTrainedModel("utilisation model", "no ok isolated rows to train on")
    gpu_types = tuple(sorted({r["gpu_product"] for r in rows}))
    X = np.array(
        [
            feature_row(
                r["flops"],
                r["params_bytes"],
                r["activations_bytes"],
                r["peak_activation_bytes"],
                r["batch_size"],
                r["workload"],
                r["op_counts"],
                r["gpu_product"],
                gpu_types,
            )
            for r in rows
        ]
    )
    y = np.array([float(r["util_mean_percent"]) for r in rows])
    return TrainingTable(
        X,
        y,
        tuple(r["family"] for r in rows),
        tuple(r["model"] for r in rows),
        gpu_types,
        feature_names(gpu_types),
        data_digest(datasets),
        tuple(rows),
        any_simulated(datasets),
        tuple(sources),
        skipped,
    )


def cross_validate(
    table: TrainingTable,
    kinds: Iterable[str] = KINDS,
    params: dict[str, Any] | None = None,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda it: it,
) -> dict[str, Any]:
    """Leave-one-family-out CV per learner: RMSLE overall (pooled) and per family."""
    families = sorted(set(table.families))
    if len(families) < 2:
        raise ValueError("grouped cross-validation needs at least two model families")
    groups = np.array(table.families)
    results: dict[str, Any] = {}
    jobs = [(k, f) for k in kinds for f in families]
    preds: dict[str, np.ndarray] = {k: np.zeros_like(table.y) for k in kinds}
    for kind, family in progress(jobs):
        test = groups == family
        est = UtilisationRegressor(kind=kind, **(params or {})).fit(table.X[~test], table.y[~test])
        preds[kind][test] = est.predict(table.X[test])
    for kind in kinds:
        per_family = {f: rmsle(table.y[groups == f], preds[kind][groups == f]) for f in families}
        results[kind] = {"rmsle": rmsle(table.y, preds[kind]), "rmsle_per_family": per_family}
    results["_predictions"] = {k: v.tolist() for k, v in preds.items()}
    return results


def train(
    table: TrainingTable,
    cv: dict[str, Any] | None,
    params: dict[str, Any] | None = None,
) -> tuple[UtilisationRegressor, dict[str, Any]]:
    """Fit the shipped XGBoost model on every row and write its model card (a dict)."""
    import sklearn
    import xgboost

    est = UtilisationRegressor(kind="xgboost", **(params or {})).fit(table.X, table.y)
    metrics = {k: v for k, v in (cv or {}).items() if not k.startswith("_")}
    card = {
        "format": "tandem.utilisation-model/v1",
        "target": "util_mean_percent",
        "target_transform": "log1p",
        "feature_names": list(table.feature_names),
        "gpu_types": list(table.gpu_types),
        "families": sorted(set(table.families)),
        "n_rows": int(len(table.y)),
        "n_rows_by_source": {s: table.sources.count(s) for s in ("profiled", "observed")},
        "observed_rows_skipped": table.observed_skipped,
        "data_digest": table.data_digest,
        "simulated": table.simulated,
        "hyperparameters": est.get_params(),
        "cv": "leave-one-family-out",
        "metrics": metrics,
        "versions": {
            "xgboost": xgboost.__version__,
            "scikit-learn": sklearn.__version__,
            "numpy": np.__version__,
            "tandem": _tandem_version(),
        },
        "trained_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    return est, card


def _tandem_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tandem")
    except PackageNotFoundError:
        return "unknown"


def save_artifacts(
    directory: Path,
    est: UtilisationRegressor,
    card: dict[str, Any],
    overheads: Iterable[Overhead],
    provenance: Sequence[dict[str, Any]] = (),
) -> Path:
    """Write model, card (with the model's digest) and overheads into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    est.save_json(directory / MODEL_FILE)
    card = dict(
        card,
        model_digest=hashlib.sha256((directory / MODEL_FILE).read_bytes()).hexdigest(),
        provenance=list(provenance),
    )
    (directory / CARD_FILE).write_text(
        json.dumps(card, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    meta = {"data_digest": card["data_digest"], "simulated": bool(card.get("simulated", False))}
    save_overheads(directory / OVERHEAD_FILE, overheads, meta)
    return directory


@dataclass(frozen=True)
class TrainedArtifacts:
    """A loaded utilisation model with its card and memory overheads."""

    model: UtilisationRegressor
    card: dict[str, Any]
    overheads: dict[tuple[str, str], Overhead]

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """GPU types the model was trained on (its one-hot columns)."""
        return tuple(self.card["gpu_types"])

    @property
    def simulated(self) -> bool:
        """Whether the model was trained on synthetic (``sim:``) rows."""
        return self.card.get("simulated") is True

    @property
    def source(self) -> str:
        """``xgboost:<first 12 hex of the model digest>``, plus ``,simulated`` if synthetic."""
        tag = ",simulated" if self.simulated else ""
        return f"xgboost:{self.card['model_digest'][:12]}{tag}"


def load_artifacts(directory: Path) -> TrainedArtifacts:
    """Load artifacts; NoTrainedModel when absent, ValueError when the digest mismatches."""
    directory = Path(directory)
    model_path, card_path = directory / MODEL_FILE, directory / CARD_FILE
    if not model_path.is_file() or not card_path.is_file():
        raise NoTrainedModel(
            "utilisation model",
            f"{directory} has no {MODEL_FILE}/{CARD_FILE} (run `tandem predictor train`)",
        )
    card = json.loads(card_path.read_text(encoding="utf-8"))
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
    if card.get("model_digest") != digest:
        raise ValueError(f"{model_path}: digest does not match {CARD_FILE} (model replaced?)")
    model = UtilisationRegressor.load_json(model_path, len(card["feature_names"]))
    overhead_path = directory / OVERHEAD_FILE
    overheads = load_overheads(overhead_path) if overhead_path.is_file() else {}
    return TrainedArtifacts(model, card, overheads)


def fit_all(
    datasets: Sequence[GpuDataset],
    kinds: Iterable[str] = KINDS,
    params: dict[str, Any] | None = None,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda it: it,
    observed: bool = True,
    featurise: Featurise | None = None,
) -> tuple[UtilisationRegressor, dict[str, Any], list[Overhead], dict[str, Any]]:
    """Table, grouped CV of every learner, final XGBoost fit and overheads in one call."""
    table = build_table(datasets, observed, featurise)
    cv = cross_validate(table, kinds, params, progress)
    est, card = train(table, cv, params)
    overheads = fit_overhead([r for ds in datasets for r in ds.isolated])
    card["memory_overheads"] = [o.__dict__ for o in overheads]
    return est, card, overheads, {"table": table, "cv": cv}
