"""The pair learner's progress part (docs/interference.md): the samples the pods' step
counters give (:mod:`extender.learning.step_times`; a GPU of three pods or more through
the last fit's measured figures), what they predict, refitted at most
every ``refit_seconds`` (the completion is the costly part), and which pods of pairs
measured to lose to move (``learning.revert_losing_seconds``).

:class:`extender.learning.interference.PairLearner` holds one and builds the model
decisions read from :meth:`ProgressTracker.estimates` and :meth:`ProgressTracker.losing`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace

from contracts.annotations import GPU_UTIL, MODEL, PREDICTION_SOURCE, read_bound_inputs
from extender.core import Placement
from extender.core.snapshot import Workload
from extender.learning.progress_pairs import Estimates, Key, ProgressPairs
from extender.learning.revert import newest_of_losing
from extender.learning.step_times import AloneSteps, progress_samples
from extender.state.reports import DecodedReport


class ProgressTracker:
    """Progress samples, the pods' alone step times and the estimates (module docstring)."""

    def __init__(self, priors: Mapping[str, Mapping[tuple[str, str], float]],
                 max_entries: int, refit_seconds: float):
        self.pairs = ProgressPairs(priors=priors, max_entries=max_entries)
        self.alone_steps = AloneSteps()
        self.refit_seconds = refit_seconds
        self.samples_total = 0
        self._estimates: tuple[float, int, Estimates] | None = None
        """(when, samples then, what they predict)."""
        self._lock = threading.Lock()

    def observe(self, report: DecodedReport, placement_of: Callable[[str], Placement | None],
                now: float) -> int:
        """Samples from ``report``: the pods' exclusive windows, and ``log(step time
        shared / alone)`` for each of two placed, modelled pods sharing a GPU."""
        samples = progress_samples(report, models_on(report.node, placement_of),
                                   self.alone_steps, now, self._measured())
        with self._lock:
            for gpu_type, a, b, x in samples:
                self.pairs.add(gpu_type, a, b, x)
            self.samples_total += len(samples)
        return len(samples)

    def _measured(self) -> Callable[[str, str, str], float | None]:
        """The last fit's figures of pairs with progress samples: what a window of three
        pods or more is attributed through (:mod:`extender.learning.step_times`)."""
        done = self._estimates
        figures = {} if done is None else done[2].figures

        def known(gpu_type: str, a: str, b: str) -> float | None:
            f = figures.get((gpu_type, a, b))
            return f.log if f is not None and f.source.startswith("progress:") else None
        return known

    def estimates(self, now: float) -> Estimates | None:
        """What the samples and the measured matrices predict, refitted when samples came
        in and ``refit_seconds`` passed since the last fit; None with neither. A matrix
        alone is completed at once: measured on a GPU type of the cluster (a profiling
        campaign of a few pairs), it fills that type's other pairs before any pod reports,
        where the curve, which reads measured pairs as far milder than they run, would
        steer the first placements toward the pairs not measured."""
        count = self.samples_total
        if not count and not any(self.pairs.priors.values()):
            return None
        done = self._estimates
        if done is None or (done[1] != count and now - done[0] >= self.refit_seconds):
            with self._lock:  # a copy: reports add samples while the completion runs
                stats = OrderedDict((k, list(v)) for k, v in self.pairs.stats.items())
            done = (now, count, replace(self.pairs, stats=stats).estimate())
            self._estimates = done
        return done[2]

    def losing(self) -> frozenset[tuple[str, frozenset[str]]]:
        """The pairs refused as measured to lose (cheap: read at every model build)."""
        with self._lock:
            return self.pairs.losing() if self.pairs.stats else frozenset()

    def load(self, stats: OrderedDict[Key, list[float]]) -> None:
        """Replace the samples by ``stats`` (a persisted document's)."""
        with self._lock:
            self.pairs.stats = stats
            self.samples_total = int(sum(st[0] for st in stats.values()))
            self._estimates = None

    def clear(self) -> None:
        self.load(OrderedDict())

    def to_revert(self, report: DecodedReport, placement_of: Callable[[str], Placement | None],
                  window_s: float, first_seen: Callable[[str, int], float], now: float
                  ) -> list[str]:
        """The pods of ``report`` to move (:func:`extender.learning.revert.newest_of_losing`):
        per GPU shared by a pair refused as measured to lose, the one that arrived last,
        within ``window_s`` of arriving. ``first_seen(uid, GPU index)`` notes every pod's
        arrival on the report's node, whether its pair loses or not."""
        for gpu, procs in zip(report.gpus, report.processes, strict=False):
            for p in procs:
                if p.pod_uid:
                    first_seen(str(p.pod_uid), gpu.index)
        losing = self.losing()
        if not losing:
            return []
        return newest_of_losing(report, models_on(report.node, placement_of), losing,
                                first_seen, now, window_s)


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
