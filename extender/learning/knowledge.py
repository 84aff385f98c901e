"""What the cluster taught, as one frozen value, and the one door decisions read it through.

:class:`Knowledge` is built by :meth:`extender.learning.learner.Learner.knowledge` when
something it holds changed (a curve refit, a new pair model, another learning config),
never per call: the learned interference curves, the learned pairs, and the
utilisation estimates with their bias as the resolution hook
(:class:`extender.core.UtilKnowledge`), and the workload's pod shapes as the packing
score's hook (read once per decision by ``extender.core.decide``). A new learned
signal (job progress) is a new field here, read by whoever decides with it.

:class:`Beliefs` is the door: the configured policy in force and the learner's
knowledge, merged once per reload or refit into the policy decisions use. It hands
the configured curves to the learner as its refit prior when the config changes (no
callback from the learner back into the config). ``ClusterState`` reads it once per
snapshot; the simulator's online belief builds the same merge.

The estimates stay in the learner's store and are read at resolution through the
hook: copying every estimate per report would cost O(estimates) per report.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender.config.sections import LearningConfig
from extender.core import CostPolicy, UtilKnowledge
from extender.core.fragmentation import Shapes
from extender.core.pairs import PairModel
from predictor.curves import InterferenceCurve

UtilFn = Callable[[int, "str | None"], UtilKnowledge]
"""``(gpu count, namespace) -> UtilKnowledge``: what resolution uses for a pod."""


def _cold_only(cfg: LearningConfig) -> UtilFn:
    return lambda _gpus, _ns: UtilKnowledge(None, cfg.min_observations,
                                            cfg.cold_start_util_percent)


@dataclass(frozen=True)
class Knowledge:
    """What the cluster taught, frozen (module docstring)."""

    curves: Mapping[str, InterferenceCurve] = field(default_factory=dict)
    """Learned curves of the GPU types refitted so far (empty when ``learning.curves`` is off)."""
    pairs: PairModel | None = None
    """The learned pairwise interference (None when ``learning.pairs`` is off or nothing yet)."""
    util_of: UtilFn | None = None
    """The utilisation estimates and bias, as the resolution hook; None: cold start only."""
    cfg: LearningConfig = field(default_factory=LearningConfig)
    shapes_of: Callable[[str], Shapes] | None = None
    """The pod shapes bound so far (``extender.learning.shapes``), weighted as
    ``packing.weighting`` says; None: none learned (the packing score stays off)."""

    def shapes(self, weighting: str) -> Shapes | None:
        """The workload's shapes now, or None when nothing was learned."""
        return None if self.shapes_of is None else self.shapes_of(weighting)

    def util(self, gpus: int = 1, namespace: str | None = None) -> UtilKnowledge:
        """What resolution knows of a pod of ``gpus`` GPUs in ``namespace``."""
        return (self.util_of or _cold_only(self.cfg))(gpus, namespace)

    def policy(self, base: CostPolicy) -> CostPolicy:
        """``base`` with the learned curves in place of its priors and the learned pairs;
        ``base`` itself when nothing is learned."""
        return base.with_curves(self.curves).with_pairs(self.pairs)


NOTHING_LEARNED = Knowledge()


class KnowledgeSource(Protocol):
    """The learner as the door reads it."""

    def knowledge(self, cfg: LearningConfig | None = None) -> Knowledge:
        """The current knowledge under ``cfg`` (rebuilt only when it changed)."""
        ...

    def use_prior(self, policy: CostPolicy) -> None:
        """The configured curves: where each GPU type's first refit starts."""
        ...


class Beliefs:
    """The configured policy merged with what was learned, once per reload or refit."""

    def __init__(self, config: Any, learner: KnowledgeSource | None = None):
        self._config = config
        """A ``ConfigHolder`` (``current()`` is the config in force, a frozen value)."""
        self._learner = learner
        self._lock = threading.Lock()
        self._cache: tuple[Any, Knowledge, CostPolicy] | None = None

    def current(self) -> tuple[CostPolicy, Knowledge]:
        """The policy decisions use now and the knowledge it was merged with."""
        config = self._config.current()
        cached = self._cache
        if self._learner is None:
            if cached is None or cached[0] is not config:
                knowledge = Knowledge(cfg=config.learning)
                cached = self._cache = (config, knowledge, config.policy)
            return cached[2], cached[1]
        if cached is None or cached[0] is not config:
            with self._lock:  # a new config: its curves are the refit prior from now on
                self._learner.use_prior(config.policy)
        knowledge = self._learner.knowledge(config.learning)
        if cached is not None and cached[0] is config and cached[1] is knowledge:
            return cached[2], knowledge
        policy = knowledge.policy(config.policy)
        self._cache = (config, knowledge, policy)
        return policy, knowledge


class FixedBeliefs:
    """One policy and nothing learned, for ever (``tandem status`` rebuilds, tests)."""

    def __init__(self, policy: CostPolicy, knowledge: Knowledge = NOTHING_LEARNED):
        self._current = (policy, knowledge)

    def current(self) -> tuple[CostPolicy, Knowledge]:
        """The policy and the knowledge."""
        return self._current

