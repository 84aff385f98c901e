"""Which pod to move off a GPU whose pair was measured to lose (docs/interference.md).

Once a pair's measured progress says the two run worse together than taking turns, the
learner refuses it for new placements; the pair already sharing a GPU keeps losing
until one of them leaves. :func:`newest_of_losing` names, per GPU of a report shared by
exactly two placed pods whose models form a refused pair, the pod that arrived there last,
if it did so within ``window_s`` (a job minutes in loses little by restarting elsewhere; one
hours in loses its progress since its last checkpoint). Pure: the caller evicts (opt-in).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from extender.core.snapshot import gpu_type_of
from extender.state.reports import DecodedReport


def newest_of_losing(report: DecodedReport, model_of: Callable[[str, int], str | None],
                     losing: Collection[tuple[str, frozenset[str]]],
                     first_seen: Callable[[str, int], float], now: float,
                     window_s: float) -> list[str]:
    """The pod uids to move (module docstring); ``first_seen(uid, gpu index)``: when the
    pod was first reported on that GPU of the report's node."""
    out = []
    for gpu, procs in zip(report.gpus, report.processes, strict=False):
        owners = sorted({p.pod_uid for p in procs})
        if len(owners) != 2 or None in owners:
            continue
        uids = [str(u) for u in owners]
        models = [model_of(u, gpu.index) for u in uids]
        if None in models or (gpu_type_of(gpu.product),
                              frozenset(str(m) for m in models)) not in losing:
            continue
        newest = max(uids, key=lambda u: first_seen(u, gpu.index))
        if now - first_seen(newest, gpu.index) <= window_s:
            out.append(newest)
    return out
