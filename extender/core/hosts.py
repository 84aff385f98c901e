"""Each node's host CPU and memory, as one decision reads them (the packing score's host terms).

:class:`HostView` is frozen: what ``extender.state.hosts.HostLedger`` knew when the
snapshot was taken. A node the source gives no allocatable figures for is not known
(never short); a known node's free figures are its allocatable less the requests of
the pods bound to it (``contracts.resources.pod_requests``), as kube-scheduler's
NodeResourcesFit counts them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class HostView:
    """Per node name: (allocatable CPU millicores, memory MiB) and what bound pods request."""

    allocatable: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    requested: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    _last: list[Any] = field(default_factory=lambda: [None, None], compare=False, repr=False)
    """The last :meth:`arrays` asked for and its answer: every decision on one table asks
    for the same node list (the table's own), so it is built once per view and table."""

    def free(self, node: str) -> tuple[float, float] | None:
        """(CPU millicores, memory MiB) still free on ``node``; None when not known."""
        total = self.allocatable.get(node)
        if total is None:
            return None
        used = self.requested.get(node, (0.0, 0.0))
        return total[0] - used[0], total[1] - used[1]

    def arrays(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                      np.ndarray]:
        """Free CPU, free memory, allocatable CPU and memory per name (``inf`` where not known)."""
        names_then, found = self._last
        if names_then is names:
            return found
        out = np.full((4, len(names)), np.inf)
        for i, name in enumerate(names):
            total = self.allocatable.get(name)
            if total is not None:
                used = self.requested.get(name, (0.0, 0.0))
                out[:, i] = total[0] - used[0], total[1] - used[1], total[0], total[1]
        out.flags.writeable = False
        found = out[0], out[1], out[2], out[3]
        self._last[:] = names, found  # a race rebuilds the same arrays
        return found


NO_HOSTS = HostView()
