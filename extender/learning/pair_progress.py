"""The pair learner's progress part (docs/interference.md): samples from the pods' step
counters, the completion refitted at most every ``progress_refit_seconds``, and which pods
of pairs measured to lose to move (``learning.revert_losing_seconds``).

A mixin of :class:`extender.learning.interference.PairLearner`, which owns the state it
names (lock, clock, versions) and builds the model decisions read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from contracts.annotations import GPU_UTIL, MODEL, PREDICTION_SOURCE, read_bound_inputs
from extender.core import Placement
from extender.core.snapshot import Workload
from extender.learning.progress_pairs import Estimates, ProgressPairs
from extender.learning.revert import newest_of_losing
from extender.learning.step_times import AloneSteps, progress_samples
from extender.state.reports import DecodedReport


class ProgressLearning:
    """Progress samples and the pods to move (module docstring)."""

    _lock: threading.Lock
    clock: Callable[[], float]
    progress: ProgressPairs
    alone_steps: AloneSteps
    progress_samples_total: int
    progress_refit_seconds: float
    _estimates: tuple[float, int, Estimates] | None
    version: int
    dirty: bool

    # the learner's own (InterferenceLearner), declared here for the reader and the checker
    model: Callable[[], Any]
    _first: Callable[[str, str, int], float]

    def observe_progress(self, report: DecodedReport,
                         placement_of: Callable[[str], Placement | None]) -> int:
        """Progress samples from ``report`` (:mod:`extender.learning.step_times`): the
        pods' exclusive windows, and ``log(step time shared / alone)`` for each of two
        placed, modelled pods sharing a GPU."""
        samples = progress_samples(report, models_on(report.node, placement_of),
                                   self.alone_steps, self.clock())
        with self._lock:
            for gpu_type, a, b, x in samples:
                self.progress.add(gpu_type, a, b, x)
            if samples:
                self.version += 1
                self.progress_samples_total += len(samples)
                self.dirty = True
        if samples:
            self.model()
        return len(samples)

    def _progress_estimates(self, now: float) -> Estimates | None:
        """What the progress samples predict, refitted at most every
        ``progress_refit_seconds`` (the completion is the costly part); None before any."""
        count = self.progress_samples_total
        if not count:
            return None
        done = self._estimates
        if done is None or (done[1] != count
                            and now - done[0] >= self.progress_refit_seconds):
            with self._lock:  # a copy: reports add samples while the completion runs
                now_seen = replace(self.progress, stats=OrderedDict(
                    (k, list(v)) for k, v in self.progress.stats.items()))
            done = (now, count, now_seen.estimate())
            self._estimates = done
        return done[2]

    def to_revert(self, report: DecodedReport, placement_of: Callable[[str], Placement | None],
                  window_s: float) -> list[str]:
        """The pods of ``report`` to move (``learning.revert_losing_seconds``,
        :func:`extender.learning.revert.newest_of_losing`): per GPU shared by a pair refused
        as measured to lose, the one that arrived last, within ``window_s`` of arriving."""
        for gpu, procs in zip(report.gpus, report.processes, strict=False):
            for p in procs:  # every pod's arrival noted, whether its pair loses or not
                if p.pod_uid:
                    self._first(str(p.pod_uid), report.node, gpu.index)
        with self._lock:
            losing = self.progress.losing() if self.progress.stats else frozenset()
        if not losing:
            return []

        return newest_of_losing(report, models_on(report.node, placement_of), losing,
                                lambda uid, index: self._first(uid, report.node, index),
                                self.clock(), window_s)


def models_on(node: str, placement_of: Callable[[str], Placement | None]
              ) -> Callable[[str, int], str | None]:
    """``(pod uid, GPU index) -> model`` of the modelled training pods placed on ``node``."""
    def model_of(uid: str, index: int) -> str | None:
        found = modelled_pod(placement_of(uid), node, index)
        return None if found is None else found[0]
    return model_of


def modelled_pod(p: Placement | None, node: str, index: int) -> tuple[str, int, float] | None:
    """(model, batch size, per-GPU utilisation placed with) of a modelled training pod."""
    if p is None or p.node != node or index not in p.gpu_indices \
            or p.workload is not Workload.TRAINING:
        return None
    ann = dict(p.annotations)
    model = ann.get(MODEL)
    if not model:
        return None
    # Only a prediction stands in for the alone figure: not what the pod owner asserted
    # (an owner could skew its partners' figures), nor the cold-start whole-GPU figure.
    source = ann.get(PREDICTION_SOURCE, "")
    placed = 0.0 if GPU_UTIL in ann or source.startswith(("asserted", "cold-start")) \
        else float(p.util_percent)
    return model, read_bound_inputs(ann).batch, placed  # the one batch reader and default
