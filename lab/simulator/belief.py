"""What the simulated tandem policy believes about a job, under a ground truth.

With a truth (:mod:`lab.simulator.truth`) a job that names its ``model``
is resolved the way the extender resolves a pod that names only
``tandem.io/model``: :func:`extender.core.resolve_demand` with a predictor and
the learning knowledge (asserted > ``observed:<n>`` > prediction > cold-start).
The prediction is the job's prior (its ``predicted_*`` numbers). Three modes:

- ``online``: the extender's :class:`extender.learning.learner.Learner`, fed by the
  simulated agents (:mod:`lab.simulator.agents`), answers once it has
  ``learning.min_observations`` samples of the model on a GPU type, and its
  refitted interference curves replace the configured ones in the cost (when
  ``learning.curves``): the learner's :class:`extender.learning.knowledge.Knowledge`,
  merged as the extender's :class:`extender.learning.knowledge.Beliefs` merges it;
- ``prior``: the prior only, never updated (no learning);
- ``oracle``: the truth itself, per GPU type (an upper bound for learning),
  the truth's interference curves and measured pairs included.

Jobs without a model keep asserting their numbers, as without a truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.annotations import MODEL, PROGRESS, PodInputs
from extender.config.sections import LearningConfig
from extender.core import CostPolicy, JobDemand, ResolvedDemand, UtilKnowledge, resolve_demand
from extender.core.pairs import PairModel, TypePairs
from extender.learning.learner import Learner
from lab.simulator.agents import SIM_BATCH_SIZE, SimAgents, SimClock
from lab.simulator.engine import JobRun
from lab.simulator.truth import Truth

MODES = ("online", "prior", "oracle")
PRIOR_SOURCE = "xgboost:sim-prior+mem:estimate"
SIM_PROGRESS = "port=9400,steps=tandem_train_steps_total"
"""The progress counter a simulated pod names where the truth's signal tells its slowdown."""


def pod_annotations(demand: ResolvedDemand) -> tuple[tuple[str, str], ...]:
    """What the ledger would read off a modelled pod of ``demand``: its model, and its
    progress counter when it names one."""
    model = demand.job.inputs.model
    ann = ((MODEL, model),) if model else ()
    return ann + (((PROGRESS, SIM_PROGRESS),) if demand.job.progress else ())


def oracle_pairs(truth: Truth) -> PairModel | None:
    """The truth's measured pairs as decisions would hold them had they seen each pair often."""
    if not truth.interference:
        return None
    return PairModel({t: TypePairs({(a, b): (math.log(max(v, 1.0)), 1000)
                                    for a, row in table.slowdown.items() for b, v in row.items()},
                                   cannot=table.cannot_share)
                      for t, table in truth.interference.items()})


class BeliefError(ValueError):
    """Unknown knowledge mode."""


class SimKnowledge:
    """Demand of a modelled job as the tandem policy sees it (module docstring)."""

    def __init__(self, mode: str, truth: Truth, learner: Learner, cfg: LearningConfig,
                 type_names: Sequence[str]):
        if mode not in MODES:
            raise BeliefError(f"unknown knowledge mode {mode!r} (valid: {', '.join(MODES)})")
        self.mode, self.truth, self.learner, self.cfg = mode, truth, learner, cfg
        self.type_names = sorted(set(type_names))
        self._prior: CostPolicy | None = None

    def demand(self, run: JobRun) -> ResolvedDemand:
        """Per-GPU-type demand of ``run``'s pods (its job must name a model)."""
        job = run.job

        def predict(model: str, batch: int, gpu_type: str, workload: str
                    ) -> tuple[float | None, float, str]:
            if self.mode == "oracle":
                return self.truth.util_of(job, gpu_type), self.truth.mem_of(job, gpu_type), \
                    "oracle+mem:oracle"
            # run.pred_mem: the memory estimate, raised by an OOM (Horus §4.2.3)
            return job.pred_util, max(run.pred_mem, job.pred_mem), PRIOR_SOURCE

        knowledge = self.learner.knowledge(self.cfg).util(job.gpus_per_task) \
            if self.mode == "online" \
            else UtilKnowledge()
        return resolve_demand(
            JobDemand(job.gpus_per_task, PodInputs(model=job.model, batch_size=SIM_BATCH_SIZE),
                      progress=self.truth.signal.tells_slowdown),
            self.type_names, predict, knowledge=knowledge)

    def policy(self, base: CostPolicy) -> CostPolicy:
        """The cost policy the tandem policy decides with: ``base`` with the curves it believes.

        ``online``: the learned curves (each GPU type's first refit starts from
        ``base``'s curve, as the extender's starts from the configured one);
        ``oracle``: the truth's curves; ``prior``: ``base`` itself."""
        if self.mode == "online":
            if base is not self._prior:  # handed once per base, as a config reload does
                self.learner.use_prior(base)
                self._prior = base
            return self.learner.knowledge(self.cfg).policy(base)
        if self.mode == "oracle":
            return base.with_curves(self.truth.curves).with_pairs(oracle_pairs(self.truth))
        return base

    def refresh(self, run: JobRun) -> ResolvedDemand | None:
        """Resolve ``run`` and set its scalar belief to the lightest type's demand.

        The queue and the simulator's node pre-filter read one number per job; the
        lowest over GPU types is a bound no type's demand is under, so the
        pre-filter still never drops a node the core would accept."""
        if not run.job.model:
            return None
        demand = self.demand(run)
        run.pred_util = min(d.util_percent for d in demand.by_type.values())
        run.pred_mem = min(d.mem_mib for d in demand.by_type.values())
        return demand

    def believed_util(self, run: JobRun, gpu_type: str) -> float:
        """The utilisation the policy would use for ``run`` on ``gpu_type`` now."""
        found = self.demand(run).for_type(gpu_type)
        assert found is not None
        return found.util_percent


@dataclass
class SimWorld:
    """A truth, the agents that report it and what the tandem policy learns from them."""

    truth: Truth
    agents: SimAgents
    knowledge: SimKnowledge

    @classmethod
    def build(cls, truth: Truth, mode: str, cfg: LearningConfig,
              type_names: Sequence[str]) -> SimWorld:
        """A fresh world: an empty learner on simulated time, its agents and the knowledge."""
        clock = SimClock()
        learner = Learner(cfg, clock=clock, wall_clock=clock)
        return cls(truth, SimAgents(truth, learner, clock),
                   SimKnowledge(mode, truth, learner, cfg, type_names))
