"""Text rendering of ``tandem status`` (one table per node, at most 80 columns)."""

from __future__ import annotations

import textwrap
from typing import Any

WIDTH = 80
PACKING_TERMS = ("fit", "fragmentation")
HEADER = f"{'GPU':<4}{'role':<9}{'product':<19}{'reserved MiB':>12}  {'predicted':>9}  observed"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _short_product(product: str | None) -> str:
    name = (product or "?").removeprefix("NVIDIA-").removeprefix("NVIDIA ")
    return name if len(name) <= 18 else name[:17] + "~"


def _observed(gpu: dict[str, Any]) -> str:
    if gpu["observed_util"] is None:
        return "- (no fresh report)"
    return f"{_pct(gpu['observed_util'])} (agent)"


def _fold(prefix: str, items: list[str], indent: int = 5) -> list[str]:
    """``prefix`` then the items comma-separated, wrapped at 80 columns under an indent."""
    text = prefix + ", ".join(items)
    return textwrap.wrap(text, width=WIDTH, initial_indent=" " * indent,
                         subsequent_indent=" " * (indent + 2), break_on_hyphens=False)


def _pod(p: dict[str, Any]) -> str:
    flag = "" if p["state"] == "placed" else f" {p['state']}"
    pair = f"; interference {p['interference']}" if p.get("interference") else ""
    # the packing score's own terms (the others say what the Horus cost always did)
    why = f"; decided by {p['decided_by']}" if p.get("decided_by") in PACKING_TERMS else ""
    return (f"{p['pod']} {_pct(p['util_percent'])} {p['mem_mib']:.0f} MiB "
            f"[{p['source']}{pair}{why}]{flag}")


def _node(node: dict[str, Any]) -> list[str]:
    gpus = node["gpus"]
    lines = [f"node {node['name']} ({len(gpus)} GPU{'s' if len(gpus) != 1 else ''})", HEADER]
    for g in gpus:
        reserved = f"{g['reserved_mib']:.0f}/{g['memory_mib']:.0f}"
        lines.append(f"{g['index']:<4}{g['role']:<9}{_short_product(g['product']):<19}"
                     f"{reserved:>12}  {_pct(g['predicted_util']):>9}  {_observed(g)}"[:WIDTH])
        if g["pods"]:
            lines += _fold("pods: ", [_pod(p) for p in g["pods"]])
    if not gpus:
        lines.append("     no GPU inventory (no GPU labels and no agent report)")
    return lines


def render(doc: dict[str, Any]) -> str:
    """The ``tandem status`` text for a :func:`extender.ops.status.summarize` document."""
    sync = "synced" if doc["synced"] else "NOT SYNCED yet"
    head = (f"tandem status from {doc['source']}: {sync}, {doc.get('placed') or 0} placed, "
            f"{doc.get('assumed') or 0} binding")
    lines = textwrap.wrap(head, WIDTH, subsequent_indent="  ")
    lines.append("predicted: pods' figures [from tandem.io/prediction-source]; observed: agents")
    for t in doc.get("interference") or []:
        prior = f", {t['prior_pairs']} from the matrix" if t.get("prior_pairs") else ""
        inferred = f" (+{t['inferred_pairs']} from groups)" if t.get("inferred_pairs") else ""
        lines.append(f"interference learned on {t['gpu_type']}: {t['pairs']} pairs{inferred}, "
                     f"{t['profiled_models']} models profiled, {t['cannot_share']} cannot share"
                     f"{prior}"[:WIDTH])
        if t.get("progress_pairs"):
            lines.append(f"  {t['progress_pairs']} from progress ({t.get('refused_losing', 0)} "
                         "refused as losing)")
    if doc.get("redacted"):
        lines.append("pod names hidden: pass --token-file with the agent token to see them")
    for node in doc["nodes"]:
        lines += ["", *_node(node)]
    pending = doc.get("pending")
    lines.append("")
    if pending is None:
        lines.append("pending pods: use --cluster kube to list them")
    elif not pending:
        lines.append("pending pods: none")
    else:
        lines.append(f"pending pods ({len(pending)}):")
        for p in pending:
            age = f" ({p['age_s']}s ago)" if p.get("age_s") is not None else ""
            lines += textwrap.wrap(f"{p['pod']}: {p['reason']}{age}", WIDTH, initial_indent="  ",
                                   subsequent_indent="    ", break_on_hyphens=False)
    both = doc.get("both_plugins")
    if both:
        lines.append("")
        lines += textwrap.wrap(
            f"GPUs advertised by both device plugins on {len(both)} node(s): a pod asking "
            "for nvidia.com/gpu can get a GPU tandem placed pods on (docs/adoption.md):",
            WIDTH)
        lines += [f"  {b['node']}: nvidia.com/gpu {b['nvidia.com/gpu']}, "
                  f"tandem.io/gpu {b['tandem.io/gpu']}" for b in both]
    return "\n".join(lines)
