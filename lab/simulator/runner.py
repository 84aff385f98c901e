"""Run one policy over a trace and a cluster (the simulator's entry point)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from extender.core.snapshot import NodeSpec
from lab.simulator.engine import Engine, EngineConfig
from lab.simulator.jobs import SimJob
from lab.simulator.metrics import SimulationResult, summarize
from lab.simulator.policies import PolicyOptions, make_policy

if TYPE_CHECKING:
    from lab.simulator.belief import SimWorld


def simulate(jobs: Sequence[SimJob], nodes: Sequence[NodeSpec], policy: str,
             options: PolicyOptions | None = None,
             config: EngineConfig | None = None,
             wrap: Callable[[Any], Any] | None = None,
             world: SimWorld | None = None) -> SimulationResult:
    """Simulate ``jobs`` on ``nodes`` under the named policy; deterministic for equal inputs.

    ``wrap`` may proxy the policy (progress reporting); it must not change decisions.
    ``world``: a ground truth with its agents and the tandem policy's knowledge (fresh per
    call: it learns during the run); None: the trace is the truth, as always."""
    if world is not None:
        options = replace(options or PolicyOptions(), knowledge=world.knowledge)
    chosen = make_policy(policy, options)
    engine = Engine(nodes, jobs, wrap(chosen) if wrap else chosen, config,
                    truth=world.truth if world else None,
                    agents=world.agents if world else None).run()
    return summarize(engine, policy)
