"""PNG plots of simulation results: utilisation over time, CDFs of JCT and wait.

matplotlib is imported inside :func:`write_plots` (Agg backend, no display) so
that ``tandem --help`` and the simulator itself stay light.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from lab.simulator.metrics import SimulationResult


def write_plots(results: Mapping[str, SimulationResult], out_dir: Path,
                title: str = "") -> list[Path]:
    """Write ``utilisation.png``, ``jct_cdf.png`` and ``wait_cdf.png``; returns their paths.

    Each plot is titled with ``title`` (workload, seed, interference model) and the
    policies, so a PNG found later still says what it shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    policies = f"policy: {', '.join(results)}" if len(results) == 1 else \
        f"policies: {', '.join(results)}"
    heading = f"{title}\n{policies}" if title else policies

    fig, ax = plt.subplots(figsize=(8, 4))
    for name, r in results.items():
        if r.util_timeline:
            t = np.array([p[0] for p in r.util_timeline]) / 3600.0
            u = np.array([p[1] for p in r.util_timeline])
            ax.step(t, u, where="post", label=f"{name} (avg {r.avg_gpu_util:.1f}%)", linewidth=1)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("cluster GPU utilisation (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize="small")
    ax.set_title(heading, fontsize="medium")
    written.append(_save(fig, out_dir / "utilisation.png", plt))

    for attr, label, file in (("jct_s", "JCT: arrival to finish (s)", "jct_cdf.png"),
                              ("wait_s", "waiting time (s)", "wait_cdf.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in results.items():
            values = np.sort(np.array(getattr(r, attr)))
            if values.size:
                ax.plot(values, np.arange(1, values.size + 1) / values.size, label=name)
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of jobs")
        ax.set_xscale("symlog")
        ax.legend(fontsize="small")
        ax.set_title(heading, fontsize="medium")
        written.append(_save(fig, out_dir / file, plt))
    return written


def _save(fig: object, path: Path, plt: object) -> Path:
    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[attr-defined]
    return path
