"""PNG plots for ``evaluate`` and ``fit-curves`` (matplotlib, the optional 'plots' extra).

Each function returns the written path, or None when matplotlib is not installed,
so that training never fails for want of a plot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_predicted_vs_measured(
    path: Path, measured: Sequence[float], predicted: Sequence[float], families: Sequence[str]
) -> Path | None:
    """Scatter of held-out predictions against measurements, one colour per family."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 6))
    for family in sorted(set(families)):
        idx = [i for i, f in enumerate(families) if f == family]
        ax.scatter([measured[i] for i in idx], [predicted[i] for i in idx], s=12, label=family)
    ax.plot([0, 100], [0, 100], color="grey", linewidth=1)
    ax.set(
        xlabel="measured GPU utilisation (%)",
        ylabel="predicted, family held out (%)",
        xlim=(0, 100),
        ylim=(0, 100),
        title="XGBoost, leave-one-family-out",
    )
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_curves(
    path: Path, curves: Mapping[str, Any], rows: Iterable[Mapping[str, Any]]
) -> Path | None:
    """Measured slowdowns and the fitted curve per GPU type."""
    plt = _pyplot()
    if plt is None:
        return None
    rows = list(rows)
    fig, ax = plt.subplots(figsize=(7, 5))
    for gpu, curve in sorted(curves.items()):
        pts = [
            (float(r["cumulative_isolated_util_percent"]), float(r["slowdown"]))
            for r in rows
            if r.get("gpu_product") == gpu
            and r.get("status") == "ok"
            and r.get("slowdown") is not None
        ]
        dots = ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=8, alpha=0.5)
        # The curve is drawn only where it was fitted: beyond the data it is a guess.
        xs = [x / 2 for x in range(0, int(2 * curve.domain_percent[1]) + 1)]
        ax.plot(
            xs,
            [curve.slowdown(x) for x in xs],  # CurveFit: the curve is a cost
            label=f"{gpu} (R2 {curve.r2_below:.2f}/{curve.r2_above:.2f})",
            color=dots.get_facecolor()[0],
        )
    ax.axvline(100, color="grey", linestyle=":")
    ax.set(xlabel="cumulative isolated GPU utilisation (%)", ylabel="JCT slowdown (x)",
           title="Interference curves fitted per GPU type (measured pairs as dots)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
