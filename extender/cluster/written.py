"""What bind wrote on each pod, so the pod watch knows its own write without decoding it.

Every bound pod's watch event is checked against the decision held for it: output
annotations that no longer parse, or that name another decision, are an owner's edit
(``KubeSource._observe_bound``). Decoding them costs more than the rest of the event.
The Binding's annotations are the decision's own encoding, so a pod whose ``tandem.io/*``
annotations are exactly those bind sent (its inputs as bind read them, the outputs and
the signature) decodes to the decision held: nothing to check. Any other content (an
edit, inputs changed before the Binding landed, a pod bound elsewhere) is decoded as
before.
"""

from __future__ import annotations

from collections.abc import Mapping

from contracts.annotations import tandem_annotations
from contracts.bounded import BoundedMap

LIMIT = 20_000
"""Pods remembered (the oldest go first; a forgotten pod is decoded, as before)."""


class WrittenAnnotations:
    """Per pod UID, the node and the ``tandem.io/*`` annotations bind sent; bounded."""

    def __init__(self, limit: int = LIMIT):
        self._sent: BoundedMap[str, tuple[str, tuple[tuple[str, str], ...]]] = BoundedMap(limit)

    def note(self, uid: str, node: str, inputs: tuple[tuple[str, str], ...],
             sent: Mapping[str, str]) -> None:
        """The Binding of pod ``uid`` to ``node`` was applied with ``sent`` on top of the
        pod's ``inputs`` (its ``tandem.io/*`` annotations as bind read them)."""
        whole = tandem_annotations({**dict(inputs), **sent})
        self._sent.put(uid, (node, whole))

    def unchanged(self, uid: str, node: str, annotations: object) -> bool:
        """True when the pod's annotations carry exactly what bind sent, on that node."""
        sent = self._sent.get(uid)
        return sent is not None and sent[0] == node and isinstance(annotations, Mapping) \
            and tandem_annotations(annotations) == sent[1]

    def forget(self, uid: str) -> None:
        """The pod is gone (deleted or finished)."""
        self._sent.pop(uid)
