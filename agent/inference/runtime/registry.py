"""The sessions one server holds: SLO sessions, best-effort jobs and the profiles they run with.

Only this part adds, finds and removes sessions; the loop's parts read them and
change a session's own state through its methods (``session_state.py``).
Not thread-safe: the runtime calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from agent.inference.errors import BadRequest, SessionConflict, SessionNotFound
from agent.inference.executors.executors import Executor, LoadedModel
from agent.inference.quanta import OverheadCurve
from agent.inference.runtime.session_state import BestEffortState, SloState
from planner import GpuPlan, SessionSpec
from predictor.batching import BatchingProfile


class SessionRegistry:
    """Named sessions and the batching profiles known per model."""

    def __init__(self, profiles: dict[str, BatchingProfile]):
        self.slo: dict[str, SloState] = {}
        self.best_effort: dict[str, BestEffortState] = {}
        self.curves: dict[str, OverheadCurve] = {}
        """Best-effort jobs' segment overhead curves (what the quantum is chosen from)."""
        self._profiles = profiles

    def check_free(self, name: str) -> None:
        """BadRequest for a malformed name, SessionConflict for a taken one."""
        if not isinstance(name, str) or not name or len(name) > 128 or "/" in name:
            raise BadRequest("session name must be 1-128 characters without '/'")
        if name in self.slo or name in self.best_effort:
            raise SessionConflict(f"session {name!r} already exists")

    def add_slo(self, state: SloState) -> None:
        self.slo[state.spec.name] = state

    def add_best_effort(self, state: BestEffortState, curve: OverheadCurve) -> None:
        self.best_effort[state.job.name] = state
        self.curves[state.job.name] = curve

    def remove(self, name: str) -> SloState | BestEffortState:
        """The session taken out; SessionNotFound when there is none."""
        if name in self.slo:
            return self.slo.pop(name)
        if name in self.best_effort:
            self.curves.pop(name, None)
            return self.best_effort.pop(name)
        raise SessionNotFound(f"no session {name!r}")

    def find(self, name: str) -> SloState | BestEffortState:
        sess: SloState | BestEffortState | None = self.slo.get(name) or self.best_effort.get(name)
        if sess is None:
            raise SessionNotFound(f"no session {name!r}")
        return sess

    def all(self) -> Iterator[SloState | BestEffortState]:
        yield from self.slo.values()
        yield from self.best_effort.values()

    def specs(self) -> list[SessionSpec]:
        return [s.spec for s in self.slo.values()]

    def admitted_specs(self) -> list[SessionSpec]:
        """Every SLO session at the rate it was admitted at (``SloState.admitted_spec``)."""
        return [s.admitted_spec() for s in self.slo.values()]

    def load_and_profile(self, executor: Executor, model: str
                         ) -> tuple[LoadedModel, BatchingProfile]:
        """The model loaded, with its configured, known or freshly measured profile."""
        loaded = executor.load(model)
        profile = (
            self._profiles.get(model)
            or self._profiles.get(Path(model).stem)
            or executor.known_profile(loaded)
            or executor.profile(loaded)
        )
        self._profiles.setdefault(model, profile)
        return loaded, profile

    def follow(self, plan: GpuPlan | None) -> None:
        """Each planned session takes its batch size from ``plan``."""
        if plan is None:
            return
        for alloc in plan.allocations:
            sess = self.slo.get(alloc.session.name)
            if sess is not None:
                sess.follow(alloc)

    def longest_segment_ms(self, target_ms: float) -> float:
        """The longest best-effort segment at batch 1 (profiled), 0 with no such job."""
        longest = 0.0
        for be in self.best_effort.values():
            costs = be.loaded.segment_costs_ms(be.profile.latency_ms(1), target_ms)
            longest = max(longest, max(costs) * be.cost_scale)
        return longest
