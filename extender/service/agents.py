"""What the extender does for its node agents: who may speak for which node, their
reports (soft state and learning), and ``/v1/state`` reads."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from contracts.state import StateDocument
from extender.cluster.source import ClusterSource
from extender.config.loader import ConfigHolder
from extender.core.snapshot import Placement
from extender.learning.learner import Learner
from extender.preemption.revert import LosingPairReverter
from extender.state.ledger import ClusterState
from extender.state.node_identity import agent_identity, check_node, may_read_full, speaks_for
from extender.state.reports import DecodedReport
from extender.state.view import document


class AgentService:
    """Agent reports and state reads, over the ClusterState the verbs decide on."""

    def __init__(self, state: ClusterState, source: ClusterSource, config: ConfigHolder,
                 learner: Learner | None, environ: Mapping[str, str] | None = None):
        self.state = state
        self.config = config
        self.learner = learner
        self._environ = environ
        """Where ``reports.token_env`` is looked up (None: the process environment)."""
        self._identity = agent_identity(source)
        """Reviews agents' pod tokens (``reports.identity: service-account``)."""
        self.reverter: LosingPairReverter | None = None
        """Evicts pods of pairs measured to lose (the ``kube`` source; set by the verbs)."""

    def authorize(self, authorization: str | None) -> str | None:
        """The node an agent's report may be about: with ``reports.identity:
        service-account`` the node its reviewed pod token is bound to, else None (the shared
        agent token, any node). Unauthorized (or Forbidden) otherwise."""
        return speaks_for(authorization, self.config.current().reports, self._environ,
                          self._identity)

    def report(self, report: DecodedReport, speaks_for: str | None = None) -> dict[str, int]:
        """Keep a node's report (soft state) and learn from it; the answer to the agent.
        ``speaks_for``: the node the agent's identity allows (Forbidden for another)."""
        check_node(speaks_for, report.node)
        self.state.report(report.node, report.gpus, report.util_percent,
                          report.memory_used_mib)
        if self.learner is None or not self.config.current().learning.enabled:
            return {"accepted": len(report.gpus), "samples": 0}
        snap = self.state.snapshot()  # the placements the report is about, read without a lock
        samples = self.learner.observe(report, snap.placement_of,
                                       snap.source_types.get(report.node))
        self._revert(report, snap.placement_of)
        return {"accepted": len(report.gpus), "samples": samples}

    def _revert(self, report: DecodedReport, placement_of: Callable[[str], Placement | None]
                ) -> None:
        """Opt-in (``learning.revert_losing_seconds``): evict the newest pod of each GPU
        of ``report`` shared by a pair measured to lose (docs/interference.md)."""
        cfg = self.config.current().learning
        if self.reverter is None or self.learner is None or not cfg.pairs \
                or cfg.revert_losing_seconds <= 0:
            return
        uids = self.learner.pairs.to_revert(report, placement_of, cfg.revert_losing_seconds)
        self.reverter.revert(uids, placement_of)

    def read_state(self, authorization: str | None, node: str | None = None,
                   ) -> StateDocument:
        """``/v1/state``: in full (pod names, annotations, what was learned) for the agent
        token, redacted for anyone else (docs/security.md); ``node``: that node only, and
        without what was learned (cluster-wide, and no agent reads it: each poll stays
        O(its GPUs))."""
        if not may_read_full(authorization, node, self.config.current().reports,
                             self._environ, self._identity):
            return document(self.state.snapshot(), node=node).redacted_copy()
        learning = self.learner.view() if self.learner is not None and node is None \
            else None
        return document(self.state.snapshot(), learning, node)
