"""Progress samples from agent reports: each pod's step time alone, and its slowdown beside
one other pod as ``log(step_time_shared / step_time_alone)`` (docs/interference.md).

**Alone.** A window in which a pod is the only process-holding pod on its GPU (every
process there attributed to it) and reports progress is one of its *exclusive* windows.
Its alone step time on that GPU type is the mean over its newest :data:`ALONE_WINDOWS`
exclusive windows no older than ``max_age_s``: re-measured whenever it runs alone, because
it drifts (the H100 retest: +9.5% between two runs of the same job). Without a fresh one
(a pod that started beside another), its model's: the same mean over the newest exclusive
windows of any pod of that model on that GPU type; then a profile of the model there
(``profile``); then the pod's, or its model's, figure as last measured (its newest
exclusive windows within ``max_age_s`` of the newest), however old. A stale figure is kept
rather than dropped: a pod shared for longer than ``max_age_s`` (or a model last seen
alone that long ago) would otherwise teach nothing of the pairs it meets, which were
40-60% of the windows that waited in the simulator; its drift is what the pooled
per-measurement noise estimates from repeats
(:meth:`extender.learning.progress_pairs.ProgressPairs.noise_var`), and the next exclusive
window replaces it. Without any, the pod's shared windows wait (at most
:data:`MAX_WAITING` per model and GPU type, no older than ``max_age_s``) for an alone time
of its model to be measured there, then become samples against it: a pod that started
beside another teaches once it, or a pod of its model, runs alone (reason
``no-alone-time`` for the windows set aside that way).

**Shared.** A window in which a GPU holds exactly two such pods, each placed by this
extender with a model, both reporting progress, gives each a sample for the directed pair
(its model, the other's). A GPU with a process no pod owns gives none (``not-a-pair``): a
sample must name the one pod that slowed it.

**Three pods or more.** Slowdowns add (a job's is ``1 + sum over the others of (s_ab -
1)``, the rule decisions and the simulator's truth use), so where every partner of a pod
but one model is measured (``known``: the figures of pairs with progress samples), the
rest of its slowdown is that model's: ``s_ac = 1 + (S - 1 - sum of the known extras) /
m`` for ``m`` pods of it there (reason ``attributed``). Where two models or more are not
measured, or the rest is not a slowdown (at most 0), the window gives none
(``not-a-pair``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

from contracts.agentreport import ReportedProgress
from extender.core.snapshot import gpu_type_of
from extender.state.reports import DecodedReport

ALONE_WINDOWS = 5
MAX_AGE_S = 1800.0
MAX_TRACKED_PODS = 100_000
MAX_WAITING = 64
"""Shared windows kept per (model, GPU type) while no alone time of it is known."""

Sample = tuple[str, str, str, float]
"""(GPU type, model, beside model, log of the step-time ratio)."""
Known = Callable[[str, str, str], "float | None"]
"""(GPU type, a, b) -> the measured log slowdown of ``a`` beside ``b``, or None."""


def _unknown(gpu_type: str, a: str, b: str) -> float | None:
    return None


class AloneSteps:
    """Per pod and GPU type, its recent exclusive step times; per model, profiles."""

    def __init__(self, max_age_s: float = MAX_AGE_S):
        self.max_age_s = max_age_s
        self._windows: OrderedDict[tuple[str, str, str], list[tuple[float, float]]] = \
            OrderedDict()
        """("pod", uid, GPU type) or ("model", model, GPU type) -> [(when, step time)],
        newest last."""
        self._profiles: dict[tuple[str, str], float] = {}
        self.skipped: dict[str, int] = {}
        self._waiting: OrderedDict[tuple[str, str], list[tuple[str, str, float, float]]] = \
            OrderedDict()
        """(model, GPU type) -> [(pod uid, beside model, step time, when)] of shared windows
        that had no alone time yet, oldest first."""

    def record(self, uid: str, model: str | None, gpu_type: str, steps_per_s: float,
               now: float) -> None:
        """One exclusive window of pod ``uid`` (of ``model``, when placed with one)."""
        if not (math.isfinite(steps_per_s) and steps_per_s > 0):
            return
        for key in [("pod", uid, gpu_type)] + ([("model", model, gpu_type)] if model else []):
            windows = self._windows.pop(key, [])
            windows.append((now, 1.0 / steps_per_s))
            self._windows[key] = windows[-ALONE_WINDOWS:]
        while len(self._windows) > MAX_TRACKED_PODS:
            self._windows.popitem(last=False)

    def profile(self, model: str, gpu_type: str, step_time_s: float) -> None:
        """A profiled alone step time of ``model`` on ``gpu_type``."""
        if math.isfinite(step_time_s) and step_time_s > 0:
            self._profiles[(model, gpu_type)] = step_time_s

    def alone(self, uid: str, model: str, gpu_type: str, now: float) -> float | None:
        """The pod's alone step time (module docstring), or None."""
        keys = (("pod", uid, gpu_type), ("model", model, gpu_type))
        for key in keys:
            fresh = [t for when, t in self._windows.get(key, ()) if now - when <= self.max_age_s]
            if fresh:
                return sum(fresh) / len(fresh)
        profiled = self._profiles.get((model, gpu_type))
        if profiled is not None:
            return profiled
        for key in keys:  # stale, as last measured: better than no sample (module docstring)
            windows = self._windows.get(key)
            if windows:
                last = [t for when, t in windows if windows[-1][0] - when <= self.max_age_s]
                return sum(last) / len(last)
        return None

    def wait(self, uid: str, model: str, other: str, gpu_type: str, step_time_s: float,
             now: float) -> None:
        """Keep a shared window of ``uid`` until an alone time of ``model`` is measured."""
        key = (model, gpu_type)
        waiting = self._waiting.pop(key, [])
        waiting.append((uid, other, step_time_s, now))
        self._waiting[key] = waiting[-MAX_WAITING:]
        while len(self._waiting) > MAX_TRACKED_PODS:
            self._waiting.popitem(last=False)

    def settle(self, model: str | None, gpu_type: str, now: float) -> list[Sample]:
        """The waiting windows of ``model`` on ``gpu_type`` as samples, now that an alone
        time is known (those older than ``max_age_s`` dropped)."""
        out: list[Sample] = []
        for uid, other, step, when in self._waiting.pop((model, gpu_type), []) if model else ():
            base = self.alone(uid, str(model), gpu_type, now)
            if base is not None and now - when <= self.max_age_s:
                out.append((gpu_type, str(model), other, math.log(step / base)))
        return out

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count


def progress_samples(report: DecodedReport, model_of: Callable[[str, int], str | None],
                     alone: AloneSteps, now: float, known: Known = _unknown) -> list[Sample]:
    """Record the report's exclusive windows in ``alone`` and return its pair samples.

    ``model_of(uid, gpu index)``: the model of a training pod this extender placed on that
    GPU of the report's node, else None; ``known``: the measured figures a window of three
    pods or more is attributed through (module docstring)."""
    out: list[Sample] = []
    for gpu, procs, progress in zip(report.gpus, report.processes, report.progress,
                                    strict=False):
        if not progress:
            continue
        gpu_type = gpu_type_of(gpu.product)
        owners = {p.pod_uid for p in procs}
        rates = {p.pod_uid: p for p in progress}
        if None in owners or not owners <= set(rates):
            alone.skip("not-a-pair", len(rates))  # an unattributed or silent process there
            continue
        if len(owners) == 1:
            (uid,) = owners
            model = model_of(str(uid), gpu.index)
            alone.record(str(uid), model, gpu_type, rates[uid].steps_per_s, now)
            out += alone.settle(model, gpu_type, now)
            continue
        out += _shared(gpu_type, gpu.index, [rates[u] for u in sorted(owners)], model_of,
                       alone, now, known)
    return out


def _shared(gpu_type: str, index: int, pods: list[ReportedProgress],
            model_of: Callable[[str, int], str | None], alone: AloneSteps,
            now: float, known: Known) -> list[Sample]:
    """The samples of a GPU shared by placed, modelled pods (module docstring)."""
    models = [model_of(p.pod_uid, index) for p in pods]
    if None in models:
        alone.skip("not-placed", len(pods))
        return []
    out = []
    for i, p in enumerate(pods):
        model, others = str(models[i]), [str(m) for j, m in enumerate(models) if j != i]
        base = alone.alone(p.pod_uid, model, gpu_type, now)
        if p.steps_per_s <= 0:
            alone.skip("no-steps")  # stalled or stopped: a ratio would be infinite
            continue
        if len(others) > 1:
            got = None if base is None else _attributed(
                gpu_type, model, others, (1.0 / p.steps_per_s) / base, known)
            alone.skip("not-a-pair" if got is None else "attributed")
            out += [] if got is None else [got]
            continue
        if base is None:
            alone.skip("no-alone-time")
            alone.wait(p.pod_uid, model, others[0], gpu_type, 1.0 / p.steps_per_s, now)
            continue
        out.append((gpu_type, model, others[0], math.log((1.0 / p.steps_per_s) / base)))
    return out


def _attributed(gpu_type: str, model: str, others: list[str], slowdown: float,
                known: Known) -> Sample | None:
    """``model``'s slowdown beside ``others`` (two or more) as a sample for the one model
    among them not measured beside it, through the additive rule (module docstring)."""
    rest, unknown = slowdown - 1.0, []
    for other in others:
        log = known(gpu_type, model, other)
        if log is None:
            unknown.append(other)
        else:
            rest -= math.exp(log) - 1.0
    if not unknown or len(set(unknown)) > 1 or rest <= 0.0:
        return None
    return gpu_type, model, unknown[0], math.log(1.0 + rest / len(unknown))
