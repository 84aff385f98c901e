"""GPU-utilisation model: XGBoost on graph features (Horus 4.1.1) and its baselines.

``UtilisationRegressor`` follows the scikit-learn estimator contract (``__init__``
stores hyperparameters, ``fit`` returns self, fitted attributes end in ``_``). It
regresses ``log1p(utilisation %)`` so that errors are relative, which is also what
RMSLE, Horus's metric, measures. ``kind`` picks the learner: ``xgboost`` (the
model we ship), ``ridge`` (linear on the log features), ``random_forest`` and
``hist_gb`` (scikit-learn's LightGBM-style histogram boosting), so the baselines
run through the same pipeline and the same folds.

Features: log1p of FLOPs, parameter bytes, activation bytes (sum and peak) and
batch size; a training/inference flag; counts of ``FEATURE_OPS``; one-hot GPU type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from predictor.features import FEATURE_OPS, GraphFeatures

KINDS = ("xgboost", "ridge", "random_forest", "hist_gb")
BASE_FEATURES: tuple[str, ...] = (
    "log_flops",
    "log_params_bytes",
    "log_activations_bytes",
    "log_peak_activation_bytes",
    "log_batch_size",
    "is_training",
)
OP_FEATURES: tuple[str, ...] = tuple(f"op_{op}" for op in FEATURE_OPS)


def feature_names(gpu_types: Sequence[str]) -> tuple[str, ...]:
    """Column names of the feature matrix for these GPU types (one-hot last)."""
    return BASE_FEATURES + OP_FEATURES + tuple(f"gpu={g}" for g in gpu_types)


def feature_row(
    flops: float,
    params_bytes: float,
    activations_bytes: float,
    peak_activation_bytes: float,
    batch_size: int,
    workload: str,
    op_counts: Mapping[str, int],
    gpu_type: str | None,
    gpu_types: Sequence[str],
) -> list[float]:
    """One feature vector (``gpu_type`` None or unknown gives an all-zero one-hot)."""
    row = [
        math.log1p(max(0.0, float(v)))
        for v in (flops, params_bytes, activations_bytes, peak_activation_bytes, batch_size)
    ]
    row.append(1.0 if workload == "training" else 0.0)
    row += [float(op_counts.get(op, 0)) for op in FEATURE_OPS]
    row += [1.0 if g == gpu_type else 0.0 for g in gpu_types]
    return row


def features_row(
    features: GraphFeatures, workload: str, gpu_type: str | None, gpu_types: Sequence[str]
) -> list[float]:
    """Feature vector from a GraphFeatures value."""
    return feature_row(
        features.flops,
        features.params_bytes,
        features.activations_bytes,
        features.peak_activation_bytes,
        features.batch_size,
        workload,
        features.op_counts,
        gpu_type,
        gpu_types,
    )


def rmsle(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    """Root mean squared log error, sqrt(mean((log1p(pred) - log1p(true))^2))."""
    t, p = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    if t.size == 0:
        raise ValueError("rmsle of no samples")
    return float(np.sqrt(np.mean((np.log1p(np.clip(p, 0, None)) - np.log1p(t)) ** 2)))


class UtilisationRegressor:
    """Regressor of GPU utilisation (percent) on feature rows; see module docstring."""

    _parameter_constraints: Mapping[str, Any] = {
        "kind": KINDS,
        "n_estimators": (1, 5000),
        "max_depth": (1, 32),
        "learning_rate": (1e-4, 1.0),
        "alpha": (0.0, 1e6),
        "random_state": None,
        "n_jobs": None,
    }

    def __init__(
        self,
        kind: str = "xgboost",
        n_estimators: int = 300,
        max_depth: int = 6,
        learning_rate: float = 0.05,
        alpha: float = 1.0,
        random_state: int = 0,
        n_jobs: int = 1,
    ):
        self.kind = kind
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.alpha = alpha
        self.random_state = random_state
        self.n_jobs = n_jobs

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Hyperparameters (scikit-learn contract)."""
        return {k: getattr(self, k) for k in self._parameter_constraints}

    def set_params(self, **params: Any) -> UtilisationRegressor:
        """Set hyperparameters (scikit-learn contract)."""
        for k, v in params.items():
            if k not in self._parameter_constraints:
                raise ValueError(f"unknown parameter {k!r}")
            setattr(self, k, v)
        return self

    def _validate_params(self) -> None:
        for name, bound in self._parameter_constraints.items():
            value = getattr(self, name)
            if isinstance(bound, tuple) and isinstance(bound[0], str) and value not in bound:
                raise ValueError(f"{name} must be one of {bound}, got {value!r}")
            numeric = isinstance(bound, tuple) and not isinstance(bound[0], str)
            if numeric and not bound[0] <= value <= bound[1]:
                raise ValueError(f"{name} must be within {bound}, got {value!r}")

    def _make(self) -> Any:
        if self.kind == "xgboost":
            import xgboost

            return xgboost.XGBRegressor(
                n_estimators=self.n_estimators,
                max_depth=self.max_depth,
                learning_rate=self.learning_rate,
                subsample=0.9,
                colsample_bytree=0.9,
                random_state=self.random_state,
                n_jobs=self.n_jobs,
                tree_method="hist",
            )
        if self.kind == "ridge":
            from sklearn.linear_model import Ridge
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import StandardScaler

            return make_pipeline(StandardScaler(), Ridge(alpha=self.alpha))
        if self.kind == "random_forest":
            from sklearn.ensemble import RandomForestRegressor

            return RandomForestRegressor(
                n_estimators=self.n_estimators,
                max_depth=self.max_depth,
                random_state=self.random_state,
                n_jobs=self.n_jobs,
            )
        from sklearn.ensemble import HistGradientBoostingRegressor

        return HistGradientBoostingRegressor(
            max_iter=self.n_estimators,
            max_depth=self.max_depth,
            learning_rate=self.learning_rate,
            random_state=self.random_state,
        )

    def fit(self, X: Any, y: Any) -> UtilisationRegressor:
        """Fit on rows ``X`` and utilisation percent ``y``; forgets any earlier fit."""
        self._validate_params()
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        if X.ndim != 2 or len(X) != len(y) or len(y) == 0:
            raise ValueError("X must be 2-D with one row per target value")
        if np.any(~np.isfinite(y)) or np.any(y < 0):
            raise ValueError("targets must be finite utilisation percentages >= 0")
        self.model_ = self._make().fit(X, np.log1p(y))
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: Any) -> np.ndarray:
        """Predicted utilisation percent, clipped to 0..100."""
        if not hasattr(self, "model_"):
            raise ValueError("UtilisationRegressor is not fitted")
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(f"expected {self.n_features_in_} features per row")
        return np.clip(np.expm1(self.model_.predict(X)), 0.0, 100.0)

    def save_json(self, path: Any) -> None:
        """Save an xgboost model in XGBoost's JSON format (the only kind we ship)."""
        if self.kind != "xgboost":
            raise ValueError("only the xgboost kind is saved; baselines are for comparison")
        self.model_.save_model(str(path))

    @classmethod
    def load_json(cls, path: Any, n_features: int) -> UtilisationRegressor:
        """Load an XGBoost JSON model saved by ``save_json``."""
        import xgboost

        est = cls(kind="xgboost")
        model = xgboost.XGBRegressor()
        model.load_model(str(path))
        est.model_ = model
        est.n_features_in_ = n_features
        return est
