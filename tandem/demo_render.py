"""Text rendering of ``tandem demo``'s result document, for a first-time reader.

Sections: what is real and what is simulated, the placements in arrival order,
the GPUs, the rejected pods with the reasons kube-scheduler would show, and one
closing line with the timings. Everything but that last line is a function of
the result's decisions, so the text is deterministic given the seed. Every line
fits 80 columns: long decisions, reasons and pod lists wrap onto indented lines.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from typing import Any

KINDS = (
    "  kinds:      training     a self-managed job, placed by the Horus interference",
    "                           cost; it shares a busy GPU only where that gets more",
    "                           work done than waiting for one",
    "              slo          an inference session with a latency SLO: a duty-cycle",
    "                           slot",
    "              best-effort  inference without an SLO: shares the idle part of the",
    "                           duty cycle by weight or priority, never on a training",
    "                           GPU",
)


WIDTH = 80
"""Every line fits a terminal of this width; long text wraps, never cut."""
INDENT = " " * 18  # where a row's second line (decision, pods) starts


def _wrap(text: str, indent: str = INDENT, first: str | None = None) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent if first is None else first,
                         subsequent_indent=indent, break_on_hyphens=False) or [indent]


def short_product(product: str) -> str:
    """``NVIDIA-A100-SXM4-40GB`` -> ``A100-SXM4-40GB`` (the vendor is always NVIDIA here)."""
    return product.removeprefix("NVIDIA-").removeprefix("NVIDIA ")


def short_reason(reason: str) -> str:
    """The main node reason without node and GPU counts: of the first group's parts, the
    one that holds on the most GPUs."""
    first = reason.split(" | ", 1)[0]
    text = first.split(": ", 1)[1] if " node(s): " in first else first

    def gpus(part: str) -> int:
        found = re.search(r" on (\d+)/\d+ GPUs$", part)
        return int(found.group(1)) if found else 0

    parts = text.split("; ")
    main = max(parts, key=lambda part: (gpus(part), -parts.index(part)))
    # "<reason> on 3/4 GPUs": the counts differ per node, the reason is what a reader needs
    return main.rsplit(" on ", 1)[0] if main.endswith(" GPUs") else main


def _decision(p: dict[str, Any], sharing: list[str]) -> str:
    if p["kind"] == "slo":
        return f"batch {p['batch']} in a {float(p['duty_cycle_ms']):.1f} ms duty cycle"
    if p["kind"] == "best-effort":
        share = f"priority {p['priority']}" if p.get("priority") is not None \
            else f"weight {p.get('weight') or 1}"
        return f"{share}, slack share {100.0 * (1.0 - p['cost']):.0f}% of the GPU"
    source = p.get("source") or "asserted"
    util_from = "" if source == "asserted" else f", util {source.split('+mem:', 1)[0]}"
    decision = f"cost {p['cost']:.3f}, best of {p['candidates']} node(s){util_from}"
    if sharing:
        return (f"shares the GPU with {', '.join(sharing)}: together they do more work "
                f"than one after the other ({decision})")
    return decision


def header(result: dict[str, Any]) -> list[str]:
    """What is real and what is simulated."""
    s = result["summary"]
    types = Counter(short_product(g["product"]) for g in s["gpus"])
    mix = ", ".join(f"{n}x {t}" for t, n in sorted(types.items()))
    agents = f"node agents reporting GPU load after every bind (seed {s['seed']})" \
        if result["agents"] else "no node agents (agent package not installed)"
    simulated = f"{s['nodes_total']} nodes with {s['gpus_total']} GPUs ({mix}), {agents}, " \
        f"and a stream of {len(result['placements'])} pods"
    return [
        "tandem demo",
        "  real:       the tandem extender (filter, prioritize, bind, agent reports)",
        "              served by cheroot and called over loopback HTTP the way",
        "              kube-scheduler calls it, running the same decision code as in",
        "              a cluster",
        *_wrap(simulated, " " * 14, "  simulated:  "),
        "  not needed: Kubernetes, a GPU",
        *KINDS,
    ]


def placement_table(result: dict[str, Any]) -> list[str]:
    """One row per pod in arrival order, its decision (or full reason) below it."""
    head = f"{'pod':<17} {'kind':<12} {'GPUs':>4}  {'node/GPU':<18} {'util%':>6} {'mem MiB':>9}"
    lines = ["Placements, in arrival order (util and memory are tandem's predictions)", head,
             "-" * len(head)]
    on_gpu: dict[tuple[str, str], list[str]] = {}
    for p in result["placements"]:
        left = f"{p['pod']:<17} {p['kind']:<12} {p['gpus_requested']:>4}  "
        if p["outcome"] == "placed":
            where = f"{p['node']}/{p['gpu_index']}"
            lines.append(f"{left}{where:<18} {p['predicted_util_percent']:>6.1f} "
                         f"{p['predicted_mem_mib']:>9.0f}")
            gpus = [(p["node"], i) for i in str(p["gpu_index"]).split(",")]
            sharing = sorted({n for g in gpus for n in on_gpu.get(g, [])})
            lines += _wrap(_decision(p, sharing if p["kind"] == "training" else []))
            for g in gpus:
                on_gpu.setdefault(g, []).append(p["pod"])
        else:
            word = "REJECTED" if p["outcome"] == "rejected" else "BIND FAILED"
            lines.append(f"{left}{'-':<18} {'-':>6} {'-':>9}")
            lines += _wrap(f"{word}: {p.get('cause') or short_reason(p['reason'])}")
    return lines


def gpu_table(result: dict[str, Any]) -> list[str]:
    """One row per GPU: type, role, predicted vs observed utilisation, memory; pods below."""
    s = result["summary"]
    head = f"{'node/GPU':<17} {'type':<17} {'role':<8} {'pred%':>6} {'obs%':>6} " \
           f"{'MiB reserved':>13}"
    lines = [f"GPUs: {s['gpus_used']} of {s['gpus_total']} in use (pred: the predictions "
             "placed there, summed;", "obs: the simulated agent's report)", head,
             "-" * len(head)]
    for g in s["gpus"]:
        obs = "-" if g["observed_util_percent"] is None else f"{g['observed_util_percent']:.1f}"
        memory = f"{g['reserved_mib']}/{g['memory_mib']:.0f}"
        lines.append(f"{g['node'] + '/' + str(g['index']):<17} "
                     f"{short_product(g['product']):<17} {g['role']:<8} "
                     f"{g['predicted_util_percent']:>6.1f} {obs:>6} {memory:>13}")
        lines += _wrap(", ".join(g["pods"]) or "-")
    return lines


def rejected_section(result: dict[str, Any]) -> list[str]:
    """Every rejected pod with its full reasons, one node group a line."""
    rejected = result["summary"]["rejected"]
    if not rejected:
        return ["No pod was rejected."]
    lines = ["Rejected pods: kube-scheduler keeps them Pending and puts these reasons",
             "in their events"]
    for r in rejected:
        lines.append(f"  {r['pod']}")
        for part in r["reason"].split(" | "):
            lines += _wrap(part, " " * 6, "    ")
    return lines


def closing(result: dict[str, Any]) -> str:
    """Counts and timings (the only lines that change from run to run)."""
    s, t = result["summary"], result["summary"]["timings"]
    return "\n".join(_wrap(
        f"Placed {s['pods_placed']} of {len(result['placements'])} pods on "
        f"{s['gpus_used']} of {s['gpus_total']} GPUs in {result['elapsed_seconds']:.2f} s "
        f"(server start {t['server_start_seconds']:.2f} s; scheduling cycle "
        f"filter+prioritize+bind over HTTP: mean {t['cycle_ms_mean']:.1f} ms, "
        f"max {t['cycle_ms_max']:.1f} ms)", "", ""))


def render(result: dict[str, Any]) -> str:
    """The whole text report."""
    blocks = [header(result), placement_table(result), gpu_table(result),
              rejected_section(result), [closing(result)]]
    return "\n\n".join("\n".join(block) for block in blocks)
