"""Draws the docs' two pictures from code: ``python docs/figures/make_figures.py``.

- ``architecture.svg``: the pieces of an install and what flows between them.
- ``placement.svg``: one run of ``tandem demo`` (seed 7), each GPU's predicted
  utilisation stacked by pod, so where tandem shares a GPU and where it does not
  can be seen. The numbers are the demo's own (``run_demo``), not drawn by hand.

matplotlib (the ``dev`` or ``plots`` extra). The SVGs carry no date, so a rerun on
an unchanged tree gives the same files.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run as a script from any directory

import matplotlib  # noqa: E402

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "tandem"  # stable element ids
from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

BOXES = {  # name: (x, y, w, h, label, colour)
    "scheduler": (0.5, 6.2, 3.4, 1.2, "kube-scheduler\n(sidecar or your own)", "#dfe7fd"),
    "extender": (5.0, 5.6, 4.6, 2.4,
                 "tandem extender\nfilter / prioritize / bind / preempt\nledger, predictor,"
                 " learning\n(leader elected)", "#cde8d4"),
    "api": (11.0, 6.2, 3.4, 1.2, "Kubernetes API\npods, nodes, records", "#eeeeee"),
    "webhook": (0.5, 3.6, 3.4, 1.2, "admission webhook\n(optional)", "#f4e4c1"),
    "agent": (5.0, 1.4, 4.6, 2.0, "node agent (per opted-in node)\nNVML, pod attribution,\n"
              "per-GPU inference servers", "#fde2cf"),
    "plugin": (11.0, 1.9, 3.4, 1.2, "tandem.io/gpu\ndevice plugin", "#fde2cf"),
    "gpus": (5.0, -0.4, 4.6, 1.0, "GPUs (shared by placement,\nNexus duty cycles, quanta)",
             "#f6d0d0"),
}
ARROWS = [  # (from, to, label)
    ("scheduler", "extender", "filter, prioritize,\nbind (mTLS)"),
    ("extender", "api", "Binding, placement\nrecords, events"),
    ("webhook", "scheduler", "schedulerName: tandem"),
    ("agent", "extender", "reports (own\npod token)"),
    ("extender", "plugin", "/v1/state"),
    ("plugin", "gpus", "the bound GPU\nat admission"),
    ("agent", "gpus", ""),
]


def _ends(start: str, end: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """Where an arrow leaves ``start`` and meets ``end``: facing sides' midpoints."""
    ax_, ay, aw, ah, _, _ = BOXES[start]
    bx, by, bw, bh, _, _ = BOXES[end]
    if ax_ + aw < bx or bx + bw < ax_:  # side by side
        left = ax_ + aw < bx
        return ((ax_ + aw if left else ax_, ay + ah / 2), (bx if left else bx + bw, by + bh / 2))
    below = ay + ah < by
    return ((ax_ + aw / 2, ay + ah if below else ay), (bx + bw / 2, by if below else by + bh))


def architecture(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 6.4))
    for x, y, w, h, label, colour in BOXES.values():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.08", fc=colour,
                                    ec="#444444"))
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=9)
    for start, end, label in ARROWS:
        (x0, y0), (x1, y1) = _ends(start, end)
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=14,
                                     shrinkA=6, shrinkB=6, color="#333333"))
        if label:
            ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.15, label, ha="center", fontsize=7.5,
                    color="#222222", bbox={"fc": "white", "ec": "none", "pad": 1})
    ax.set(xlim=(0, 15), ylim=(-0.8, 8.3), title="tandem: what an install runs and what "
           "flows between the pieces")
    ax.axis("off")
    _save(fig, path)


def placement(path: Path, seed: int = 7) -> None:
    from tandem.demo import run_demo

    result = run_demo(seed=seed)
    gpus = result["summary"]["gpus"]
    util = {p["pod"]: p["predicted_util_percent"] for p in result["placements"]
            if p["outcome"] == "placed"}
    widths = {p["pod"]: len(str(p["gpu_index"]).split(",")) for p in result["placements"]
              if p["outcome"] == "placed"}
    fig, ax = plt.subplots(figsize=(10, 6))
    labels = [f"{g['node']}/{g['index']}" for g in gpus]
    for row, g in enumerate(gpus):
        left = 0.0
        for pod in g["pods"]:
            value = util[pod]
            colour = "#7fb3d5" if g["role"] == "serving" else "#82c09a"
            ax.barh(row, value, left=left, color=colour, edgecolor="white")
            name = pod if widths[pod] == 1 else f"{pod} (x{widths[pod]})"
            ax.text(left + value / 2, row, name, ha="center", va="center", fontsize=6.5)
            left += value
    ax.axvline(100, color="grey", linestyle=":")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="predicted GPU utilisation (%), one segment per pod",
           title=f"tandem demo (seed {seed}): where {len(util)} pods went "
                 "(green: training, blue: serving)")
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


if __name__ == "__main__":
    architecture(HERE / "architecture.svg")
    placement(HERE / "placement.svg")
    print(f"wrote {HERE / 'architecture.svg'} and {HERE / 'placement.svg'}")
