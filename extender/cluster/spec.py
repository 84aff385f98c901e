"""``--cluster kube|sim:FILE``: the one reader of the cluster option, shared by
``tandem extender serve`` and ``tandem status``."""

from __future__ import annotations

from extender.cluster.source import ClusterSource


class SourceSpecError(ValueError):
    """``--cluster`` is neither ``kube`` nor ``sim:FILE``."""


def build_source(spec: str) -> ClusterSource:
    """The cluster source for ``--cluster kube|sim:FILE``."""
    if spec == "kube":
        from extender.cluster.kube import KubeSource

        return KubeSource.from_environment()
    if spec.startswith("sim:") and len(spec) > 4:
        from extender.cluster.sim import SimSource

        return SimSource.from_file(spec[4:])
    raise SourceSpecError(f"--cluster must be 'kube' or 'sim:FILE', got {spec!r}")
