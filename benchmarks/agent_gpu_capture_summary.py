"""Side-by-side summary of a real-GPU agent capture (``agent_gpu_capture.sh``).

Reads the capture directory the script wrote and prints, per GPU, what
``nvidia-smi``, the agent's report and its ``/metrics`` saw while a model ran,
with the differences and whether the load's process was attributed. Writes
``summary.json`` beside the inputs.

    python benchmarks/agent_gpu_capture_summary.py CAPTURE_DIR

Agreement is judged loosely on purpose: nvidia-smi reads utilisation once, over
its own ~1/6 s window, while the agent averages NVML samples over its interval,
so the two differ by what the load does between reads. Memory should agree to
within the few MiB the load allocates between reads.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

UTIL_TOLERANCE_POINTS = 15.0
MEMORY_TOLERANCE_MIB = 512.0


def read_smi(path: Path) -> list[dict[str, str]]:
    """Rows of an ``nvidia-smi --query-* --format=csv,nounits`` file, headers stripped."""
    rows = list(csv.reader(path.read_text().splitlines()))
    if not rows:
        return []
    head = [h.strip() for h in rows[0]]
    return [dict(zip(head, (c.strip() for c in r), strict=False)) for r in rows[1:] if r]


def metric(metrics_text: str, name: str, gpu: int) -> float | None:
    """The value of gauge ``name`` for GPU index ``gpu`` in Prometheus text format."""
    pattern = rf'^{re.escape(name)}{{[^}}]*\bgpu="{gpu}"[^}}]*}} (\S+)$'
    m = re.search(pattern, metrics_text, re.M)
    return float(m.group(1)) if m else None


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "[N/A]", "N/A") else None
    except ValueError:
        return None


def _spread(values: list[float]) -> tuple[float, float] | None:
    return (min(values), max(values)) if values else None


def _distance(value: float | None, span: tuple[float, float] | None) -> float | None:
    """How far ``value`` lies outside the interval ``span`` (0 inside it)."""
    if value is None or span is None:
        return None
    lo, hi = span
    return max(0.0, lo - value, value - hi)


def summarise(capture: Path) -> dict[str, Any]:
    """The comparison, from the files ``agent_gpu_capture.sh`` writes into ``capture``."""
    report = json.loads((capture / "report-during.json").read_text())
    metrics_path = capture / "metrics-during.txt"
    metrics = metrics_path.read_text() if metrics_path.exists() else ""
    smi_rows = [r for name in ("nvidia-smi-during.csv", "nvidia-smi-during-2.csv")
                if (capture / name).exists() for r in read_smi(capture / name)]  # fmt: skip
    apps_path = capture / "compute-apps-during.csv"
    apps = read_smi(apps_path) if apps_path.exists() else []
    load_path = capture / "load.log"
    load = load_path.read_text().splitlines() if load_path.exists() else []
    load_pid = next((int(line.split()[1]) for line in load if line.startswith("pid ")), None)

    gpus = []
    for g in report["gpus"]:
        index, uuid = g["index"], g["uuid"]
        rows = [r for r in smi_rows if r.get("index") == str(index)]
        smi_util = [v for r in rows if (v := _number(r.get("utilization.gpu [%]"))) is not None]
        smi_mem = [v for r in rows if (v := _number(r.get("memory.used [MiB]"))) is not None]
        util_span, mem_span = _spread(smi_util), _spread(smi_mem)
        util_gap = _distance(g["utilization_percent"], util_span)
        mem_gap = _distance(g["memory_used_mib"], mem_span)
        smi_pids = sorted(int(r["pid"]) for r in apps if r.get("gpu_uuid") == uuid)
        agent_pids = sorted(p["pid"] for p in g["processes"])
        gpus.append({
            "index": index, "uuid": uuid, "product": g["product"],
            "nvidia_smi_util_percent": smi_util,
            "agent_report_util_percent": g["utilization_percent"],
            "metrics_DCGM_FI_DEV_GPU_UTIL": metric(metrics, "DCGM_FI_DEV_GPU_UTIL", index),
            "util_outside_smi_range_points": util_gap,
            "nvidia_smi_memory_used_mib": smi_mem,
            "agent_report_memory_used_mib": g["memory_used_mib"],
            "metrics_DCGM_FI_DEV_FB_USED": metric(metrics, "DCGM_FI_DEV_FB_USED", index),
            "memory_outside_smi_range_mib": mem_gap,
            "nvidia_smi_compute_pids": smi_pids,
            "agent_processes": g["processes"],
            "agent_pids_match_nvidia_smi": agent_pids == smi_pids,
            "agrees": (util_gap is not None and util_gap <= UTIL_TOLERANCE_POINTS
                       and mem_gap is not None and mem_gap <= MEMORY_TOLERANCE_MIB
                       and agent_pids == smi_pids),
        })  # fmt: skip
    loaded = [g for g in gpus if load_pid is not None and load_pid in
              [p["pid"] for p in g["agent_processes"]]]  # fmt: skip
    return {
        "gpus": gpus,
        "load": load[:3],
        "load_pid": load_pid,
        "load_attributed_to_gpu": loaded[0]["index"] if loaded else None,
        "tolerances": {"util_points": UTIL_TOLERANCE_POINTS,
                       "memory_mib": MEMORY_TOLERANCE_MIB},  # fmt: skip
        "all_agree": bool(gpus) and all(g["agrees"] for g in gpus),
    }


def main(argv: list[str] | None = None) -> int:
    """Write and print ``summary.json`` for the capture directory given."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python benchmarks/agent_gpu_capture_summary.py CAPTURE_DIR", file=sys.stderr)
        return 2
    capture = Path(args[0])
    summary = summarise(capture)
    text = json.dumps(summary, indent=2) + "\n"
    (capture / "summary.json").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
