"""Run one policy over a trace and a cluster (the simulator's entry point)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from extender.core.snapshot import NodeSpec
from extender.simulator.engine import Engine, EngineConfig
from extender.simulator.jobs import SimJob
from extender.simulator.metrics import SimulationResult, summarize
from extender.simulator.policies import PolicyOptions, make_policy


def simulate(jobs: Sequence[SimJob], nodes: Sequence[NodeSpec], policy: str,
             options: PolicyOptions | None = None,
             config: EngineConfig | None = None,
             wrap: Callable[[Any], Any] | None = None) -> SimulationResult:
    """Simulate ``jobs`` on ``nodes`` under the named policy; deterministic for equal inputs.

    ``wrap`` may proxy the policy (progress reporting); it must not change decisions."""
    chosen = make_policy(policy, options)
    engine = Engine(nodes, jobs, wrap(chosen) if wrap else chosen, config).run()
    return summarize(engine, policy)

