"""What the engine tells simulated node agents and asks of them
(:class:`lab.simulator.agents.SimAgents`; :class:`lab.simulator.engine.Engine`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

Engine = Any
"""A :class:`lab.simulator.engine.Engine` (not imported: the engine imports this module)."""
JobRun = Any
"""A :class:`lab.simulator.engine.JobRun`."""


class Agents(Protocol):
    """Simulated node agents: they see the world as it changes (``lab.simulator.agents``)."""

    def attach(self, engine: Engine) -> None:
        """Bind to the engine whose GPUs they watch."""

    def before_change(self, rows: Sequence[int], now_s: float) -> None:
        """The jobs on ``rows`` are about to change: report the interval that ends now."""

    def started(self, run: JobRun) -> None:
        """``run`` now runs on ``run.placements``."""

    def catch_up(self, now_s: float) -> None:
        """Report what the agents would have pushed by ``now_s`` (before a decision)."""

    def finished(self, run: JobRun) -> None:
        """``run`` completed."""

    def review_after_start(self) -> Sequence[float]:
        """Seconds after a start at which to :meth:`catch_up` and evict the pods
        :meth:`take_moves` names (``learning.revert_losing_seconds``); empty: none."""

    def take_moves(self) -> list[str]:
        """The pod uids the extender would have evicted by now."""
