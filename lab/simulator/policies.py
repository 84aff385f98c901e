"""Policy registry: small named factories; unknown names fail with the valid list.

| name | queue | placement |
|---|---|---|
| ``fifo`` | arrival order | idle GPUs only (no co-location) |
| ``obp`` | arrival order | memory only, least-loaded GPU |
| ``pab`` | arrival order | as ``obp``, re-queue on measured slowdown after warm-up |
| ``horus`` | weighted-fair, k=1, beta=15 | extender core, lowest Horus cost node |
| ``horus-f`` | weighted-fair, k=3, beta=15 | extender core, lowest Horus cost node |
| ``tandem`` | weighted-fair, k=3 | extender core, shipped default config, kube-style pick |

``horus`` and ``horus-f`` use the paper's setting (§5.2, §6.2): equal weights
and at most 3 jobs per GPU, the co-location limit of the first author's
simulator (research notes §3.1, GPUSchedule ``can_fit``). ``tandem`` reads the
extender's packaged default configuration (``extender/default_config.yaml``),
unless the caller passes another :class:`CostPolicy` (``--config``, ``--sweep``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from extender.core import CostPolicy
from extender.queue.fair import QueueConfig
from lab.simulator.baselines import FifoPolicy, OpportunisticPolicy, PerformanceAwarePolicy
from lab.simulator.engine import Policy
from lab.simulator.horus import HorusPolicy, HorusSettings

HORUS_BETA = 15
"""Horus §5.2: buffer size beta = 15."""
HORUS_MAX_PODS_PER_GPU = 3
SIM_REFIT_EVERY_ROUNDS = 20
"""The simulator refits k-means every 20 rounds (new arrivals join the nearest class in
between): refitting every round cost 40% of a 4,000-job run; the gate refits every round."""


class PolicyError(ValueError):
    """Unknown policy name or invalid override."""


@dataclass(frozen=True)
class PolicyOptions:
    """Overrides for the policies (None: each policy's own default)."""

    cost: CostPolicy | None = None
    """Replaces the extender cost policy of ``tandem`` (and weights/limit of all co-locators)."""
    queue: QueueConfig | None = None
    """Replaces the queue of ``tandem`` (``horus``/``horus-f`` keep k but take beta etc.)."""
    knowledge: Any = None
    """What ``tandem`` knows of modelled jobs under a truth (``belief.SimKnowledge``)."""


def _extender_default_cost() -> CostPolicy:
    from extender.config.loader import load_config

    return load_config(None, environ={}).policy


def tandem_queue() -> QueueConfig:
    """The queue the ``tandem`` policy uses unless overridden (Horus-f's k and beta)."""
    return QueueConfig(k=3, beta=HORUS_BETA, refit_every_rounds=SIM_REFIT_EVERY_ROUNDS)


def tandem_cost() -> CostPolicy:
    """The extender's packaged default cost policy."""
    return _extender_default_cost()


def _horus_cost(options: PolicyOptions) -> CostPolicy:
    if options.cost is not None:
        return options.cost
    return CostPolicy(max_pods_per_gpu=HORUS_MAX_PODS_PER_GPU)


def _horus_queue(options: PolicyOptions, k: int) -> QueueConfig:
    base = options.queue or replace(tandem_queue(), k=1)
    return replace(base, k=k)


def _limit(options: PolicyOptions) -> tuple[int, float]:
    cost = options.cost or CostPolicy(max_pods_per_gpu=HORUS_MAX_PODS_PER_GPU)
    return cost.max_pods_per_gpu, cost.staleness_seconds


POLICIES: dict[str, Callable[[PolicyOptions], Policy]] = {
    "fifo": lambda o: FifoPolicy(*_limit(o)),
    "obp": lambda o: OpportunisticPolicy(*_limit(o)),
    "pab": lambda o: PerformanceAwarePolicy(*_limit(o)),
    "horus": lambda o: HorusPolicy("horus", HorusSettings(_horus_cost(o), _horus_queue(o, 1))),
    "horus-f": lambda o: HorusPolicy("horus-f", HorusSettings(_horus_cost(o), _horus_queue(o, 3))),
    "tandem": lambda o: HorusPolicy("tandem", HorusSettings(
        o.cost or tandem_cost(), o.queue or tandem_queue(),
        node_pick="score", knowledge=o.knowledge)),
}


def make_policy(name: str, options: PolicyOptions | None = None) -> Policy:
    """A fresh policy instance by name."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r} (valid: {', '.join(POLICIES)})") from None
    return factory(options or PolicyOptions())
